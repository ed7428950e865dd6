"""Images with box annotations to sharded detection TFRecords with Beam (`fullres preprocess images`).

Each image is one work item. A missing, unreadable or unopenable image (a
folder, no permission), one over the pixel budget (`max_pixels`, checked from
the header before anything is decoded: a decompression bomb), or one whose size
differs from its annotation, is a dead letter; a bad box (entirely outside the
image, or of non-positive size) is a dead letter of its own and the image is
kept with its good boxes. An image is read as it is shown, turned upright by
its EXIF Orientation (`frames.upright`, the video frames' rule: phones store
the sensor's picture turned, with a tag that says how to show it, and
annotation tools draw the boxes on the picture shown); a turned image is
stored upright as PNG (lossless; TensorFlow's decoders ignore the tag). One
whose annotated width and height are those of the picture as stored, not as
shown, is a dead letter: which of the two its boxes were drawn on is not
known. Boxes that cross the border are clipped to it; no
box is dropped for being one too many (the trainer counts those it drops).
Output layout, dead letters and atomic replacement: `preprocessing.beam.conversion`;
`label_map.json` ({name: id}, see `preprocessing.images.annotations`) is written
beside the shards.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Callable, Sequence

import apache_beam as beam
import numpy as np
from PIL import Image, UnidentifiedImageError

from common import dead_letters, hidden_files
from common import output_guard
from preprocessing.beam import conversion, counting
from preprocessing.images import annotations as annotations_lib, voc_annotations
from preprocessing.records import dataset_files, detection_schema
from preprocessing.video import frames as frames_lib

ORIENTATION = 0x0112  # the EXIF tag that says how the stored picture is turned to be shown (1: as stored)
TURNED = range(2, 9)  # the Orientation values that mirror or turn it (`ImageOps.exif_transpose` applies them)
KEPT_FORMATS = {"JPEG": "jpeg", "PNG": "png"}
# 100 megapixels (10000 × 10000): 300 MB decoded as RGB, far above any detection canvas.
DEFAULT_MAX_PIXELS = 100_000_000


def valid_boxes(image: annotations_lib.ImageAnnotations, width: int, height: int):
    """Splits an image's boxes into kept (clipped, normalized) boxes and dead letters.

    Returns:
        (boxes (N, 4) float32 ymin, xmin, ymax, xmax in [0, 1], labels, texts, dead letters, flags: the kept boxes'
        `{"crowd": (N,), "difficult": (N,)}` as 0/1).
    """
    kept, labels, texts, dead, flags = [], [], [], [], {"crowd": [], "difficult": []}
    for box in image.boxes:
        if box.x_max <= box.x_min or box.y_max <= box.y_min:
            dead.append(dead_letters.dead_letter(box.source, "boxes", "box_non_positive_size",
                                               f"box ({box.x_min}, {box.y_min}, {box.x_max}, {box.y_max}) has no area"))
            continue
        x_min, x_max = max(box.x_min, 0.0), min(box.x_max, float(width))
        y_min, y_max = max(box.y_min, 0.0), min(box.y_max, float(height))
        if x_max <= x_min or y_max <= y_min:
            dead.append(dead_letters.dead_letter(box.source, "boxes", "box_outside_image",
                                               f"box ({box.x_min}, {box.y_min}, {box.x_max}, {box.y_max}) lies outside "
                                               f"the {width}×{height} image"))
            continue
        kept.append([y_min / height, x_min / width, y_max / height, x_max / width])
        labels.append(box.label)
        texts.append(box.text)
        flags["crowd"].append(int(box.crowd))
        flags["difficult"].append(int(box.difficult))
    return (np.asarray(kept, np.float32).reshape(-1, 4), tuple(labels), tuple(texts), dead,
            {name: tuple(values) for name, values in flags.items()})


def _open_error(image: annotations_lib.ImageAnnotations, error: OSError) -> dict:
    """The dead letter for an image file that cannot be opened."""
    if isinstance(error, FileNotFoundError):
        return dead_letters.dead_letter(image.path, "read", "missing_image", "the image file does not exist")
    if isinstance(error, IsADirectoryError):
        return dead_letters.dead_letter(image.path, "read", "not_a_file",
                                      "the file name points to a folder, not an image file; point it at the image")
    if isinstance(error, PermissionError):
        return dead_letters.dead_letter(image.path, "read", "permission_denied",
                                      "the image file cannot be read (permission denied); make it readable")
    return dead_letters.dead_letter(image.path, "read", "unreadable", f"the image file cannot be read ({error.strerror or error})")


def _over_budget(image: annotations_lib.ImageAnnotations, pixels: int, description: str, max_pixels: int) -> dict:
    return dead_letters.dead_letter(
        image.path, "read", "image_too_large",
        f"the image {description} {pixels:,} pixels, over the --max-pixels budget of {max_pixels:,} (a decompression "
        "bomb, or a genuinely huge image: raise --max-pixels to convert it)")


def _sideways(image: annotations_lib.ImageAnnotations, stored: tuple[int, int], turn: int) -> dict:
    """The dead letter for an image annotated at its stored size, which its EXIF Orientation shows turned."""
    width, height = stored
    return dead_letters.dead_letter(
        image.path, "validate", "orientation_mismatch",
        f"annotations say {width}×{height}, the size of the picture as stored, but its EXIF Orientation {turn} shows "
        f"it turned, as {height}×{width}, and boxes may have been drawn on either: if they were drawn on the picture "
        f"as shown (as viewers and annotation tools show it), set the width and height to {height}×{width}; if on the "
        "picture as stored, remove the tag (exiftool -Orientation= FILE)")


DEEP_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # PIL's modes of grey values deeper than 8 bits


def _deeper_than_8_bits(image: annotations_lib.ImageAnnotations, decoded: Image.Image, encoded: bytes) -> dict | None:
    """The dead letter for an image of more than 8 bits a sample (a 16-bit or float TIFF, a 16-bit PNG), else None.

    Records hold 8-bit images, as the detection models take them. Converting
    such an image to RGB clips it (a 16-bit X-ray became all white, a float
    image all black), and TensorFlow reads a 16-bit PNG scaled by 1/257 (12-bit
    data in 16 grey levels): a window is the user's to choose, not ours.
    """
    sixteen_bit_png = (decoded.format == "PNG" and encoded[12:16] == b"IHDR" and encoded[24] == 16)
    if decoded.mode not in DEEP_MODES and not sixteen_bit_png:
        return None
    values = np.asarray(decoded)
    kind = "floating-point" if decoded.mode == "F" else ("16-bit" if sixteen_bit_png or "16" in decoded.mode
                                                         else "32-bit")
    seen = f", values {values.min():g} to {values.max():g}" if decoded.mode in DEEP_MODES else ""
    return dead_letters.dead_letter(
        image.path, "read", "not_8_bit",
        f"the image holds {kind} samples ({decoded.format} mode {decoded.mode}{seen}); fullres stores 8-bit images, as "
        "the detection models take them, and does not choose a window for you: convert it to 8 bits with the window "
        "you read it at (e.g. numpy: np.clip((a - low) / (high - low) * 255, 0, 255).astype(np.uint8))")


class ConvertImageFn(beam.DoFn):
    """One `ImageAnnotations` in; a serialized record and/or dead letters out.

    Args:
        max_pixels: images whose header claims more pixels are dead letters, before any decoding.
    """

    def __init__(self, max_pixels: int = DEFAULT_MAX_PIXELS):
        super().__init__()
        self.max_pixels = max_pixels

    def setup(self):
        # The budget is ours, checked below. PIL's own check (a warning above 89 Mpx, an error above twice that)
        # would refuse a larger budget before we see the size: only then is its limit raised (never lowered).
        if Image.MAX_IMAGE_PIXELS is not None and 2 * Image.MAX_IMAGE_PIXELS < self.max_pixels:
            Image.MAX_IMAGE_PIXELS = self.max_pixels
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)

    def process(self, image: annotations_lib.ImageAnnotations):
        try:
            with open(image.path, "rb") as file:
                encoded = file.read()
        except OSError as error:
            yield counting.reject(_open_error(image, error))
            return
        if not encoded:
            yield counting.reject(dead_letters.dead_letter(
                image.path, "read", "empty_file",
                "the image file is empty (0 bytes): a copy or download that never wrote it; copy it again"))
            return
        try:
            with Image.open(io.BytesIO(encoded)) as decoded:
                if decoded.width * decoded.height > self.max_pixels:  # the header only: nothing decoded yet
                    yield counting.reject(_over_budget(image, decoded.width * decoded.height,
                                                         f"is {decoded.width}×{decoded.height} =", self.max_pixels))
                    return
                decoded.load()
                deep = _deeper_than_8_bits(image, decoded, encoded)
                if deep is not None:
                    yield counting.reject(deep)
                    return
                stored, turn = (decoded.width, decoded.height), decoded.getexif().get(ORIENTATION, 1)
                image_format = decoded.format
                decoded = frames_lib.upright(decoded)
                width, height = decoded.width, decoded.height
                if image_format not in KEPT_FORMATS or turn in TURNED:  # store what TensorFlow decodes as shown
                    buffer = io.BytesIO()
                    decoded.convert("RGB").save(buffer, format="PNG")
                    encoded, image_format = buffer.getvalue(), "PNG"
        except Image.DecompressionBombError as error:  # over twice PIL's limit, which is at least `max_pixels`
            claimed = re.search(r"\((\d+) pixels\)", str(error))
            yield counting.reject(_over_budget(image, int(claimed.group(1)) if claimed else 0, "claims",
                                                 self.max_pixels))
            return
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
            yield counting.reject(dead_letters.dead_letter(image.path, "read", "unreadable", f"not a readable image ({error})"))
            return
        if (image.width, image.height) == stored != (width, height):
            yield counting.reject(_sideways(image, stored, turn))
            return
        if image.width not in (None, width) or image.height not in (None, height):
            yield counting.reject(dead_letters.dead_letter(
                image.path, "validate", "size_mismatch",
                f"annotations say {image.width or '?'}×{image.height or '?'}, the file is {width}×{height}"
                + (" as shown (its EXIF Orientation turns it)" if turn in TURNED else "")))
            return
        boxes, labels, texts, dead, flags = valid_boxes(image, width, height)
        for letter in dead:
            yield counting.reject(letter)
        record = detection_schema.DetectionRecord(
            source_id=image.source_id, filename=os.path.basename(image.path), encoded=encoded,
            image_format=KEPT_FORMATS[image_format], height=height, width=width, boxes=boxes, labels=labels, texts=texts,
            crowd=flags["crowd"], difficult=flags["difficult"],
        )
        yield counting.accept(detection_schema.encode_detection_example(record))


def run(
    annotations: str,
    images: str,
    output: str,
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    label_map: str | None = None,
    extend_label_map: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    log: Callable[[str], None] = print,
) -> dict:
    """Converts the annotated images into `output`; returns the summary.

    Args:
        label_map: a `label_map.json` of a previous conversion (e.g. the training
            split) that fixes the class ids; None derives them from the annotations.
        extend_label_map: give a class `label_map` lacks the next free id instead of refusing it.
        max_pixels: images over this many pixels are dead letters.

    Raises:
        FileNotFoundError: the annotations, the image directory or the label map do not exist.
        ValueError: the annotations are not COCO JSON or VOC XML, or list no image;
            a class is not in `label_map`; `max_pixels` is not positive.
        output_guard.OutputRefused: `output` overlaps the inputs, or holds files fullres did not write.
        conversion.PreprocessingFailed: too large a fraction of dead letters
            (raised after the output, good records included, is in place).
    """
    dead_letters.check_failed_fraction(max_failed_fraction)
    output_guard.check_conversion_output(output, {"annotations": annotations, "images": images, "label map": label_map})
    if not os.path.isdir(images):
        raise FileNotFoundError(f"image directory {images!r} does not exist; pass the directory the annotations refer to.")
    if max_pixels < 1:
        raise ValueError(f"--max-pixels must be a positive number of pixels, got {max_pixels}.")
    if not os.path.exists(annotations):
        raise FileNotFoundError(f"annotations {annotations!r} do not exist; pass a COCO JSON file or a directory of VOC "
                                "XML.")
    if os.path.isdir(annotations):
        items, dead, label_ids, hidden = voc_annotations.read_folder(annotations, images, label_map, extend_label_map,
                                                                     log)
    else:
        items, dead, label_ids = annotations_lib.read_coco(annotations, images, label_map, extend_label_map, log)
        hidden = 0  # a COCO file names its images: no folder is listed
    if not items and not dead:
        raise ValueError(f"{annotations} lists no images.")
    log(f"fullres preprocess images: {len(items)} images to convert, {len(dead)} annotations rejected"
        f"{hidden_files.said(hidden)}; writing {output}")
    return conversion.run(
        items, dead, ConvertImageFn(max_pixels), output, pipeline_args=pipeline_args, num_shards=num_shards,
        compress=compress, max_failed_fraction=max_failed_fraction, extra_files={dataset_files.LABEL_MAP: dataset_files.check_label_map(label_ids)},
        summary_fields=lambda counters: {"hidden_files_ignored": hidden}, log=log,
    )
