"""Means and variances from one pass over the activation, with a one-pass gradient: the statistics of GroupNorm,
InstanceNorm (`GroupNormalization(groups=channels)`, the zoo's), BatchNorm and LayerNorm, as `keras.ops.moments`
computes them.

Keras's JAX `moments` is `jnp.mean` and then `jnp.var`, which subtracts that mean and reads the activation a second
time; autodiff's gradient of it reads it again per statistic. Here

    mean = Σx / n,   var = max(Σx² / n − mean², 0)

are two sums of one pass (XLA fuses them into one multi-output reduction), accumulated in at least float32, and the
gradient is written out, one elementwise pass:

    dx = d_mean / n + d_var · 2 (x − mean) / n

Exact in exact arithmetic; in floating point `Σx²/n − mean²` loses digits where the mean is large against the
standard deviation (relative error about ε · mean²/var, ε of the accumulation dtype: float32 for float32 and
bfloat16 steps). Split in space, each sum is the device's partial sum and an all-reduce, as before.
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


def _statistics(x, axes):
    accumulate = jnp.promote_types(x.dtype, jnp.float32)
    count = math.prod(x.shape[a] for a in axes)
    wide = x.astype(accumulate)
    mean = jnp.sum(wide, axes, keepdims=True) / count
    variance = jnp.maximum(jnp.sum(wide * wide, axes, keepdims=True) / count - mean * mean, 0)
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
