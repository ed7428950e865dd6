"""A convolution whose weight gradient is one matrix product per kernel tap: what cuDNN and XLA compute slowly for 3D
convolutions in bfloat16 (openxla/xla#34273: over 30× PyTorch's), as plain products that any GEMM kernel computes.

For a convolution y = conv(x, W) (channels last, stride s, dilation r, padding p), the weight's gradient at kernel
tap t (one position of the d-dimensional kernel) is

    dW[t] = Σ_{b, o}  x_pad[b, o·s + t·r] ⊗ dy[b, o]          a (C_in, C_out) matrix product over batch and space

so each tap is a strided slice of the padded input (the same shape as dy, C_in channels) contracted with dy over
every axis but the channels: k^d matrix products of (C_in × N)·(N × C_out), N = batch × output voxels, in the
operands' dtype with float32 accumulation (at least: float64 stays float64). The forward pass and the input's
gradient are XLA's own convolution and its transpose, call for call. Split in space, each slice is the device's
own block and a halo (as for the convolution itself), and each product's partial sum over the device's voxels is
all-reduced: a (C_in, C_out) matrix per tap, never an activation.

The same convolution carries the other weight-gradient candidate, `method="float32"`: XLA's own weight gradient
(the convolution of the input with the output's gradient), its operands cast up to float32 and its result cast back
to the kernel's dtype. Under mixed precision XLA otherwise computes it as a bfloat16 convolution, the case its GPU
compiler is slowest at (openxla/xla#34273: 41.3 ms against 0.46 ms); in float32 it is a different cuDNN call, and
the value is the same up to bfloat16's rounding of the result. It costs a float32 copy of the input and of the output's
gradient while the gradient is computed (PlainConvUNet at 32³ for an H100: 1.73 MiB, +37.5% of the step's temp
bytes; docs/speed.md); in float32 and float64 steps the casts are no-ops, XLA's own program.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp

SPECS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _per_axis(value, spatial_dims: int) -> tuple[int, ...]:
    return (int(value),) * spatial_dims if isinstance(value, int) else tuple(int(v) for v in value)


def keras_conv(inputs, kernel, strides=1, padding="valid", dilation_rate=1, method="taps"):
    """Keras's JAX `conv` (channels last, no groups) with the weight gradient `method` computes.

    Args:
        inputs: (B, n..., C_in); converted to the kernel's dtype as Keras does.
        kernel: (k..., C_in, C_out).
        strides, dilation_rate: an int or one per spatial axis; padding: "same" or "valid".
        method: "taps" (one product per kernel tap) or "float32" (XLA's, in at least float32).
    """
    from keras.src.backend.jax import core

    kernel = core.convert_to_tensor(kernel)
    inputs = core.convert_to_tensor(inputs, dtype=kernel.dtype)
    d = inputs.ndim - 2
    strides, dilation = _per_axis(strides, d), _per_axis(dilation_rate, d)
    window = [(k - 1) * r + 1 for k, r in zip(kernel.shape[:d], dilation)]
    pads = jax.lax.padtype_to_pads(inputs.shape[1:1 + d], window, strides, padding.upper())
    return conv(inputs, kernel, strides, tuple(tuple(int(p) for p in pair) for pair in pads), dilation, method)


def _forward(x, w, strides, padding, dilation):
    return jax.lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation,
                                        dimension_numbers=SPECS[x.ndim - 2])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def conv(x, w, strides: tuple[int, ...], padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...],
         method: str = "taps"):
    """`lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation)`, channels last, whose gradient with
    respect to `w` is `weight_gradient` (per tap; `method="float32"`: `wide_weight_gradient`); the value and the
    input's gradient are XLA's.

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(size=(2, 6, 6, 3)).astype("float32")
        >>> w = np.random.default_rng(1).normal(size=(3, 3, 3, 4)).astype("float32")
        >>> ours = jax.grad(lambda w: conv(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1)).sum())(w)
        >>> xlas = jax.grad(lambda w: _forward(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1)).sum())(w)
        >>> bool(np.allclose(ours, xlas, rtol=1e-5, atol=1e-5))
        True
    """
    return _forward(x, w, strides, padding, dilation)


def _conv_forward(x, w, strides, padding, dilation, method):
    return _forward(x, w, strides, padding, dilation), (x, w)


def _conv_backward(strides, padding, dilation, method, residuals, gradient):
    x, w = residuals
    _, input_vjp = jax.vjp(lambda inputs: _forward(inputs, w, strides, padding, dilation), x)
    (input_gradient,) = input_vjp(gradient)  # XLA's own transpose of the convolution
    if method == "float32":
        return input_gradient, wide_weight_gradient(x, gradient, w, strides, padding, dilation).astype(w.dtype)
    return input_gradient, weight_gradient(x, gradient, w.shape, strides, padding, dilation).astype(w.dtype)


conv.defvjp(_conv_forward, _conv_backward)


def wide_weight_gradient(x, gradient, w, strides, padding, dilation):
    """XLA's gradient of `conv(x, w)` with respect to `w`, its operands cast up to at least float32: (k..., C_in,
    C_out) in that dtype (the caller casts it to the kernel's)."""
    wide = jnp.promote_types(x.dtype, jnp.float32)
    x = x.astype(wide)
    transpose = jax.linear_transpose(lambda kernel: _forward(x, kernel, strides, padding, dilation),
                                     jax.ShapeDtypeStruct(w.shape, wide))  # the convolution's, as a map of w
    (kernel_gradient,) = transpose(gradient.astype(wide))
    return kernel_gradient


def weight_gradient(x, gradient, kernel_shape, strides, padding, dilation):
    """The gradient of `conv(x, w)` with respect to `w`, given the output's gradient: one product per tap.

    Args:
        x: the input, (B, n..., C_in).
        gradient: the output's gradient, (B, m..., C_out).
        kernel_shape: (k..., C_in, C_out).
        strides, padding, dilation: the convolution's, one per spatial axis ((low, high) pairs for padding).

    Returns:
        (k..., C_in, C_out) in float32 or wider (the caller casts it to the kernel's dtype).
    """
    d = x.ndim - 2
    accumulate = jnp.promote_types(x.dtype, jnp.float32)
    # Negative padding (a crop) never arises from "same"/"valid"; lax.pad takes both.
    x = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *((low, high, 0) for low, high in padding), (0, 0, 0)])
    out = gradient.shape[1:1 + d]
    spatial = "".join("dhw"[-d:])  # einsum letters of the spatial axes
    products = []
    for tap in itertools.product(*(range(k) for k in kernel_shape[:d])):
        start = [t * r for t, r in zip(tap, dilation)]
        limit = [first + (m - 1) * s + 1 for first, m, s in zip(start, out, strides)]
        shifted = jax.lax.slice(x, (0, *start, 0), (x.shape[0], *limit, x.shape[-1]),
                                (1, *strides, 1))  # (B, m..., C_in): what tap t reads for every output voxel
        products.append(jnp.einsum(f"b{spatial}i,b{spatial}o->io", shifted, gradient,
                                   preferred_element_type=accumulate))  # (C_in, C_out)
    stacked = jnp.stack(products)  # (k_1·...·k_d, C_in, C_out), taps in row-major kernel order
    return jnp.reshape(stacked, (*kernel_shape[:d], math.prod(kernel_shape[d:d + 1]), kernel_shape[-1]))
