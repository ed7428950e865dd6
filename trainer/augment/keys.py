"""The random keys of a training step: one per global batch row, from (seed, step, row) alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_keys(seed: int, step, batch_size: int) -> jax.Array:
    """(batch_size,) typed keys: `fold_in(fold_in(key(seed), step), row)` for each row of the global batch.

    `step` may be traced (the training step's step number). Each augmentation
    takes its own stream from a row's key with `jax.random.fold_in(key, its id)`.

    Example:
        >>> keys = row_keys(0, 7, 2)
        >>> keys.shape, bool((jax.random.key_data(keys[0]) != jax.random.key_data(keys[1])).any())
        ((2,), True)
    """
    step_key = jax.random.fold_in(jax.random.key(seed), step)
    return jax.vmap(lambda row: jax.random.fold_in(step_key, row))(jnp.arange(batch_size))
