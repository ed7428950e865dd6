"""What `fullres predict` writes for a video: DAVIS-layout palette PNG masks, and an overlay MP4 a person can watch.

Masks go back to the source's own frame size: the clip-size prediction is
resized (nearest) onto the crop box preprocessing cut, and what lay outside
the box (`--fit crop` cuts the edges) is background. Each mask is a palette PNG
whose indices are the classes, with the DAVIS / PASCAL VOC colours, as DAVIS and
YouTube-VOS evaluation tools read them. The overlay is the source video with
each class's colour blended in, H.264 at the source's frame rate; every file
is written whole or not at all (`common.file_writes`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
from PIL import Image

from common import file_writes

OVERLAY_SUFFIX = ".overlay.mp4"
OPACITY = 0.5  # of a class's colour over the frame


def davis_palette() -> list[int]:
    """The 256 colours of the DAVIS / PASCAL VOC palette (index 1 dark red, 2 dark green, ...), as 768 numbers.

    >>> davis_palette()[:9]
    [0, 0, 0, 128, 0, 0, 0, 128, 0]
    """
    palette = []
    for index in range(256):
        red = green = blue = 0
        value = index
        for bit in range(8):
            red |= ((value >> 0) & 1) << (7 - bit)
            green |= ((value >> 1) & 1) << (7 - bit)
            blue |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        palette += [red, green, blue]
    return palette


def unfit_mask(mask: np.ndarray, source_size: tuple[int, int], box: tuple[float, float, float, float]) -> np.ndarray:
    """(h, w) class ids at the clip size back onto a (H, W) source frame: resized (nearest) into `box`, 0 outside."""
    left, top, right, bottom = (int(round(v)) for v in box)
    resized = np.asarray(Image.fromarray(mask.astype(np.uint8)).resize((right - left, bottom - top),
                                                                       Image.Resampling.NEAREST))
    full = np.zeros(source_size, np.uint8)
    full[top:bottom, left:right] = resized[:source_size[0] - top, :source_size[1] - left]
    return full


def write_masks(folder: str, masks: Iterable[np.ndarray], names: Sequence[str]) -> list[str]:
    """Writes each (H, W) mask as `folder/NAME` (palette PNGs; NAME: its frame's own name, `00005.png`); returns
    the names."""
    os.makedirs(folder, exist_ok=True)
    palette = davis_palette()
    for name, mask in zip(names, masks, strict=True):
        image = Image.fromarray(mask)  # mode L; the palette makes it P
        image.putpalette(palette)
        with file_writes.whole(os.path.join(folder, name)) as temporary:
            image.save(temporary, format="PNG")
    return list(names)


def overlay(frame: np.ndarray, mask: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 `frame` with each labelled pixel blended with its class's colour."""
    colours = palette[mask]  # (H, W, 3)
    blended = frame.astype(np.float32) * (1 - OPACITY) + colours * OPACITY
    return np.where((mask > 0)[..., None], blended, frame).astype(np.uint8)


def write_overlay(path: str, frames: Iterable[np.ndarray], masks: Iterable[np.ndarray], fps: float) -> None:
    """Encodes the overlays of `frames` (H, W, 3) and `masks` as an H.264 MP4 at `fps`, written whole.

    H.264's 4:2:0 colour needs even sizes: an odd height or width gets one black row or column.
    """
    import fractions

    import av

    palette = np.asarray(davis_palette(), np.float32).reshape(256, 3)
    with file_writes.whole(path) as temporary:
        with av.open(temporary, "w", format="mp4") as container:
            stream = None
            for frame, mask in zip(frames, masks):
                picture = overlay(frame, mask, palette)
                height, width = picture.shape[0] + picture.shape[0] % 2, picture.shape[1] + picture.shape[1] % 2
                if stream is None:
                    stream = container.add_stream("libx264", rate=fractions.Fraction(fps).limit_denominator(1001))
                    stream.height, stream.width, stream.pix_fmt = height, width, "yuv420p"
                if picture.shape[:2] != (height, width):
                    picture = np.pad(picture, ((0, height - picture.shape[0]), (0, width - picture.shape[1]), (0, 0)))
                for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode() if stream is not None else ():
                container.mux(packet)
