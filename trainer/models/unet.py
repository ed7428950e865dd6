"""A UNet for 2D images and 3D volumes (one network, `spatial_dims` 2 or 3).

Every layer is a plain convolution, pooling or sub-pixel upsampling on
channels-last tensors, so XLA's SPMD partitioner can split every activation
along its spatial dimensions with only halo exchange between neighbours — in
the backward pass too (see `SubpixelUpsampling`).
"""

from __future__ import annotations

import dataclasses

import jax
import keras

NORMALIZATIONS = ("instance", "group", "batch", "none")
STEMS = ("none", "space_to_depth")
# The default model until 2026-11-25, as `--set` settings: 4 levels of 16-128 filters, no stem. The CPU, H100 and
# layout-search benchmarks recorded before then measured it, and pin it so that their results stay reproducible.
PLAIN_SETTINGS = {"model.stem": "none", "model.num_levels": 4, "model.base_filters": 16}


@dataclasses.dataclass(frozen=True)
class UNetConfig:
    """Architecture of the UNet. The defaults are fullres's default model, shaped for TPUs.

    The default folds 2×2×2 voxels into channels (`stem="space_to_depth"`) and
    runs 3 levels of 128, 256 and 512 filters at 1/2, 1/4 and 1/8 of the
    input's resolution: the same bottleneck resolution as a 4-level UNet
    without the stem, and every activation at least 128 channels wide, so a
    TPU's 128-lane tiles are full (docs/partitioning-and-planning.md: 1.76 GiB
    per v5e core at 256³ split 16 ways, against 8.52 GiB for 4 levels of
    16-128 filters without the stem). It has 21.7 M parameters and costs about
    8× the flops of that plain UNet, which TPUs spend anyway on padded lanes; on
    CPUs and GPUs `stem="none", num_levels=4, base_filters=16` is cheaper.

    Args:
        spatial_dims: 2 for images (NHWC), 3 for volumes (NDHWC).
        num_classes: output classes including background (class 0).
        in_channels: input channels (1 for CT).
        num_levels: resolution levels (the "depth" of the UNet); the model
            downsamples `num_levels - 1` times (once more with the stem), so every
            spatial size must divide by `2 ** downsampling_levels` times its
            partition count.
        base_filters: filters at the first level, doubled at each level below.
        normalization: "instance" (default; right for the per-core batch of 1
            that large volumes force), "group" (8 groups), "batch" or "none".
        stem: "none" (the first level works at the input's resolution) or
            "space_to_depth": 2×2(×2) blocks of voxels are folded into channels
            before the first level and the logits unfolded after the last, so
            every level works at half resolution with 2^d times the channels
            per position. TPUs tile an array's channel axis to 128 lanes: a
            16-channel full-resolution activation takes 8× its size there, a
            128-channel half-resolution one (the same bytes) 1×. Spatial
            sizes must then divide by one more factor of 2.

    Example:
        >>> config = UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=8)
        >>> model = build_unet(config)
        >>> model.output_shape
        (None, None, None, None, 3)
        >>> config.downsampling_levels, UNetConfig(stem="none").downsampling_levels
        (3, 2)
    """

    spatial_dims: int = 3
    num_classes: int = 3
    in_channels: int = 1
    num_levels: int = 3
    base_filters: int = 128
    normalization: str = "instance"
    stem: str = "space_to_depth"

    def __post_init__(self):
        if self.spatial_dims not in (2, 3):
            raise ValueError(f"UNetConfig.spatial_dims must be 2 or 3, got {self.spatial_dims}.")
        if self.num_classes < 2:
            raise ValueError(f"UNetConfig.num_classes must be >= 2 (background + one class), got {self.num_classes}.")
        if self.in_channels < 1:
            raise ValueError(f"UNetConfig.in_channels must be >= 1, got {self.in_channels}.")
        if self.num_levels < 1:
            raise ValueError(f"UNetConfig.num_levels must be >= 1, got {self.num_levels}.")
        if self.base_filters < 1:
            raise ValueError(f"UNetConfig.base_filters must be >= 1, got {self.base_filters}.")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"UNetConfig.normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}.")
        if self.stem not in STEMS:
            raise ValueError(f"UNetConfig.stem must be one of {STEMS}, got {self.stem!r}.")
        if self.normalization == "group" and self.base_filters % 8 != 0:
            raise ValueError(
                f"UNetConfig.normalization='group' uses 8 groups, so base_filters must be a multiple of 8, "
                f"got {self.base_filters}."
            )

    @property
    def downsampling_levels(self) -> int:
        """How many times each spatial size is halved on the way down (the stem's fold counts as one)."""
        return self.num_levels - 1 + (self.stem == "space_to_depth")


def _normalization(normalization: str, name: str, dtype):
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
        conv = keras.layers.Conv3D if spatial_dims == 3 else keras.layers.Conv2D
        self.steps = []
        for i in (1, 2):
            self.steps.append(conv(filters, 3, padding="same", use_bias=normalization == "none", name=f"conv{i}",
                                   dtype=self.dtype_policy))
            norm = _normalization(normalization, f"norm{i}", self.dtype_policy)
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
        conv = keras.layers.Conv3D if spatial_dims == 3 else keras.layers.Conv2D
        self.projection = conv(filters * 2**spatial_dims, 1, name="projection", dtype=self.dtype_policy)

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


def build_unet(config: UNetConfig, dtype: str | None = None, remat: bool = False) -> keras.Model:
    """Builds the UNet as a Keras functional model with unknown spatial sizes.

    Args:
        config: the architecture.
        dtype: a Keras dtype policy name, e.g. "float32" (default) or
            "mixed_bfloat16" (bfloat16 compute, float32 weights). The logits are
            always float32.
        remat: rematerialize each `ConvBlock` in the backward pass (keep only
            block inputs; recompute the rest), trading compute for activation memory.

    Returns:
        A model mapping (B, [D,] H, W, in_channels) to logits (B, [D,] H, W, num_classes).
    """
    dtype = dtype or "float32"
    spatial = (None,) * config.spatial_dims
    pool = keras.layers.MaxPooling3D if config.spatial_dims == 3 else keras.layers.MaxPooling2D
    conv = keras.layers.Conv3D if config.spatial_dims == 3 else keras.layers.Conv2D

    def block(x, filters, name):
        return ConvBlock(filters, config.spatial_dims, config.normalization, remat, name=name, dtype=dtype)(x)

    inputs = keras.Input(shape=(*spatial, config.in_channels), name="image")
    x = inputs
    if config.stem == "space_to_depth":
        x = SpaceToDepth(config.spatial_dims, name="space_to_depth", dtype=dtype)(x)
    skips = []
    for level in range(config.num_levels):
        x = block(x, config.base_filters * 2**level, f"down{level}")
        if level < config.num_levels - 1:
            skips.append(x)
            x = pool(2, name=f"pool{level}", dtype=dtype)(x)
    for level in reversed(range(config.num_levels - 1)):
        filters = config.base_filters * 2**level
        x = SubpixelUpsampling(filters, config.spatial_dims, name=f"up{level}", dtype=dtype)(x)
        x = keras.layers.Concatenate(axis=-1, name=f"skip{level}", dtype=dtype)([x, skips[level]])
        x = block(x, filters, f"decode{level}")
    if config.stem == "space_to_depth":  # each half-resolution position predicts its 2^d voxels
        logits = SubpixelUpsampling(config.num_classes, config.spatial_dims, name="logits", dtype=dtype)(x)
    else:
        logits = conv(config.num_classes, 1, name="logits", dtype=dtype)(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(logits)
    return keras.Model(inputs, logits, name=f"unet{config.spatial_dims}d")
