"""Patch-based prediction as nnU-Net does it: how a patch-trained model (`TrainConfig.patch_size`) predicts a volume.

`fullres predict` and evaluation use it for a patch-trained model, and on
request (`fullres predict --sliding-window`) for a whole-volume one;
`benchmarks/learning/predict_whole_vs_sliding.py` and `benchmarks/learning/context_matters.py`
compare it with one whole-volume pass.

nnU-Net (and MONAI's `sliding_window_inference` with `mode="gaussian"`) cuts
a volume into overlapping patches of the training shape, predicts each,
weights every patch's output by a Gaussian centred on the patch (sigma = 1/8
of the patch size per axis, so voxels near a seam count less), adds the
weighted outputs up and divides by the summed weights. This module follows
nnU-Net v2's published algorithm (`compute_steps_for_sliding_window`,
`compute_gaussian`): written here from its description, since installing
PyTorch for MONAI is not reasonable on this project's machines. Test-time
mirroring is left off on both sides of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import ndimage


def window_starts(size: int, patch: int, overlap: float) -> list[int]:
    """Start offsets along one axis: patches at most `patch * (1 - overlap)` apart, the last one flush with the end.

    >>> window_starts(100, 32, 0.5)
    [0, 14, 27, 41, 54, 68]
    >>> window_starts(32, 32, 0.5)
    [0]
    """
    if size <= patch:
        return [0]
    target_step = patch * (1.0 - overlap)
    count = math.ceil((size - patch) / target_step) + 1
    step = (size - patch) / (count - 1)
    return [int(round(step * i)) for i in range(count)]


def gaussian_weights(patch: Sequence[int], sigma_scale: float = 1.0 / 8) -> np.ndarray:
    """nnU-Net's importance map: a Gaussian at the patch centre, sigma `sigma_scale` × the size, peak 1, no zeros."""
    impulse = np.zeros(patch, np.float64)
    impulse[tuple(p // 2 for p in patch)] = 1.0
    weights = ndimage.gaussian_filter(impulse, [p * sigma_scale for p in patch], mode="constant", cval=0.0)
    weights /= weights.max()
    weights[weights == 0] = weights[weights > 0].min()  # the corners still count a little
    return weights.astype(np.float32)


OVERLAP = 0.5  # nnU-Net's tile_step_size 0.5: neighbouring windows share half a patch


def describe(patch: Sequence[int]) -> str:
    """The rule in words, for logs and predict's summary.

    >>> describe((64, 64, 32))
    'sliding window of 64x64x32 patches, half overlap, Gaussian weights (sigma 1/8 of the patch)'
    """
    return (f"sliding window of {'x'.join(map(str, patch))} patches, half overlap, Gaussian weights "
            "(sigma 1/8 of the patch)")


def predict(volume: np.ndarray, patch: Sequence[int], forward: Callable[[np.ndarray], np.ndarray],
            overlap: float = OVERLAP, batch_size: int = 1, gaussian: bool = True, fill: float = 0.0
            ) -> tuple[np.ndarray, int]:
    """Per-voxel outputs of `forward` over `volume`, predicted patch by patch and blended.

    Args:
        volume: (D, H, W, C) one scan, already preprocessed as the model expects.
        patch: (d, h, w) the patch shape (the training shape).
        forward: maps a (B, d, h, w, C) batch of patches to (B, d, h, w, K) outputs (probabilities or logits).
        overlap: fraction of a patch neighbouring patches share (0.5: nnU-Net's and the issue's setting).
        batch_size: patches per call of `forward`.
        gaussian: weight each patch's output by `gaussian_weights` (nnU-Net); False weights all voxels equally.
        fill: the value a volume smaller than a patch is padded with (the scan's background).

    Returns:
        (outputs (D, H, W, K) float32, number of patches predicted).
    """
    spatial = volume.shape[:3]
    padding = [(0, max(p - s, 0)) for s, p in zip(spatial, patch)]  # a volume smaller than a patch is padded
    padded = (np.pad(volume, [*padding, (0, 0)], constant_values=fill) if any(after for _, after in padding)
              else volume)
    starts = [window_starts(s, p, overlap) for s, p in zip(padded.shape[:3], patch)]
    corners = [(z, y, x) for z in starts[0] for y in starts[1] for x in starts[2]]
    weights = gaussian_weights(patch) if gaussian else np.ones(patch, np.float32)
    total = None
    weight_sum = np.zeros(padded.shape[:3], np.float32)
    for first in range(0, len(corners), batch_size):
        group = corners[first:first + batch_size]
        patches = np.stack([padded[z:z + patch[0], y:y + patch[1], x:x + patch[2]] for z, y, x in group])
        outputs = np.asarray(forward(patches), np.float32)
        if total is None:
            total = np.zeros((*padded.shape[:3], outputs.shape[-1]), np.float32)
        for (z, y, x), output in zip(group, outputs):
            total[z:z + patch[0], y:y + patch[1], x:x + patch[2]] += output * weights[..., None]
            weight_sum[z:z + patch[0], y:y + patch[1], x:x + patch[2]] += weights
    blended = total / weight_sum[..., None]
    return blended[:spatial[0], :spatial[1], :spatial[2]], len(corners)
