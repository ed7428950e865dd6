"""One frame to the clip's size: the same crop box and resize for the RGB frame (bilinear) and its mask (nearest).

`--fit crop` (default) scales the frame until it covers H×W and cuts the middle
(the aspect ratio kept, the edges lost); `--fit resize` stretches the whole
frame to H×W. Both are one `PIL.Image.resize(..., box=...)` call, so the mask
lands on exactly the pixels its frame does.

Example:
    >>> crop_box((480, 854), (240, 240), "crop")
    (187.0, 0.0, 667.0, 480.0)
    >>> crop_box((480, 854), (240, 240), "resize")
    (0.0, 0.0, 854.0, 480.0)
"""

from __future__ import annotations

import numpy as np
from PIL import Image

FITS = ("crop", "resize")


def crop_box(source: tuple[int, int], size: tuple[int, int], fit: str) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a `source` (H, W) frame that becomes the `size` (H, W) frame."""
    if fit not in FITS:
        raise ValueError(f"--fit {fit!r} is not known; use one of {', '.join(FITS)}.")
    height, width = source
    if fit == "resize":
        return 0.0, 0.0, float(width), float(height)
    scale = max(size[0] / height, size[1] / width)  # the smallest scale that covers the clip's frame
    kept_height, kept_width = size[0] / scale, size[1] / scale
    left, top = (width - kept_width) / 2, (height - kept_height) / 2
    return left, top, left + kept_width, top + kept_height


def fit_frame(frame: np.ndarray, size: tuple[int, int], box: tuple[float, float, float, float]) -> np.ndarray:
    """(H, W, 3) uint8 RGB `frame` cut to `box` and resized (bilinear) to `size` (H, W)."""
    image = Image.fromarray(frame)
    return np.asarray(image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=box))


def fit_mask(mask: np.ndarray, size: tuple[int, int], box: tuple[float, float, float, float]) -> np.ndarray:
    """(H, W) uint8 class ids cut to `box` and resized (nearest: no class is invented between two) to `size`."""
    image = Image.fromarray(mask)
    return np.asarray(image.resize((size[1], size[0]), Image.Resampling.NEAREST, box=box))
