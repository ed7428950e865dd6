"""A transposed convolution, computed as a stride-1 convolution and a depth-to-space: the same values, split without gathers.

XLA's SPMD partitioner splits a stride-1 convolution along any spatial axis
with a halo exchange, and a depth-to-space only splits each device's own block
of voxels; the input-dilated convolution a transposed convolution lowers to,
and its gradient, it splits by all-gathering the activation. The sub-pixel
identity (Shi et al., 2016) makes one the other, for any kernel, stride,
padding, output padding and kernel dilation:

    full[q·s + r] = Σ_m x[q − m] · W[r + m·s]          (one axis, stride s, Keras kernel W)

so each of the s output phases r is a stride-1 correlation of the low-resolution
input with ceil(k/s) taps of W. Padding (Keras's "same"/"valid", output padding)
shifts which phase an output position reads; the taps of every phase are laid
into one kernel of s^d × filters outputs, indexed by offset, and the phases are
interleaved back (depth-to-space). Where the output size is s times the input
size ("same", and "valid" with kernel <= stride) every device computes exactly
its own block of the output. Otherwise (kernel 3, stride 2, "valid": 2n + 1) the
phases are computed in a multiple of the axis's split (n + 1 rounded up: the
padding past the input's far end gives the extra ones), so the phase tensor and
its depth-to-space split evenly, and the far end is cropped off: XLA moves the
few voxels by which the output's blocks differ from the input's between
neighbours (collective-permutes), where n + 1 uneven phases made it all-gather
them split along two axes or more.

The kernel is rearranged inside the traced function by indexing (no arithmetic,
so exact on every accelerator): nothing is stored, and the layer's weights stay
the user's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _per_axis(value, spatial_dims: int) -> tuple[int, ...]:
    """An int or a sequence as one int per spatial axis."""
    return (int(value),) * spatial_dims if isinstance(value, int) else tuple(int(v) for v in value)


def phase_taps(size: int, stride: int, kernel: int, pad_low: int, pad_high: int):
    """The stride-1 correlation that gives one axis of a transposed convolution, phase by phase.

    Args:
        size: the input's length along the axis.
        stride, kernel: the transposed convolution's (`kernel` already dilated: (k − 1)·d + 1).
        pad_low, pad_high: the padding of its input-dilated form (what Keras passes `lax.conv_transpose`).

    Returns:
        (index, low, high, phases, length): `index[tap, phase]` is the kernel position each tap of each output
        phase reads (`kernel` where it reads nothing); `low`/`high` pad the input so that output position p
        reads input p + tap − low; `phases` is the output length before the crop, `length` after it.

    Example (kernel 2, stride 2, "valid": one tap, each phase one kernel position):
        >>> index, low, high, phases, length = phase_taps(4, 2, 2, 1, 1)
        >>> index.tolist(), low, high, phases, length
        ([[0, 1]], 0, 0, 4, 8)
    """
    crop = kernel - 1 - pad_low  # the output starts this far into the full (uncropped) scatter output
    length = (size - 1) * stride + 1 + pad_low + pad_high - (kernel - 1)
    phases = -(-length // stride)
    taps = {}  # phase -> [(offset into the input, kernel position)]
    for phase in range(stride):
        shift, residue = divmod(phase + crop, stride)
        taps[phase] = [(shift - m, residue + m * stride) for m in range(-(-(kernel - residue) // stride))]
    offsets = [offset for pairs in taps.values() for offset, _ in pairs] or [0]
    first, last = min(offsets), max(offsets)
    index = np.full((last - first + 1, stride), kernel, np.int32)  # (taps, phases); `kernel` reads the zero slot
    for phase, pairs in taps.items():
        for offset, position in pairs:
            index[offset - first, phase] = position
    return index, -first, phases - 1 + last - (size - 1), phases, length


def rearranged_kernel(kernel, indices: Sequence[np.ndarray]):
    """A Keras transposed-convolution kernel (k..., filters, in_channels) as the stride-1 kernel
    (taps..., in_channels, phases·filters), its outputs ordered (phase_1, ..., phase_d, filter)."""
    d = len(indices)
    kernel = jnp.pad(kernel, [(0, 1)] * d + [(0, 0), (0, 0)])  # a zero at position k of each axis
    for axis, index in enumerate(indices):  # (..., taps_i, phases_i, k_{i+1} + 1, ..., filters, in)
        kernel = jnp.take(kernel, jnp.asarray(index), axis=2 * axis)
    filters, channels = kernel.shape[-2], kernel.shape[-1]
    order = [2 * i for i in range(d)] + [2 * d + 1] + [2 * i + 1 for i in range(d)] + [2 * d]
    kernel = jnp.transpose(kernel, order)  # (taps..., in, phases..., filters)
    return jnp.reshape(kernel, (*kernel.shape[:d], channels, math.prod(kernel.shape[d + 1:d + 1 + d]) * filters))


def depth_to_space(x, factors: Sequence[int]):
    """(B, n_1, ..., n_d, f_1·...·f_d·F) -> (B, n_1·f_1, ..., n_d·f_d, F), channels ordered (f_1, ..., f_d, F).

    Only splits and merges dimensions within each voxel's block, so a spatially split array needs no exchange.
    """
    d = len(factors)
    batch, spatial, filters = x.shape[0], x.shape[1:1 + d], x.shape[-1] // math.prod(factors)
    x = jnp.reshape(x, (batch, *spatial, *factors, filters))  # (B, n..., f..., F)
    order = [0] + [axis for i in range(d) for axis in (1 + i, 1 + d + i)] + [1 + 2 * d]
    x = jnp.transpose(x, order)  # (B, n_1, f_1, ..., n_d, f_d, F)
    return jnp.reshape(x, (batch, *(n * f for n, f in zip(spatial, factors)), filters))


def conv_transpose(inputs, kernel, strides, padding: Sequence[tuple[int, int]], dilation_rate=1,
                   channels_last: bool = True, phase_multiples=1):
    """`lax.conv_transpose(inputs, kernel, strides, padding, rhs_dilation, transpose_kernel=True)` as Keras calls it,
    computed as a stride-1 convolution and a depth-to-space.

    Args:
        inputs: (B, n..., C) (or (B, C, n...) with `channels_last=False`).
        kernel: Keras's (k..., filters, C).
        strides, dilation_rate: an int or one per spatial axis.
        padding: (low, high) per spatial axis, as `compute_conv_transpose_padding_args_for_jax` gives them.
        phase_multiples: an int or one per spatial axis: the low-resolution phases are computed in a multiple of
            it (the split of that axis), the extra ones cropped with the output's far end (see the module).

    Example (the same values as Keras's own op):
        >>> import keras
        >>> x = np.random.default_rng(0).normal(size=(1, 5, 6, 3)).astype("float32")
        >>> w = np.random.default_rng(1).normal(size=(3, 3, 4, 3)).astype("float32")
        >>> expected = keras.ops.conv_transpose(x, w, 2, padding="same")
        >>> padding = [(2, 1), (2, 1)]  # what Keras computes for kernel 3, stride 2, "same"
        >>> bool(np.allclose(conv_transpose(x, w, 2, padding), expected, atol=1e-5))
        True
    """
    if not channels_last:
        rank = inputs.ndim
        inputs = jnp.moveaxis(inputs, 1, rank - 1)
    d = inputs.ndim - 2
    strides, dilation, multiples = _per_axis(strides, d), _per_axis(dilation_rate, d), _per_axis(phase_multiples, d)
    if any(r > 1 for r in dilation):  # the dilated kernel, written out: W at every r-th position
        dilated = jnp.zeros((*((k - 1) * r + 1 for k, r in zip(kernel.shape[:d], dilation)), *kernel.shape[d:]),
                            kernel.dtype)
        kernel = dilated.at[tuple(slice(None, None, r) for r in dilation)].set(kernel)
    axes = [phase_taps(n, s, k, low, high)
            for n, s, k, (low, high) in zip(inputs.shape[1:1 + d], strides, kernel.shape[:d], padding)]
    stride_one = rearranged_kernel(kernel, [index for index, *_ in axes])
    spec = ("NHWC", "HWIO", "NHWC") if d == 2 else ("NDHWC", "DHWIO", "NDHWC") if d == 3 else ("NWC", "WIO", "NWC")
    # Phases beyond the output's (up to a multiple) come from the padding past the input's far end.
    extra = [-phases % multiple for (*_, phases, _), multiple in zip(axes, multiples)]
    phased = jax.lax.conv_general_dilated(inputs, stride_one, (1,) * d,
                                          [(low, high + more) for (_, low, high, *_), more in zip(axes, extra)],
                                          dimension_numbers=spec)  # (B, phases..., s^d·F), phases a multiple
    outputs = depth_to_space(phased, strides)
    lengths = [length for *_, length in axes]
    if any(length != (phases + more) * s for (*_, phases, length), more, s in zip(axes, extra, strides)):
        outputs = outputs[(slice(None), *(slice(0, length) for length in lengths))]
    return outputs if channels_last else jnp.moveaxis(outputs, -1, 1)
