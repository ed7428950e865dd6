"""Per-frame masks: palette (or greyscale) PNGs whose pixel indices are the class ids, as DAVIS and YouTube-VOS write.

A palette PNG stores an index per pixel and a colour per index; the index is
the class, the colour only how a viewer shows it. Every frame of one video
must carry the same palette (else the same colour means two classes, or one
class two colours, in one video), the same size as its frame, and indices no
larger than the data set's classes. An RGB mask is refused: its colours would
have to be guessed back into classes. A mask with an EXIF Orientation is turned
upright, as frames are (`frames.read_frame`).

Example:
    >>> import os, tempfile
    >>> from PIL import Image
    >>> folder = tempfile.mkdtemp()
    >>> mask = Image.fromarray(np.array([[0, 1], [2, 1]], np.uint8))
    >>> mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
    >>> mask.save(os.path.join(folder, "00000.png"))
    >>> read_masks([os.path.join(folder, "00000.png")], (2, 2), lambda m: m, 255).tolist()
    [[[0, 1], [2, 1]]]
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from common import dead_letters, hidden_files
from preprocessing.video import frame_order, frames as frames_lib

MASK_SUFFIX = ".png"
INDEXED_MODES = ("P", "L")  # palette indices, or grey levels read as class ids


def mask_files(folder: str) -> list[str]:
    """A video file's PNG masks in `folder`, in frame order: by the number in their names (`frame_order`), which
    must run one by one (the masks pair with the frames by position), hidden files left out.

    Raises:
        dead_letters.CaseError: names that cannot be ordered, or a missing mask between two (`frame_order`).
    """
    masks = frame_order.ordered(hidden_files.list_folder(folder)[0], (MASK_SUFFIX,), "mask", "labels")
    if masks.step != 1:
        raise dead_letters.CaseError("labels", "label_frames_missing", (
            f"its masks are numbered in steps of {masks.step} ({', '.join(masks.files[:2])}, ...) but a video file's "
            "masks pair with its frames one by one; add a mask for every frame (an all-zero PNG where nothing is "
            "labelled)"))
    return [os.path.join(folder, name) for name in masks.files]


def pair_names(frames: list[str], masks: list[str]) -> None:
    """Refuses masks that do not name the same frames as `frames` (file stems, e.g. 00000): missing or extra ones.

    Raises:
        dead_letters.CaseError: `label_frames_missing` or `label_frames_extra`, naming the first such frame.
    """
    frame_names = [os.path.splitext(os.path.basename(f))[0] for f in frames]
    mask_names = {os.path.splitext(os.path.basename(m))[0] for m in masks}
    missing = [name for name in frame_names if name not in mask_names]
    extra = sorted(mask_names - set(frame_names))
    if missing:
        raise dead_letters.CaseError("labels", "label_frames_missing", (
            f"{len(missing)} of its {len(frames)} frames have no mask (first: {missing[0]}{MASK_SUFFIX}); add a mask "
            "for every frame (an all-zero PNG where nothing is labelled), or leave the video's masks out"))
    if extra:
        raise dead_letters.CaseError("labels", "label_frames_extra", (
            f"{len(extra)} masks name no frame of it (first: {extra[0]}{MASK_SUFFIX}); remove them, or add their frames"))


def count_masks(frames: int, masks: list[str]) -> None:
    """Refuses a video file's mask folder that holds another number of masks than the video has frames."""
    if len(masks) < frames:
        raise dead_letters.CaseError("labels", "label_frames_missing", (
            f"the video has {frames} frames but its mask folder {len(masks)} masks; add a mask for every frame "
            f"(frame {len(masks)} on has none), or leave the video's masks out"))
    if len(masks) > frames:
        raise dead_letters.CaseError("labels", "label_frames_extra", (
            f"the video has {frames} frames but its mask folder {len(masks)} masks (the last "
            f"{len(masks) - frames} name no frame); remove them, or check that the mask folder is this video's"))


def read_masks(paths: list[str], size: tuple[int, int], fit: Callable[[np.ndarray], np.ndarray],
               max_label: int) -> np.ndarray:
    """(N, h, w) uint8 class ids of the masks `paths`, each checked against the frames' `size` (H, W) and fitted.

    Raises:
        dead_letters.CaseError: an unreadable or RGB mask, palettes that differ, a mask of another size, or a
            class id above `max_label`.
    """
    masks, palette = [], None
    for number, path in enumerate(paths):
        name = os.path.basename(path)
        try:
            with Image.open(path) as stored:
                image = frames_lib.upright(stored)  # drawn on the picture as shown: turned as its frame is (EXIF)
                image.load()
        except (OSError, UnidentifiedImageError, SyntaxError) as error:
            raise dead_letters.CaseError("labels", "unreadable_mask", f"mask {name} is not a readable PNG "
                                         f"({error}); write it again") from None
        if image.mode not in INDEXED_MODES:
            raise dead_letters.CaseError("labels", "mask_not_indexed", (
                f"mask {name} is a {image.mode} image, not a palette (P) or greyscale (L) PNG of class ids; save the "
                "masks as palette PNGs whose indices are the classes, as DAVIS does"))
        this_palette = image.getpalette() if image.mode == "P" else None
        if number == 0:
            palette = this_palette
        elif this_palette != palette:
            raise dead_letters.CaseError("labels", "palette_differs", (
                f"mask {name} has another palette than the first mask {os.path.basename(paths[0])}, so one colour "
                "would mean two classes; save every mask of the video with one palette"))
        if (image.height, image.width) != tuple(size):
            raise dead_letters.CaseError("labels", "odd_size", (
                f"mask {name} is {image.width}×{image.height} but its frame is {size[1]}×{size[0]}; draw the masks "
                "at the frames' size"))
        values = np.asarray(image, np.uint8)
        if int(values.max(initial=0)) > max_label:
            raise dead_letters.CaseError("labels", "label_out_of_range", (
                f"mask {name} holds class {int(values.max())} but the classes run 0..{max_label}; pass --num-classes "
                f"{int(values.max()) + 1} or more, or fix the mask"))
        masks.append(fit(values))
    return np.stack(masks)
