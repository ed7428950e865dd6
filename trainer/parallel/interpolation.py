"""Upsampling by integer factors, linear (bilinear, trilinear) or nearest, as `jax.image.resize` computes it, from
each voxel and its two neighbours: split in space, it needs a 1-voxel halo, never a gather.

`jax.image.resize` (and so `keras.ops.image.resize` and `UpSampling2D(interpolation="bilinear")`) computes each
axis as a product with a dense (output × input) weight matrix; split along that axis, XLA gathers. Upsampled by
an integer factor f with half-pixel centres, output voxel f·i + r lies at input coordinate i + δ_r,
δ_r = (r + ½)/f − ½, between voxel i and one neighbour:

    y[f·i + r] = −δ_r · x[i − 1] + (1 + δ_r) · x[i]      (δ_r < 0)
    y[f·i + r] = (1 − δ_r) · x[i] + δ_r · x[i + 1]       (δ_r ≥ 0)

and at the volume's edges JAX renormalises the weights over the voxels inside, which is the edge voxel repeated.
So each axis is two shifted copies (a 1-voxel halo where split; the volume's own edge handled by a mask, not
the devices' edges), f weighted sums, and an interleave of the f phases, which stays within each device's block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LINEAR = ("linear", "bilinear", "trilinear", "triangle")
NEAREST = ("nearest",)


def _method_name(method) -> str:
    return str(getattr(method, "name", method)).lower()


def supported(shape, size, method) -> bool:
    """True where `resize` equals `jax.image.resize(x, size, method)` for an `x` of `shape`: same rank, every axis
    kept or enlarged by an integer factor, at least one enlarged, and linear or nearest interpolation.

    >>> supported((1, 8, 8, 3), (1, 16, 24, 3), "bilinear"), supported((1, 8, 8, 3), (1, 12, 12, 3), "bilinear")
    (True, False)
    """
    if _method_name(method) not in LINEAR + NEAREST or len(shape) != len(size):
        return False
    if any(n is None or m is None or n < 1 or m < n or m % n for n, m in zip(shape, size)):
        return False
    return any(m != n for n, m in zip(shape, size))


def _shifted(x, axis: int, step: int):
    """x[i + step] along `axis` (step ±1), the edge voxel repeated past the volume's edge.

    A pad by one and a slice: XLA's partitioner exchanges one slab with the neighbour; the volume's own edge is
    filled from the voxel itself through an index mask, which every device computes from its own block.
    """
    n = x.shape[axis]
    padding = [(0, 0, 0)] * x.ndim
    padding[axis] = (-1, 1, 0) if step > 0 else (1, -1, 0)
    moved = jax.lax.pad(x, jnp.zeros((), x.dtype), padding)  # zero where it crossed the volume's edge
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    edge = index == (n - 1 if step > 0 else 0)
    return jnp.where(edge, x, moved)


def _interleave(phases, axis: int):
    """[y_0, ..., y_{f−1}], each (..., n, ...) -> (..., n·f, ...), y_r at positions f·i + r (within each block)."""
    stacked = jnp.stack(phases, axis=axis + 1)  # (..., n, f, ...)
    shape = list(phases[0].shape)
    shape[axis] *= len(phases)
    return jnp.reshape(stacked, shape)


def _upsample_axis(x, axis: int, factor: int, linear: bool):
    if not linear:  # nearest: each voxel repeated
        return _interleave([x] * factor, axis)
    before, after = _shifted(x, axis, -1), _shifted(x, axis, 1)
    phases = []
    for r in range(factor):
        delta = (r + 0.5) / factor - 0.5
        if delta < 0:
            phases.append(x * jnp.asarray(1 + delta, x.dtype) + before * jnp.asarray(-delta, x.dtype))
        elif delta > 0:
            phases.append(x * jnp.asarray(1 - delta, x.dtype) + after * jnp.asarray(delta, x.dtype))
        else:
            phases.append(x)
    return _interleave(phases, axis)


def resize(x, size, method):
    """`jax.image.resize(x, size, method)` for the cases `supported` accepts, axis by axis.

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(size=(1, 4, 6, 2)).astype("float32")
        >>> expected = jax.image.resize(x, (1, 8, 18, 2), "bilinear")
        >>> bool(np.allclose(resize(x, (1, 8, 18, 2), "bilinear"), expected, atol=1e-6))
        True
    """
    linear = _method_name(method) in LINEAR
    for axis, (n, m) in enumerate(zip(x.shape, size)):
        if m != n:
            x = _upsample_axis(x, axis, m // n, linear)
    return x
