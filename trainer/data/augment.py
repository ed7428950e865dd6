"""Augmentation on the host, reproducible per (seed, step, row): a resumed run augments as an uninterrupted one."""

from __future__ import annotations

import numpy as np


def random_flips(images: np.ndarray, labels: np.ndarray, seed: int, step_number: int, rows=None):
    """Flips each example along each spatial axis with probability 1/2.

    The draw depends only on (seed, step, the example's row in the global
    batch), so a resumed run augments exactly as an uninterrupted one, and a
    process holding some rows of the batch flips them as one process would.

    Args:
        images: (B, D, H, W, C) or (B, H, W, C).
        labels: (B, D, H, W) or (B, H, W).
        rows: the global batch rows these examples are (default: 0 to B - 1).
    """
    rows = list(range(images.shape[0])) if rows is None else list(rows)
    rng = np.random.default_rng([seed, step_number])
    spatial_axes = range(1, labels.ndim)
    flips = rng.random((max(rows) + 1, len(spatial_axes))) < 0.5  # (global rows, axes), drawn row by row
    images, labels = images.copy(), labels.copy()
    for example, row in enumerate(rows):
        for axis in spatial_axes:
            if flips[row, axis - 1]:
                images[example] = np.flip(images[example], axis=axis - 1)
                labels[example] = np.flip(labels[example], axis=axis - 1)
    return images, labels
