"""A transposed convolution, computed as explicit interior padding and a stride-1 convolution: the same values, with
plain ops for the GPU's convolution kernels and for autodiff.

Keras's JAX backend lowers a transposed convolution to one input-dilated convolution (`lhs_dilation`), and its
gradients to more of them; XLA's GPU compiler computes those slowly (jax-ml/jax#31662: a 3D transposed convolution's
gradient in 48.6 ms against PyTorch's 1.9 ms). Writing the dilation out first (equinox's `ConvTranspose` since its
PR #1259, and XLA's own rewrite of window dilation, openxla/xla#32231) leaves a plain convolution:

    x_dilated = lax.pad(x, 0, (low, high, interior = stride − 1) per axis)
    y = conv(x_dilated, flip(W) with its channel axes swapped, stride 1, no padding, kernel dilation as given)

which is `lax.conv_transpose(x, W, strides, padding, rhs_dilation, transpose_kernel=True)` term for term (each
output voxel sums the same products; the inserted zeros add exact zeros). Autodiff differentiates it with standard
ops: the pad's gradient is a strided slice, the convolution's are a stride-1 convolution each.

Split in space, XLA's SPMD partitioner treats the interior padding as a windowed op (a halo exchange, as for a
convolution), so nothing is all-gathered. The output is computed in a multiple of each axis's split, as the
sub-pixel form's phases are (`subpixel.py`): an output that is not a multiple ("valid" with kernel 3, stride 2:
2n + 1) is padded past its far end and cropped, and XLA moves the few voxels by which the output's blocks differ from
the input's between neighbours (collective-permutes).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from trainer.parallel import conv_taps


def conv_transpose(inputs, kernel, strides, padding: Sequence[tuple[int, int]], dilation_rate=1,
                   channels_last: bool = True, output_multiples=1):
    """`lax.conv_transpose(inputs, kernel, strides, padding, rhs_dilation, transpose_kernel=True)` as Keras calls it,
    computed as interior padding and a stride-1 convolution.

    Args:
        inputs: (B, n..., C) (or (B, C, n...) with `channels_last=False`).
        kernel: Keras's (k..., filters, C).
        strides, dilation_rate: an int or one per spatial axis.
        padding: (low, high) per spatial axis, as `compute_conv_transpose_padding_args_for_jax` gives them.
        output_multiples: an int or one per spatial axis: the output is computed in a multiple of it (the split of
            that axis) and cropped to its length (see the module).

    Example (the same values as Keras's own op):
        >>> import keras
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(size=(1, 5, 6, 3)).astype("float32")
        >>> w = np.random.default_rng(1).normal(size=(3, 3, 4, 3)).astype("float32")
        >>> expected = keras.ops.conv_transpose(x, w, 2, padding="same")
        >>> padding = [(2, 1), (2, 1)]  # what Keras computes for kernel 3, stride 2, "same"
        >>> bool(np.allclose(conv_transpose(x, w, 2, padding), expected, atol=1e-5))
        True
    """
    if not channels_last:
        inputs = jnp.moveaxis(inputs, 1, -1)
    d = inputs.ndim - 2
    strides, dilation = conv_taps._per_axis(strides, d), conv_taps._per_axis(dilation_rate, d)
    multiples = conv_taps._per_axis(output_multiples, d)
    window = [(k - 1) * r + 1 for k, r in zip(kernel.shape[:d], dilation)]
    lengths = [(n - 1) * s + 1 + low + high - (w - 1)
               for n, s, (low, high), w in zip(inputs.shape[1:1 + d], strides, padding, window)]
    extra = [-length % multiple for length, multiple in zip(lengths, multiples)]  # zeros past the far end, cropped
    zero = jnp.zeros((), inputs.dtype)
    dilated = jax.lax.pad(inputs, zero, [(0, 0, 0), *((low, high + more, s - 1)
                                                      for (low, high), more, s in zip(padding, extra, strides)),
                                         (0, 0, 0)])  # (B, (n − 1)·s + 1 + low + high + extra..., C)
    flipped = jnp.swapaxes(jnp.flip(kernel, tuple(range(d))), -1, -2)  # (k..., C, filters)
    outputs = jax.lax.conv_general_dilated(dilated, flipped, (1,) * d, [(0, 0)] * d, rhs_dilation=dilation,
                                           dimension_numbers=conv_taps.SPECS[d])  # (B, length + extra..., filters)
    if any(extra):
        outputs = outputs[(slice(None), *(slice(0, length) for length in lengths))]
    return outputs if channels_last else jnp.moveaxis(outputs, -1, 1)
