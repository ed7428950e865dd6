"""Images with box annotations to sharded detection TFRecords with Beam (`fullres preprocess images`).

Each image is one work item. A missing or unreadable image, or one whose size
differs from its annotation, is a dead letter; a bad box (entirely outside the
image, or of non-positive size) is a dead letter of its own and the image is
kept with its good boxes. Boxes that cross the border are clipped to it.
Output layout, dead letters and atomic replacement: `preprocessing.conversion`;
`label_map.json` ({name: id}) is written beside the shards.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence

import apache_beam as beam
import numpy as np
from PIL import Image, UnidentifiedImageError

from preprocessing import annotations as annotations_lib, conversion, tfrecord_schema

KEPT_FORMATS = {"JPEG": "jpeg", "PNG": "png"}


def valid_boxes(image: annotations_lib.ImageAnnotations, width: int, height: int):
    """Splits an image's boxes into kept (clipped, normalized) boxes and dead letters.

    Returns:
        (boxes (N, 4) float32 ymin, xmin, ymax, xmax in [0, 1], labels, texts, dead letters).
    """
    kept, labels, texts, dead = [], [], [], []
    for box in image.boxes:
        if box.x_max <= box.x_min or box.y_max <= box.y_min:
            dead.append(conversion.dead_letter(box.source, "boxes", "box_non_positive_size",
                                               f"box ({box.x_min}, {box.y_min}, {box.x_max}, {box.y_max}) has no area"))
            continue
        x_min, x_max = max(box.x_min, 0.0), min(box.x_max, float(width))
        y_min, y_max = max(box.y_min, 0.0), min(box.y_max, float(height))
        if x_max <= x_min or y_max <= y_min:
            dead.append(conversion.dead_letter(box.source, "boxes", "box_outside_image",
                                               f"box ({box.x_min}, {box.y_min}, {box.x_max}, {box.y_max}) lies outside "
                                               f"the {width}×{height} image"))
            continue
        kept.append([y_min / height, x_min / width, y_max / height, x_max / width])
        labels.append(box.label)
        texts.append(box.text)
    return np.asarray(kept, np.float32).reshape(-1, 4), tuple(labels), tuple(texts), dead


class ConvertImageFn(beam.DoFn):
    """One `ImageAnnotations` in; a serialized record and/or dead letters out."""

    def process(self, image: annotations_lib.ImageAnnotations):
        try:
            with open(image.path, "rb") as file:
                encoded = file.read()
        except FileNotFoundError:
            yield conversion.reject(conversion.dead_letter(image.path, "read", "missing_image", "the image file does not exist"))
            return
        try:
            with Image.open(io.BytesIO(encoded)) as decoded:
                decoded.load()
                width, height, image_format = decoded.width, decoded.height, decoded.format
                if image_format not in KEPT_FORMATS:  # store what TensorFlow decodes everywhere
                    buffer = io.BytesIO()
                    decoded.convert("RGB").save(buffer, format="PNG")
                    encoded, image_format = buffer.getvalue(), "PNG"
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            yield conversion.reject(conversion.dead_letter(image.path, "read", "unreadable", f"not a readable image ({error})"))
            return
        if (image.width, image.height) != (None, None) and (image.width, image.height) != (width, height):
            yield conversion.reject(conversion.dead_letter(
                image.path, "validate", "size_mismatch",
                f"annotations say {image.width}×{image.height}, the file is {width}×{height}"))
            return
        boxes, labels, texts, dead = valid_boxes(image, width, height)
        for letter in dead:
            yield conversion.reject(letter)
        record = tfrecord_schema.DetectionRecord(
            source_id=image.source_id, filename=os.path.basename(image.path), encoded=encoded,
            image_format=KEPT_FORMATS[image_format], height=height, width=width, boxes=boxes, labels=labels, texts=texts,
        )
        yield conversion.accept(tfrecord_schema.encode_detection_example(record))


def run(
    annotations: str,
    images: str,
    output: str,
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> dict:
    """Converts the annotated images into `output`; returns the summary.

    Raises:
        FileNotFoundError: the annotations or the image directory do not exist.
        ValueError: the annotations are not COCO JSON or VOC XML, or list no image.
        conversion.PreprocessingFailed: too large a fraction of dead letters
            (raised after the output, good records included, is in place).
    """
    if not os.path.isdir(images):
        raise FileNotFoundError(f"image directory {images!r} does not exist; pass the directory the annotations refer to.")
    items, dead, label_map = annotations_lib.read_annotations(annotations, images)
    if not items and not dead:
        raise ValueError(f"{annotations} lists no images.")
    log(f"fullres preprocess images: {len(items)} images to convert, {len(dead)} annotations rejected; writing {output}")
    return conversion.run(
        items, dead, ConvertImageFn(), output, pipeline_args=pipeline_args, num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction, extra_files={"label_map.json": label_map}, log=log,
    )
