"""MedNeXt (v1) in Keras 3, ported from its published configuration, not from fullres's layers.

Source: MIC-DKFZ/MedNeXt, `nnunet_mednext/network_architecture/mednextv1/MedNextV1.py` and `blocks.py`
(`MedNeXtBlock`, `MedNeXtDownBlock`, `MedNeXtUpBlock`, `OutBlock`); `create_mednext_v1.py`'s "S" model: 32
channels, expansion ratio 2, 2 blocks at every level, kernel 3, residual blocks and residual up/down sampling.

Structure kept: a 1×1×1 stem; ConvNeXt blocks (depthwise k×k×k conv → GroupNorm with one group per channel → 1×1×1
expansion → GELU → 1×1×1 compression, plus the input); down blocks the same with a stride-2 depthwise conv and a
stride-2 1×1×1 residual conv; up blocks a stride-2 transposed conv (kernel 3, padding 1: 2n−1 voxels, normalized
as they are, then one zero voxel padded in front of each axis, as MedNeXt does) and a stride-2 1×1×1 transposed
residual conv, padded alike;
skips ADDED to the upsampled features; a 1×1×1 output conv at full resolution (deep supervision heads left out).

One deviation, Keras's: MedNeXt's up block's transposed conv is depthwise (`groups=in_channels`), and Keras's
`Conv3DTranspose` has no `groups`; here it is a full transposed conv with as many filters (more weights, the same
layer kind, kernel, stride, padding and shapes). The down blocks' depthwise conv is `Conv3D(groups=channels)`.
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import keras
from keras import layers

PUBLISHED = {"channels": 32, "levels": 4, "expansion": 2, "blocks": 2, "kernel": 3}  # MedNeXt-S
TINY = {"channels": 4, "levels": 3, "expansion": 2, "blocks": 1, "kernel": 3}


def _norm(x):
    return layers.GroupNormalization(groups=x.shape[-1], epsilon=1e-5)(x)  # nn.GroupNorm(C, C)


def _mednext_block(x, out_channels: int, expansion: int, kernel: int, stride: int = 1, residual: bool = True):
    """Depthwise conv (stride 1 or 2) → GroupNorm → 1×1×1 expand → GELU → 1×1×1 compress (+ the input)."""
    channels = x.shape[-1]
    y = layers.Conv3D(channels, kernel, strides=stride, padding="same", groups=channels)(x)
    y = layers.Conv3D(expansion * channels, 1)(_norm(y))
    y = layers.Conv3D(out_channels, 1)(layers.Activation("gelu")(y))
    return layers.Add()([x, y]) if residual else y


def _down_block(x, out_channels: int, expansion: int, kernel: int):
    y = _mednext_block(x, out_channels, expansion, kernel, stride=2, residual=False)
    return layers.Add()([y, layers.Conv3D(out_channels, 1, strides=2)(x)])  # the residual resampled too


def _up_block(x, out_channels: int, expansion: int, kernel: int):
    """MedNeXtUpBlock: its transposed conv (k=3, s=2, padding 1) gives 2n − 1 voxels, normalized and mixed as they
    are, then one zero voxel padded in front of each axis; the residual transposed conv (k=1, s=2) likewise."""
    channels = x.shape[-1]
    front = ((1, 0), (1, 0), (1, 0))
    y = layers.Conv3DTranspose(channels, kernel, strides=2, padding="same")(x)  # the full output's first 2n voxels
    y = layers.Cropping3D(front)(y)  # torch's padding=1 drops the first: 2n − 1
    y = layers.Conv3D(expansion * channels, 1)(_norm(y))
    y = layers.ZeroPadding3D(front)(layers.Conv3D(out_channels, 1)(layers.Activation("gelu")(y)))
    residual = layers.Conv3DTranspose(out_channels, 1, strides=2)(x)  # Keras's 2n: torch's 2n − 1, then a bias voxel
    residual = layers.ZeroPadding3D(front)(layers.Cropping3D(((0, 1), (0, 1), (0, 1)))(residual))
    return layers.Add()([y, residual])


def mednext(num_classes: int, in_channels: int, channels: int, levels: int, expansion: int, blocks: int,
            kernel: int, name: str = "mednext") -> keras.Model:
    """MedNeXt v1: ConvNeXt blocks in a UNet with `levels` stride-2 steps, additive skips."""
    if kernel != 3:
        raise ValueError(f"this port builds MedNeXt's kernel-3 models (its up block's padding is written for k=3), "
                         f"got kernel {kernel}")
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(channels, 1, name="stem")(inputs)
    skips = []
    for _ in range(levels):
        for _ in range(blocks):
            x = _mednext_block(x, x.shape[-1], expansion, kernel)
        skips.append(x)
        x = _down_block(x, 2 * x.shape[-1], expansion, kernel)
    for _ in range(blocks):  # the bottleneck
        x = _mednext_block(x, x.shape[-1], expansion, kernel)
    for skip in reversed(skips):
        x = layers.Add()([skip, _up_block(x, skip.shape[-1], expansion, kernel)])
        for _ in range(blocks):
            x = _mednext_block(x, x.shape[-1], expansion, kernel)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1, name="out_0")(x), name=name)


def build(num_classes=3, in_channels=1):
    """MedNeXt-S: 32 channels, 4 levels, expansion 2, 2 blocks a level, kernel 3."""
    return mednext(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same blocks at test size: 4 channels, 3 levels (/8), 1 block a level."""
    return mednext(num_classes, in_channels, **TINY, name="mednext_tiny")
