"""A UNet for 2D images and 3D volumes (one network, `spatial_dims` 2 or 3).

Every layer is a plain convolution, pooling or sub-pixel upsampling on
channels-last tensors, so XLA's SPMD partitioner can split every activation
along its spatial dimensions with only halo exchange between neighbours — in
the backward pass too (see `unet_layers.SubpixelUpsampling`).
"""

from __future__ import annotations

import dataclasses
import functools

import keras

from trainer.models import deep_supervision as deep_supervision_lib, residual_unet, unet_layers

NORMALIZATIONS = ("instance", "group", "batch", "none")
STEMS = ("none", "space_to_depth")
ENCODERS = ("plain", "residual")
# nnU-Net's residual encoder presets (ResEnc M/L/XL, nnunetv2 2.4+): residual blocks per encoder stage.
RESIDUAL_BLOCKS = (1, 3, 4, 6, 6, 6, 6)
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
    TPU's 128-lane tiles are full (docs/plan-targets.md: 1.76 GiB
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
        deep_supervision: train the decoder's lower resolutions to predict too,
            with nnU-Net's loss weights (`deep_supervision`): outputs at 1/2,
            1/4, ... of the input's resolution whose weight is above 0. Needs a
            decoder of 3 or more resolutions (`decoder_outputs`), since nnU-Net
            weighs the lowest 0: 4 levels without the stem, 3 with it.
            Inference sees the full-resolution logits only.
        encoder: "plain" (two convolutions per level, max-pooling between) or
            "residual" (nnU-Net's ResEnc: `residual_blocks[level]` residual
            blocks per level, strided convolutions between; the decoder stays
            plain); see `residual_unet`.
        residual_blocks: residual blocks at each level of a residual encoder,
            first level first (nnU-Net's ResEnc presets: 1, 3, 4, 6, 6, 6, 6).

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
    deep_supervision: bool = False
    encoder: str = "plain"
    residual_blocks: tuple[int, ...] = RESIDUAL_BLOCKS

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
        if self.encoder not in ENCODERS:
            raise ValueError(f"UNetConfig.encoder must be one of {ENCODERS}, got {self.encoder!r}.")
        object.__setattr__(self, "residual_blocks", tuple(int(b) for b in self.residual_blocks))
        if self.encoder == "residual" and (len(self.residual_blocks) < self.num_levels or min(self.residual_blocks) < 1):
            raise ValueError(
                f"UNetConfig.residual_blocks needs a count of 1 or more for each of the {self.num_levels} levels of "
                f"a residual encoder, got {list(self.residual_blocks)}; e.g. {list(RESIDUAL_BLOCKS[:self.num_levels])}.")
        if self.deep_supervision and len(self.output_weights) < 2:
            raise ValueError(
                f"UNetConfig.deep_supervision needs a decoder of 3 or more resolutions, but {self.num_levels} levels "
                f"{'with' if self.stem == 'space_to_depth' else 'without'} the stem give "
                f"{self.decoder_outputs}, and nnU-Net weighs the lowest 0; use num_levels "
                f"{4 - (self.stem == 'space_to_depth')} or more, or turn deep supervision off.")
        if self.normalization == "group" and self.base_filters % 8 != 0:
            raise ValueError(
                f"UNetConfig.normalization='group' uses 8 groups, so base_filters must be a multiple of 8, "
                f"got {self.base_filters}."
            )

    @property
    def downsampling_levels(self) -> int:
        """How many times each spatial size is halved on the way down (the stem's fold counts as one)."""
        return self.num_levels - 1 + (self.stem == "space_to_depth")

    @property
    def decoder_outputs(self) -> int:
        """The decoder's resolutions, full first (1, 1/2, 1/4, ...): where deep supervision can predict."""
        return max(1, self.num_levels - 1 + (self.stem == "space_to_depth"))

    @property
    def output_weights(self) -> tuple[float, ...]:
        """The training loss weight of each model output, full resolution first: (1.0,) without deep supervision.

        >>> UNetConfig(deep_supervision=True).output_weights
        (0.6666666666666666, 0.3333333333333333)
        """
        if not self.deep_supervision:
            return (1.0,)
        weights = deep_supervision_lib.decoder_weights(self.decoder_outputs)
        return tuple(weights[i] for i in deep_supervision_lib.supervised_outputs(self.decoder_outputs))


def build_unet(config: UNetConfig, dtype: str | None = None, remat: bool = False) -> keras.Model:
    """Builds the UNet `config` describes as a Keras functional model with unknown spatial sizes.

    Args:
        config: the architecture; `config.encoder` picks the encoder (plain, or `residual_unet.residual_encoder`).
        dtype: a Keras dtype policy name, e.g. "float32" (default) or
            "mixed_bfloat16" (bfloat16 compute, float32 weights). The logits are
            always float32.
        remat: rematerialize each `ConvBlock` (and `ResidualBlock`) in the backward pass (keep only
            block inputs; recompute the rest), trading compute for activation memory.

    Returns:
        A model mapping (B, [D,] H, W, in_channels) to logits (B, [D,] H, W, num_classes); with deep
        supervision, a `deep_supervision.DeepSupervision` that returns, in training, the logits of every
        supervised resolution (full first).
    """
    dtype = dtype or "float32"
    inputs = keras.Input(shape=(*(None,) * config.spatial_dims, config.in_channels), name="image")
    x = inputs
    if config.stem == "space_to_depth":
        x = unet_layers.SpaceToDepth(config.spatial_dims, name="space_to_depth", dtype=dtype)(x)
    if config.encoder == "residual":
        x, skips = residual_unet.residual_encoder(config, x, dtype, remat)
        return decode(config, inputs, x, skips, dtype, remat, name=f"residual_unet{config.spatial_dims}d")
    pool = keras.layers.MaxPooling3D if config.spatial_dims == 3 else keras.layers.MaxPooling2D
    skips = []
    for level in range(config.num_levels):
        x = unet_layers.ConvBlock(config.base_filters * 2**level, config.spatial_dims, config.normalization, remat,
                                  name=f"down{level}", dtype=dtype)(x)
        if level < config.num_levels - 1:
            skips.append(x)
            x = pool(2, name=f"pool{level}", dtype=dtype)(x)
    return decode(config, inputs, x, skips, dtype, remat, name=f"unet{config.spatial_dims}d")


def decode(config: UNetConfig, inputs, x, skips: list, dtype: str, remat: bool, name: str) -> keras.Model:
    """The decoder every fullres UNet shares, from the bottleneck `x` and the encoder's `skips` (first level first).

    Each level: sub-pixel upsampling, the skip concatenated, a `ConvBlock`. Then the logits (unfolded by the
    stem's inverse where there is one) and, with deep supervision, a 1×1 convolution to logits at each
    supervised lower resolution.
    """
    conv = functools.partial(unet_layers.conv_layer, config.spatial_dims)
    stem = config.stem == "space_to_depth"
    supervised = set(deep_supervision_lib.supervised_outputs(config.decoder_outputs)) if config.deep_supervision \
        else set()
    auxiliary = {}
    for level in reversed(range(config.num_levels - 1)):
        filters = config.base_filters * 2**level
        x = unet_layers.SubpixelUpsampling(filters, config.spatial_dims, name=f"up{level}", dtype=dtype)(x)
        x = keras.layers.Concatenate(axis=-1, name=f"skip{level}", dtype=dtype)([x, skips[level]])
        x = unet_layers.ConvBlock(filters, config.spatial_dims, config.normalization, remat, name=f"decode{level}",
                                  dtype=dtype)(x)
        output = level + stem  # this level's resolution is 1 / 2^output of the input's
        if output in supervised and output > 0:
            head = conv(config.num_classes, 1, name=f"logits_{2**output}", dtype=dtype)(x)
            auxiliary[output] = keras.layers.Activation("linear", dtype="float32", name=f"logits_{2**output}_float32")(head)
    if stem:  # each half-resolution position predicts its 2^d voxels
        logits = unet_layers.SubpixelUpsampling(config.num_classes, config.spatial_dims, name="logits", dtype=dtype)(x)
    else:
        logits = conv(config.num_classes, 1, name="logits", dtype=dtype)(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(logits)
    if not auxiliary:
        return keras.Model(inputs, logits, name=name)
    outputs = [logits, *(auxiliary[output] for output in sorted(auxiliary))]
    return deep_supervision_lib.DeepSupervision(keras.Model(inputs, outputs, name=name))
