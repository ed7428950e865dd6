"""MONAI's SegResNet in Keras 3, ported from its published configuration, not from fullres's layers.

Source: Project-MONAI/MONAI, `monai/networks/nets/segresnet.py:SegResNet` with
`networks/blocks/segresnet_block.py` (`ResBlock`, `get_conv_layer`, `get_upsample_layer`); the class's defaults:
`init_filters=8`, `blocks_down=(1, 2, 2, 4)`, `blocks_up=(1, 1, 1)`, GroupNorm with 8 groups, ReLU, convolutions
without bias, `upsample_mode="nontrainable"` (trilinear interpolation, `align_corners=False`), no dropout, no VAE.

Structure kept: a 3×3×3 stem; each down level a stride-2 3×3×3 convolution (not the first) and pre-activation
residual blocks (GroupNorm → ReLU → conv → GroupNorm → ReLU → conv, plus the identity); each up level a 1×1×1
convolution halving the channels, trilinear ×2 upsampling, the skip ADDED (not concatenated), residual blocks; the
head GroupNorm → ReLU → 1×1×1 conv (with bias).

Keras has no trilinear upsampling layer (`UpSampling3D` is nearest only), so `LinearUpsampling3D` below computes
torch's `F.interpolate(scale_factor=2, mode="trilinear", align_corners=False)` exactly: along each axis an output
pair is 3/4 of the voxel plus 1/4 of its neighbour below or above (the edge voxel repeated), in keras.ops only.
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import keras
from keras import layers, ops

PUBLISHED = {"init_filters": 8, "groups": 8, "blocks_down": (1, 2, 2, 4), "blocks_up": (1, 1, 1)}
TINY = {"init_filters": 4, "groups": 4, "blocks_down": (1, 2, 2, 4), "blocks_up": (1, 1, 1)}


def _along(x, axis: int, start: int, stop: int):
    """x[..., start:stop, ...] along `axis`."""
    return x[(slice(None),) * axis + (slice(start, stop),)]


class LinearUpsampling3D(layers.Layer):
    """×2 trilinear upsampling with half-pixel centres (torch's `align_corners=False`), separable along D, H, W."""

    def call(self, x):  # (B, D, H, W, C) -> (B, 2D, 2H, 2W, C)
        for axis in (1, 2, 3):
            size = x.shape[axis]
            below = ops.concatenate([_along(x, axis, 0, 1), _along(x, axis, 0, size - 1)], axis=axis)  # edge repeated
            above = ops.concatenate([_along(x, axis, 1, size), _along(x, axis, size - 1, size)], axis=axis)
            pairs = ops.stack([0.75 * x + 0.25 * below, 0.75 * x + 0.25 * above], axis=axis + 1)
            shape = list(ops.shape(x))
            shape[axis] = 2 * size
            x = ops.reshape(pairs, shape)  # (..., size, 2, ...) -> (..., 2·size, ...)
        return x

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *(None if s is None else 2 * s for s in input_shape[1:4]), input_shape[4])


def _conv(x, filters: int, kernel: int = 3, stride: int = 1, use_bias: bool = False):
    return layers.Conv3D(filters, kernel, strides=stride, padding="same", use_bias=use_bias)(x)


def _norm_relu(x, groups: int):
    return layers.ReLU()(layers.GroupNormalization(groups=groups, epsilon=1e-5)(x))


def _res_block(x, groups: int):
    """MONAI's SegResNet ResBlock: pre-activation, two 3×3×3 convolutions, the identity added."""
    filters = x.shape[-1]
    y = _conv(_norm_relu(x, groups), filters)
    y = _conv(_norm_relu(y, groups), filters)
    return layers.Add()([y, x])


def segresnet(num_classes: int, in_channels: int, init_filters: int, groups: int, blocks_down, blocks_up,
              name: str = "segresnet") -> keras.Model:
    """SegResNet without the VAE branch: residual encoder, trilinear upsampling, additive skips."""
    if len(blocks_up) != len(blocks_down) - 1:
        raise ValueError(f"blocks_up needs one entry fewer than blocks_down, got {len(blocks_up)} and "
                         f"{len(blocks_down)}")
    inputs = keras.Input((None, None, None, in_channels))
    x = _conv(inputs, init_filters)
    skips = []
    for level, count in enumerate(blocks_down):
        if level > 0:
            x = _conv(x, init_filters * 2**level, stride=2)
        for _ in range(count):
            x = _res_block(x, groups)
        skips.append(x)
    for index, count in enumerate(blocks_up):
        filters = init_filters * 2 ** (len(blocks_up) - index - 1)
        x = LinearUpsampling3D()(_conv(x, filters, kernel=1))
        x = layers.Add()([x, skips[-index - 2]])
        for _ in range(count):
            x = _res_block(x, groups)
    logits = _conv(_norm_relu(x, groups), num_classes, kernel=1, use_bias=True)
    return keras.Model(inputs, logits, name=name)


def build(num_classes=3, in_channels=1):
    """MONAI's default SegResNet: 8 initial filters, blocks 1-2-2-4 down and 1-1-1 up, GroupNorm(8)."""
    return segresnet(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same blocks and structure (/8) with 4 initial filters and GroupNorm(4)."""
    return segresnet(num_classes, in_channels, **TINY, name="segresnet_tiny")
