"""The Keras ops XLA would all-gather when split in space, computed on each device's block instead, behind the user's
unchanged layers and weights.

Keras's JAX backend lowers a transposed convolution (`Conv2DTranspose`,
`Conv3DTranspose`, `keras.ops.conv_transpose`) to an input-dilated convolution,
and an interpolating resize (`UpSampling2D(interpolation="bilinear")`,
`keras.ops.image.resize`, `jax.image.resize`) to dense per-axis weight
matrices; split in space, XLA computes both (or their gradients) on the whole
activation, all-gathered onto every device. While a model is traced under a
spatial split, those ops are computed by exactly equivalent formulations that
split with halo exchanges only: `subpixel.conv_transpose` (a stride-1
convolution and a depth-to-space) and `interpolation.resize` (a fixed 3-tap
stencil per axis and an interleave; integer factors, linear and nearest).
Global attention (Keras's `dot_product_attention`, which `MultiHeadAttention`
calls, and `MultiHeadAttention` over a grid of tokens), whose keys and values
XLA would all-gather, is `ring_attention`'s: keys and values passed round the
devices that hold the tokens, over the split's mesh.

Under a split means: inside fullres's own compiled programs for a split layout
(`splitting`: training's step, `fullres plan`, evaluation and `fullres predict`),
or with a `fullres.SpatialParallel` that splits space set as Keras's
distribution (`model.fit`, `model.predict`). Anywhere else the ops are Keras's
and JAX's own, call for call. Nothing is stored: `model.keras` holds the user's
layers and weights, and plain Keras loads it and computes the same outputs.
"""

from __future__ import annotations

import contextlib
import contextvars

_SPLITTING = contextvars.ContextVar("fullres_splitting", default=())  # input_partition_dims while `splitting`
_MESH = contextvars.ContextVar("fullres_split_mesh", default=None)  # the jax Mesh of the split, where `splitting` has one
_ORIGINAL = {}  # what `install` replaced: name -> the original function
_SUBPIXEL_EVERYWHERE = contextvars.ContextVar("fullres_subpixel_everywhere", default=False)


def partition_dims() -> tuple[int, ...]:
    """The `input_partition_dims` a model is traced under: `splitting`'s, else a `SpatialParallel` set as Keras's
    distribution's (read by its config: that module imports this one); () where neither is set."""
    if _SPLITTING.get():
        return _SPLITTING.get()
    import keras

    dims = getattr(getattr(keras.distribution.distribution(), "config", None), "input_partition_dims", ())
    return tuple(dims) if isinstance(dims, tuple) else ()  # not "auto": a distribution's dims are resolved


def active() -> bool:
    """True while a model is traced under a spatial split (`splitting`, or a splitting `SpatialParallel` set as
    Keras's distribution)."""
    return any(parts > 1 for parts in partition_dims()[1:-1])


def spatial_parts(spatial_dims: int) -> tuple[int, ...]:
    """How many ways each of an activation's `spatial_dims` axes is split: the split of the input's axis, or, for an
    activation of another rank than the input, the least common multiple of all of them on every axis (divisible
    whichever axis it is)."""
    import math

    parts = partition_dims()[1:-1] or (1,)
    return tuple(parts) if len(parts) == spatial_dims else (math.lcm(*parts),) * spatial_dims


def split_of(spatial_dims: int) -> tuple[int, ...]:
    """How many ways each spatial axis of an activation traced now is split: `spatial_parts` under a split, 1s
    otherwise."""
    return spatial_parts(spatial_dims) if active() else (1,) * spatial_dims


def mesh():
    """The `jax.sharding.Mesh` the traced model is split over (`splitting`'s, else a splitting `SpatialParallel`'s);
    None where none is known (a shape-only trace), and the ops that need one (ring attention) are then Keras's."""
    if not active():
        return None
    if _MESH.get() is not None:
        return _MESH.get()
    import keras

    distribution = keras.distribution.distribution()
    if getattr(distribution, "config", None) is None:
        return None
    return distribution.device_mesh.backend_mesh


@contextlib.contextmanager
def splitting(input_partition_dims, device_mesh=None):
    """Traces what runs inside with the split formulations, for a layout split as `input_partition_dims` (one
    integer per dimension of the features, channels last; a 1-way layout keeps Keras's own ops) over `device_mesh`
    (a `jax.sharding.Mesh` or a `keras.distribution.DeviceMesh`; None: shapes only, attention stays Keras's)."""
    install()
    token = _SPLITTING.set(tuple(int(parts) for parts in input_partition_dims))
    mesh_token = _MESH.set(getattr(device_mesh, "backend_mesh", device_mesh))
    try:
        yield
    finally:
        _MESH.reset(mesh_token)
        _SPLITTING.reset(token)


@contextlib.contextmanager
def subpixel_everywhere(enabled: bool = True):
    """Traces what runs inside with every transposed convolution sub-pixel, split or not (`kernels.conv_transpose`)."""
    install()
    token = _SUBPIXEL_EVERYWHERE.set(enabled)
    try:
        yield
    finally:
        _SUBPIXEL_EVERYWHERE.reset(token)


def traced_split(function, input_partition_dims, device_mesh=None):
    """`function`, tracing its body under `splitting(input_partition_dims, device_mesh)`: what fullres jits for a
    layout (same name, so the compiled program's op names read as before)."""
    import functools

    @functools.wraps(function)
    def traced(*args, **kwargs):
        with splitting(input_partition_dims, device_mesh):
            return function(*args, **kwargs)

    return traced


def _conv_transpose(inputs, kernel, strides=1, padding="valid", output_padding=None, data_format=None,
                    dilation_rate=1):
    """Keras's JAX `conv_transpose`, as `subpixel.conv_transpose` under a split or `subpixel_everywhere` (or where
    the run's measured kernel choice names it: `kernel_layers.chosen`)."""
    from trainer.parallel import kernel_layers

    original = _ORIGINAL["conv_transpose"]
    value = kernel_layers.chosen("transposed convolution", inputs, kernel, {
        "strides": strides, "padding": padding, "output_padding": output_padding, "data_format": data_format,
        "dilation_rate": dilation_rate}, split_of(len(inputs.shape) - 2))
    if not active() and (value or ("subpixel" if _SUBPIXEL_EVERYWHERE.get() else "xla")) != "subpixel":
        return original(inputs, kernel, strides, padding, output_padding, data_format, dilation_rate)
    from keras.src import backend
    from keras.src.backend.common import backend_utils
    from keras.src.backend.jax import core

    from trainer.parallel import subpixel

    data_format = backend.standardize_data_format(data_format)
    inputs, kernel = core.convert_to_tensor(inputs), core.convert_to_tensor(kernel)
    backend_utils.check_conv_transpose_input_channels(inputs, kernel, data_format)
    shape = inputs.shape if data_format == "channels_last" else (inputs.shape[0], *inputs.shape[2:], inputs.shape[1])
    padding_values = backend_utils.compute_conv_transpose_padding_args_for_jax(
        input_shape=shape, kernel_shape=kernel.shape, strides=strides, padding=padding,
        output_padding=output_padding, dilation_rate=dilation_rate)
    # Phases in a multiple of each axis's split: the phase tensor then splits evenly, and its depth-to-space is each
    # device's own (an output that is not stride × the input, e.g. "valid" with kernel 3, stride 2, otherwise
    # all-gathered it split 2×2).
    return subpixel.conv_transpose(inputs, kernel, strides, padding_values, dilation_rate,
                                   channels_last=data_format == "channels_last",
                                   phase_multiples=spatial_parts(len(shape) - 2))


def _resize(image, shape, method, antialias=True, precision=None):
    """`jax.image.resize`, as `interpolation.resize` under a split where that computes it exactly."""
    from trainer.parallel import interpolation

    original = _ORIGINAL["resize"]
    if active() and interpolation.supported(image.shape, shape, method):
        return interpolation.resize(image, tuple(shape), method)
    if precision is None:
        return original(image, shape, method, antialias)
    return original(image, shape, method, antialias, precision)


def _dot_product_attention(query, key, value, bias=None, mask=None, scale=None, is_causal=False,
                           flash_attention=None, attn_logits_soft_cap=None):
    """Keras's JAX `dot_product_attention` (`keras.ops.dot_product_attention`, `MultiHeadAttention`), as
    `ring_attention.dot_product_attention` under a split where that computes it."""
    from trainer.parallel import ring_attention

    split_mesh = mesh()
    if attn_logits_soft_cap is None and ring_attention.supported(split_mesh, query, key, value, bias, mask):
        return ring_attention.dot_product_attention(split_mesh, query, key, value, bias, mask, scale, is_causal)
    return _ORIGINAL["dot_product_attention"](query, key, value, bias, mask, scale, is_causal, flash_attention,
                                              attn_logits_soft_cap)


def _compute_attention(layer, query, key, value, attention_mask=None, training=None, return_attention_scores=False,
                       use_causal_mask=False):
    """`MultiHeadAttention._compute_attention`; over a grid of tokens laid out as the split volume (`attention_axes`
    some or all of its spatial axes, one of them split), as `ring_attention.grid_attention` under a split."""
    from trainer.parallel import ring_attention

    split_mesh = mesh()
    plain = attention_mask is None and not use_causal_mask and not return_attention_scores and (
        layer._dropout == 0.0 or not training)
    if plain and ring_attention.grid_supported(split_mesh, query, key, value, layer._attention_axes,
                                               len(partition_dims()) - 2):
        output = ring_attention.grid_attention(split_mesh, query, key, value, layer._inverse_sqrt_key_dim,
                                               len(partition_dims()) - 2, layer._attention_axes)
        return output, None
    return _ORIGINAL["compute_attention"](layer, query, key, value, attention_mask=attention_mask, training=training,
                                          return_attention_scores=return_attention_scores,
                                          use_causal_mask=use_causal_mask)


def install() -> None:
    """Routes Keras's JAX `conv_transpose`, `dot_product_attention`, `MultiHeadAttention`'s attention and
    `jax.image.resize` through the split formulations (once; they act only while `active`)."""
    if _ORIGINAL:
        return
    import jax
    import keras
    from keras.src.backend.jax import nn

    _ORIGINAL["conv_transpose"] = nn.conv_transpose
    _ORIGINAL["resize"] = jax.image.resize
    _ORIGINAL["dot_product_attention"] = nn.dot_product_attention
    _ORIGINAL["compute_attention"] = keras.layers.MultiHeadAttention._compute_attention
    nn.conv_transpose = _conv_transpose
    jax.image.resize = _resize
    nn.dot_product_attention = _dot_product_attention
    keras.layers.MultiHeadAttention._compute_attention = _compute_attention
