"""Mirroring: each example flipped along each chosen spatial axis with probability 1/2, on the device.

Flipping an axis that is split over devices moves whole shards between them
(XLA lowers a reverse of a split axis to a collective-permute of the shards),
never a gather of the volume.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

STREAM = 1  # this augmentation's stream of a row's key (`jax.random.fold_in(row_key, STREAM)`)


def mirror(images: jax.Array, labels: jax.Array, keys: jax.Array, axes: Sequence[int] | None = None):
    """Flips each row of `images` (B, *spatial, C) and `labels` (B, *spatial) along each of `axes` with p = 1/2.

    Args:
        keys: (B,) one key per global batch row (`keys.row_keys`).
        axes: spatial axes to mirror, 0 = the first spatial axis (depth in 3D); None: all of them.

    Returns:
        (images, labels), each row flipped by its own draws.

    Example:
        >>> from trainer.augment import keys as keys_lib
        >>> images = jnp.arange(8.0).reshape(2, 4, 1)  # (B, W, C)
        >>> flipped, _ = mirror(images, jnp.zeros((2, 4), jnp.int32), keys_lib.row_keys(0, 3, 2))
        >>> sorted(flipped[0, :, 0].tolist()) == [0.0, 1.0, 2.0, 3.0]
        True
    """
    spatial = labels.ndim - 1
    axes = tuple(range(spatial)) if axes is None else tuple(axes)
    draws = jax.vmap(lambda key: jax.random.bernoulli(jax.random.fold_in(key, STREAM), 0.5, (spatial,)))(keys)
    for axis in axes:
        flip = draws[:, axis]  # (B,)
        images = jnp.where(flip.reshape((-1,) + (1,) * (images.ndim - 1)), jnp.flip(images, axis + 1), images)
        labels = jnp.where(flip.reshape((-1,) + (1,) * (labels.ndim - 1)), jnp.flip(labels, axis + 1), labels)
    return images, labels
