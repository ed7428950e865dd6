"""Random draws of the device augmentations, one per row of the global batch, from each row's key.

Every augmentation derives its own stream from a row's key (`stream`, with the
augmentation's fixed id), then draws its parameters from it here: so a row is
augmented the same whichever device holds it, however the batch is split, and
a resumed run draws as the uninterrupted one did (the keys are per (seed, step,
row): contracts.md, `trainer.augment.keys`).

The ranges follow batchgeneratorsv2, which nnU-Net v2 augments with:
`uniform` is its `sample_scalar` of a (low, high) pair, `bg_contrast` its
`BGContrast` (a factor below or above 1 with equal chance).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def stream(keys: jax.Array, augmentation_id: int, draws: int) -> jax.Array:
    """(B, draws) keys: `draws` independent keys per row, in the stream of augmentation `augmentation_id`."""
    return jax.vmap(lambda key: jax.random.split(jax.random.fold_in(key, augmentation_id), draws))(keys)


def uniform(keys: jax.Array, low: float, high: float, shape: tuple[int, ...] = ()) -> jax.Array:
    """(B, *shape) float32 draws from U(low, high), one set per row key in `keys` (B,)."""
    return jax.vmap(lambda key: jax.random.uniform(key, shape, jnp.float32, low, high))(keys)


def bernoulli(keys: jax.Array, probability: float, shape: tuple[int, ...] = ()) -> jax.Array:
    """(B, *shape) booleans, True with `probability`, one set per row key."""
    return jax.vmap(lambda key: jax.random.uniform(key, shape, jnp.float32) < probability)(keys)


def bg_contrast(keys: jax.Array, low: float, high: float, shape: tuple[int, ...] = ()) -> jax.Array:
    """(B, *shape) factors drawn as batchgeneratorsv2's `BGContrast((low, high))`.

    With probability 1/2 (when `low` < 1) from U(low, 1), else from U(max(low, 1), high): a range like
    (0.75, 1.25) darkens as often as it brightens, and (0.7, 1.5) as often flattens as steepens.
    """
    def draw(key):
        choose, below, above = jax.random.split(key, 3)
        lower = jax.random.uniform(below, shape, jnp.float32, low, min(1.0, high))
        upper = jax.random.uniform(above, shape, jnp.float32, max(low, 1.0), high)
        take_lower = jax.random.uniform(choose, shape, jnp.float32) < 0.5 if low < 1 else jnp.zeros(shape, bool)
        return jnp.where(take_lower, lower, upper)

    return jax.vmap(draw)(keys)


def per_row(values: jax.Array, ndim: int) -> jax.Array:
    """(B, ...) values shaped to broadcast against an array of rank `ndim` with batch first and the rest after:
    (B,) -> (B, 1, 1, 1, 1) and (B, C) -> (B, 1, 1, 1, C) for (B, D, H, W, C) images."""
    if values.ndim == 1:
        return values.reshape(values.shape[0], *(1,) * (ndim - 1))
    return values.reshape(values.shape[0], *(1,) * (ndim - values.ndim), *values.shape[1:])
