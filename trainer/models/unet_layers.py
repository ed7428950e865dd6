"""The layers of fullres's UNets: convolution blocks, the space-to-depth fold and sub-pixel upsampling.

Every one is a plain convolution, normalization, reshape or transpose on
channels-last tensors, so XLA's SPMD partitioner splits it along the spatial
dimensions with halo exchange at most (the fold and the unfold need none: each
device folds its own blocks). `unet` and `residual_unet` build networks of them.
"""

from __future__ import annotations

import math

import jax
import keras


@keras.saving.register_keras_serializable(package="fullres")
class FlatGlorotUniform(keras.initializers.GlorotUniform):
    """Keras's `glorot_uniform`, value for value, drawn as one flat vector and reshaped to the kernel's shape.

    Every random draw Keras makes on JAX is a program compiled for its shape, and JAX's default (partitionable)
    threefry compiles slowly on XLA:CPU for a many-dimensional shape: on this 2-core machine a (3, 3, 3, 4, 8)
    kernel took 6.7 s to compile, its 864 values drawn flat 0.38 s, and building the 2-level smoke UNet spent
    16 of its 22 s compiling its initializers (fresh cache). A flat draw gives the same values (partitionable
    threefry counts elements in row-major order), so runs, checkpoints and seeds are unchanged.

    Example:
        >>> import numpy as np
        >>> keras.utils.set_random_seed(3)
        >>> flat = np.asarray(FlatGlorotUniform()((3, 3, 3, 2, 4)))
        >>> keras.utils.set_random_seed(3)
        >>> bool(np.array_equal(flat, np.asarray(keras.initializers.GlorotUniform()((3, 3, 3, 2, 4)))))
        True
    """

    def __call__(self, shape, dtype=None):
        shape = tuple(int(n) for n in shape)
        if len(shape) >= 2:  # a kernel (..., inputs, outputs), as Keras counts its fans
            receptive = math.prod(shape[:-2])
            fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        else:
            fan_in = fan_out = shape[0] if shape else 1
        limit = math.sqrt(3.0 * self.scale / max(1.0, (fan_in + fan_out) / 2.0))
        flat = keras.random.uniform((math.prod(shape),), minval=-limit, maxval=limit, dtype=dtype, seed=self.seed)
        return keras.ops.reshape(flat, shape)


def conv_layer(spatial_dims: int, filters: int, kernel_size: int, **kwargs) -> keras.layers.Layer:
    """`Conv3D` or `Conv2D` with `FlatGlorotUniform` kernels (Keras's default values, compiled in a fraction of the
    time): every convolution of fullres's UNets."""
    conv = keras.layers.Conv3D if spatial_dims == 3 else keras.layers.Conv2D
    return conv(filters, kernel_size, kernel_initializer=FlatGlorotUniform(), **kwargs)


def normalization_layer(normalization: str, name: str, dtype):
    """The normalization layer `normalization` names (None for "none"), as every fullres UNet block uses it."""
    if normalization == "instance":
        # One group per channel: statistics over the spatial dims of each example.
        return keras.layers.GroupNormalization(groups=-1, epsilon=1e-5, name=name, dtype=dtype)
    if normalization == "group":
        return keras.layers.GroupNormalization(groups=8, epsilon=1e-5, name=name, dtype=dtype)
    if normalization == "batch":
        return keras.layers.BatchNormalization(epsilon=1e-5, name=name, dtype=dtype)
    return None


@keras.saving.register_keras_serializable(package="fullres")
class ConvBlock(keras.layers.Layer):
    """Two (convolution 3 → normalization → ReLU) steps: one UNet level's work.

    A layer of its own so that rematerialization can treat the block as a unit:
    only its input is kept for the backward pass, everything inside is recomputed.

    Example:
        >>> import numpy as np
        >>> block = ConvBlock(filters=8, spatial_dims=3, normalization="instance")
        >>> tuple(block(np.zeros((1, 4, 4, 4, 2), "float32")).shape)
        (1, 4, 4, 4, 8)
    """

    def __init__(self, filters: int, spatial_dims: int, normalization: str, remat: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.spatial_dims, self.normalization = filters, spatial_dims, normalization
        self.remat = remat
        self.steps = []
        for i in (1, 2):
            self.steps.append(conv_layer(spatial_dims, filters, 3, padding="same", use_bias=normalization == "none",
                                         name=f"conv{i}", dtype=self.dtype_policy))
            norm = normalization_layer(normalization, f"norm{i}", self.dtype_policy)
            if norm is not None:
                self.steps.append(norm)
            self.steps.append(keras.layers.ReLU(name=f"relu{i}", dtype=self.dtype_policy))

    def build(self, input_shape):
        shape = input_shape
        for layer in self.steps:
            layer.build(shape)
            shape = layer.compute_output_shape(shape)

    def call(self, x, training=None):
        def forward(x):
            for layer in self.steps:
                x = layer(x, training=training) if isinstance(layer, keras.layers.BatchNormalization) else layer(x)
            return x

        # jax.checkpoint keeps only the block's input for the backward pass. (Keras's
        # RematScope marked the layers but, measured on this step, recomputed only
        # part of them.) On XLA:CPU the compiled step's temp memory does not shrink
        # with it (README, "Memory"); the recomputation is in the compiled module.
        return jax.checkpoint(forward)(x) if self.remat else forward(x)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "spatial_dims": self.spatial_dims,
                "normalization": self.normalization, "remat": self.remat}


def space_to_depth(x, spatial_dims: int):
    """(B, D, H, W, C) -> (B, D/2, H/2, W/2, 8C): each 2×2(×2) block's voxels, in (d, h, w) order, become channels.

    Only reshapes within a block and a transpose, so a spatially split array is folded on each device in place.
    """
    d = spatial_dims
    shape = keras.ops.shape(x)
    batch, halves, channels = shape[0], [n // 2 for n in shape[1 : 1 + d]], shape[-1]
    x = keras.ops.reshape(x, (batch, *(v for n in halves for v in (n, 2)), channels))  # (B, D/2, 2, H/2, 2, ..., C)
    order = [0] + [1 + 2 * i for i in range(d)] + [2 + 2 * i for i in range(d)] + [1 + 2 * d]
    x = keras.ops.transpose(x, order)  # (B, D/2, H/2, W/2, 2, 2, 2, C)
    return keras.ops.reshape(x, (batch, *halves, channels * 2**d))


def depth_to_space(x, spatial_dims: int):
    """The inverse of `space_to_depth`: (B, D, H, W, 8F) -> (B, 2D, 2H, 2W, F)."""
    d = spatial_dims
    shape = keras.ops.shape(x)
    batch, spatial, filters = shape[0], shape[1 : 1 + d], shape[-1] // 2**d
    x = keras.ops.reshape(x, (batch, *spatial, *([2] * d), filters))  # (B, D, H, W, 2, 2, 2, F)
    # Interleave each spatial axis with its factor 2: (B, D, 2, H, 2, W, 2, F).
    order = [0] + [axis for i in range(d) for axis in (1 + i, 1 + d + i)] + [1 + 2 * d]
    x = keras.ops.transpose(x, order)
    return keras.ops.reshape(x, (batch, *(2 * n for n in spatial), filters))


@keras.saving.register_keras_serializable(package="fullres")
class SubpixelUpsampling(keras.layers.Layer):
    """Doubles every spatial size: a 1×1 convolution to 2^d × filters channels, then depth-to-space.

    The same function family (and parameter count) as a transposed convolution
    with kernel 2 and stride 2, written so that it partitions: XLA compiles the
    gradient of a spatially partitioned `Conv3DTranspose` into all-gathers of the
    full-resolution activation, while this layer's reshape only splits
    dimensions within each device's block and needs no communication at all.

    Example:
        >>> import numpy as np
        >>> layer = SubpixelUpsampling(filters=8, spatial_dims=3)
        >>> tuple(layer(np.zeros((1, 4, 5, 6, 16), "float32")).shape)
        (1, 8, 10, 12, 8)
    """

    def __init__(self, filters: int, spatial_dims: int, **kwargs):
        super().__init__(**kwargs)
        if spatial_dims not in (2, 3):
            raise ValueError(f"SubpixelUpsampling.spatial_dims must be 2 or 3, got {spatial_dims}.")
        self.filters, self.spatial_dims = filters, spatial_dims
        self.projection = conv_layer(spatial_dims, filters * 2**spatial_dims, 1, name="projection",
                                     dtype=self.dtype_policy)

    def build(self, input_shape):
        self.projection.build(input_shape)

    def call(self, x):
        return depth_to_space(self.projection(x), self.spatial_dims)

    def compute_output_shape(self, input_shape):
        spatial = tuple(None if n is None else 2 * n for n in input_shape[1:-1])
        return (input_shape[0], *spatial, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "spatial_dims": self.spatial_dims}


@keras.saving.register_keras_serializable(package="fullres")
class SpaceToDepth(keras.layers.Layer):
    """Halves every spatial size by folding each 2×2(×2) block of voxels into channels.

    `space_to_depth` as a layer, the inverse of `SubpixelUpsampling`'s reshape.
    Each device's block of a spatially split input is folded in place, so the
    layer needs no communication.

    Example:
        >>> import numpy as np
        >>> tuple(SpaceToDepth(spatial_dims=3)(np.zeros((1, 4, 6, 8, 1), "float32")).shape)
        (1, 2, 3, 4, 8)
    """

    def __init__(self, spatial_dims: int, **kwargs):
        super().__init__(**kwargs)
        if spatial_dims not in (2, 3):
            raise ValueError(f"SpaceToDepth.spatial_dims must be 2 or 3, got {spatial_dims}.")
        self.spatial_dims = spatial_dims

    def call(self, x):
        return space_to_depth(x, self.spatial_dims)

    def compute_output_shape(self, input_shape):
        spatial = tuple(None if n is None else n // 2 for n in input_shape[1:-1])
        channels = None if input_shape[-1] is None else input_shape[-1] * 2**self.spatial_dims
        return (input_shape[0], *spatial, channels)

    def get_config(self):
        return {**super().get_config(), "spatial_dims": self.spatial_dims}
