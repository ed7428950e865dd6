"""A frame file read as it is shown, and fitted to the clip's size: the same crop box and resize for the RGB frame
(bilinear) and its mask (nearest).

`read_frame` reads a frame folder's image as a viewer shows it, for
`fullres preprocess video` and `fullres predict` alike: turned upright by its
EXIF Orientation (phones store the sensor's picture turned, with a tag that
says how to show it; masks are drawn on the picture shown, and are turned by
theirs, `mask_frames`), and a 16-bit greyscale PNG (scientific and depth
cameras) scaled from its 0..65535 to 0..255, as its bit depth says, not clipped
at 255 (which makes it all white).

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

import os

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from common import dead_letters

FITS = ("crop", "resize")
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # how Pillow opens a 16-bit greyscale PNG


def upright(image: Image.Image) -> Image.Image:
    """`image`, turned in place as its EXIF Orientation says it is shown (untouched, not copied, if it has none)."""
    ImageOps.exif_transpose(image, in_place=True)
    return image


def read_frame(path: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB of the frame file `path`, as it is shown; see the module docstring.

    Raises:
        dead_letters.CaseError: `frame_is_a_mask` (a palette image), `undecodable`.
    """
    name = os.path.basename(path)
    try:
        with Image.open(path) as image:
            if image.mode == "P":
                raise dead_letters.CaseError("read", "frame_is_a_mask", (
                    f"frame {name} is a palette image, as masks are, not a picture; if the folder holds masks, pass "
                    "their folder with --labels; if it holds frames, save them as RGB"))
            shown = upright(image)
            if shown.mode in SIXTEEN_BIT_MODES and image.format == "PNG":  # PNG stores 1-16 bits: 16 here
                grey = np.round(np.asarray(shown, np.float64) * (255 / 65535)).astype(np.uint8)  # (H, W)
                return np.repeat(grey[..., None], 3, axis=-1)  # (H, W, 3)
            return np.asarray(shown.convert("RGB"))
    except (OSError, UnidentifiedImageError, SyntaxError) as error:
        raise dead_letters.CaseError("read", "undecodable", f"frame {name} is not a readable image ({error}); copy "
                                     "it again") from None


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
