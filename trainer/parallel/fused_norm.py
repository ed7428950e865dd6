"""Means and variances from one pass over the activation, with a one-pass gradient: the statistics of GroupNorm,
InstanceNorm (`GroupNormalization(groups=channels)`, the zoo's), BatchNorm and LayerNorm, as `keras.ops.moments`
computes them.

Keras's JAX `moments` is `jnp.mean` and then `jnp.var`, which subtracts that mean and reads the activation a second
time; autodiff's gradient of it reads it again per statistic. Here both come from two sums of one pass over the
values shifted by K, one value per statistic close to the data:

    mean = K + Σ(x − K) / n,   var = max(Σ(x − K)² / n − (Σ(x − K) / n)², 0)

(XLA fuses the two sums into one multi-output reduction), accumulated in at least float32. Unshifted sums
(Σx²/n − mean²) cancel where the mean is large against the spread: the variance's relative error is about
ε · mean² / var (ε of the accumulation dtype), and a channel of mean 1000 and spread 0.1 kept no digit in float32.
Shifted, it is about ε · (1 + (mean − K)² / var). K is the mean of the first values of the blocks the reduced voxels
are cut into: one block per device of a spatial split, one per example along a reduced batch axis (a replica holds
whole examples), one block unsplit. So each device reads only its own first value, and K costs an all-reduce of a
(batch, channels) array, as each sum does. The gradient is written out, one elementwise pass:

    dx = d_mean / n + d_var · 2 (x − mean) / n
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def moments(x, axes: tuple[int, ...]):
    """(mean, variance) of `x` over `axes`, kept as size-1 axes, in `x`'s dtype (accumulated in at least float32).

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(size=(2, 4, 4, 3)).astype("float32")
        >>> mean, variance = moments(x, (1, 2))
        >>> bool(np.allclose(mean, x.mean((1, 2), keepdims=True), atol=1e-6)), variance.shape
        (True, (2, 1, 1, 3))
    """
    return _statistics(x, axes)[:2]


def _blocks(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """How many blocks each axis of an activation of `shape` is cut into for `_statistics`: a reduced batch axis one
    per example (a replica holds whole examples), a reduced spatial axis one per device of the split (`split_ops`),
    every other axis 1."""
    from trainer.parallel import split_ops

    parts = split_ops.partition_dims()[1:-1]
    blocks = [1] * len(shape)
    if 0 in axes:
        blocks[0] = shape[0]
    if len(shape) >= len(parts) + 2:
        for axis, count in enumerate(parts, start=1):
            if axis in axes and count > 1 and shape[axis] % count == 0:
                blocks[axis] = count
    return tuple(blocks)


def _statistics(x, axes):
    accumulate = jnp.promote_types(x.dtype, jnp.float32)
    count = math.prod(x.shape[a] for a in axes)
    blocks = _blocks(x.shape, axes)
    blocked_shape, across, within = [], [], []  # the blocked array's shape; its block axes and in-block axes
    for axis, (size, parts) in enumerate(zip(x.shape, blocks)):
        if axis in axes and parts > 1:
            across.append(len(blocked_shape))
            blocked_shape.append(parts)
        if parts < size or axis not in axes:
            if axis in axes:
                within.append(len(blocked_shape))
            blocked_shape.append(size // parts)
    wide = jnp.reshape(x.astype(accumulate), blocked_shape)  # each reduced axis (n,) as (blocks, n / blocks)
    shift = wide
    for axis in within:
        shift = jax.lax.slice_in_dim(shift, 0, 1, axis=axis)  # each block's first value
    shift = jnp.mean(shift, across, keepdims=True) if across else shift  # K: their mean (an all-reduce, split)
    centred = wide - shift
    reduced = (*across, *within)
    mean_offset = jnp.sum(centred, reduced, keepdims=True) / count  # mean − K
    variance = jnp.maximum(jnp.sum(centred * centred, reduced, keepdims=True) / count - mean_offset * mean_offset, 0)
    kept = tuple(1 if a in axes else size for a, size in enumerate(x.shape))  # keepdims' shape
    mean = jnp.reshape(shift + mean_offset, kept)
    variance = jnp.reshape(variance, kept)
    return mean.astype(x.dtype), variance.astype(x.dtype), mean


def _moments_forward(x, axes):
    mean, variance, wide_mean = _statistics(x, axes)
    return (mean, variance), (x, wide_mean)


def _moments_backward(axes, residuals, gradients):
    x, mean = residuals
    mean_gradient, variance_gradient = gradients
    count = math.prod(x.shape[a] for a in axes)
    wide = mean.dtype
    x_gradient = (mean_gradient.astype(wide) + variance_gradient.astype(wide) * 2 * (x.astype(wide) - mean)) / count
    return (x_gradient.astype(x.dtype),)


moments.defvjp(_moments_forward, _moments_backward)


def keras_moments(x, axes, keepdims=False):
    """Keras's JAX `moments(x, axes, keepdims)`: 16-bit inputs computed in float32 and clipped to float16's range on
    the way back, as Keras does; the statistics from `moments`."""
    from keras.src import backend
    from keras.src.backend.jax import core

    x = core.convert_to_tensor(x)
    original_dtype = backend.standardize_dtype(x.dtype)
    narrow = original_dtype in ("float16", "bfloat16")
    if narrow:
        x = x.astype(jnp.float32)
    axes = tuple(sorted(a % x.ndim for a in ((axes,) if isinstance(axes, int) else axes)))
    mean, variance = moments(x, axes)
    if not keepdims:
        mean, variance = jnp.squeeze(mean, axes), jnp.squeeze(variance, axes)
    if narrow:
        limit = jnp.finfo(jnp.float16)
        mean = jnp.clip(mean, limit.min, limit.max).astype(original_dtype)
        variance = jnp.clip(variance, limit.min, limit.max).astype(original_dtype)
    return mean, variance
