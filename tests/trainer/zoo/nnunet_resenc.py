"""nnU-Net's residual-encoder UNet, the ResEnc-M preset, in Keras 3, ported from its published configuration.

Source: MIC-DKFZ/dynamic-network-architectures, `architectures/unet.py:ResidualEncoderUNet` with
`building_blocks/residual_encoders.py:ResidualEncoder`, `building_blocks/residual.py:BasicBlockD` and
`building_blocks/unet_decoder.py`; nnU-Net v2's `nnUNetPlannerResEncM`
(`experiment_planners/residual_unets/residual_encoder_unet_planners.py`): residual blocks per encoder stage
1, 3, 4, 6, 6, 6, one convolution per decoder stage, features 32 to 320, strides 1, 2, 2, 2, 2, 2, conv bias,
InstanceNorm (eps 1e-5, affine), LeakyReLU (0.01).

Structure kept: a stem (conv → norm → LeakyReLU, no stride); each stage a stack of ResNet-D basic blocks, the first
one strided (conv1 strided → norm → LeakyReLU, conv2 → norm, the shortcut an average pooling of the stride then a
1×1×1 conv without bias → norm where the channels change, add, LeakyReLU); nnU-Net's plain decoder (transposed
convolution k=s=2, concatenate, conv → norm → LeakyReLU) and a 1×1×1 segmentation layer at full resolution.

InstanceNorm is `GroupNormalization(groups=channels)`. Self-contained (Keras only): a run keeps a copy of this file.
"""

import keras
from keras import layers

PUBLISHED = {"features": (32, 64, 128, 256, 320, 320), "strides": (1, 2, 2, 2, 2, 2), "blocks": (1, 3, 4, 6, 6, 6),
             "convs_per_decoder_stage": 1}
TINY = {"features": (4, 8, 16, 16), "strides": (1, 2, 2, 2), "blocks": (1, 3, 4, 6), "convs_per_decoder_stage": 1}


def _instance_norm(channels: int):
    return layers.GroupNormalization(groups=channels, epsilon=1e-5)


def _conv_norm(x, filters: int, kernel: int, stride: int, use_bias: bool = True):
    return _instance_norm(filters)(layers.Conv3D(filters, kernel, strides=stride, padding="same", use_bias=use_bias)(x))


def _basic_block_d(x, filters: int, stride: int):
    """BasicBlockD (ResNet-D): the shortcut average-pools the stride away and projects with a 1×1×1 conv."""
    shortcut = x
    if stride != 1:
        shortcut = layers.AveragePooling3D(stride, strides=stride)(shortcut)
    if x.shape[-1] != filters:
        shortcut = _conv_norm(shortcut, filters, 1, 1, use_bias=False)
    y = layers.LeakyReLU(0.01)(_conv_norm(x, filters, 3, stride))
    y = _conv_norm(y, filters, 3, 1)
    return layers.LeakyReLU(0.01)(layers.Add()([y, shortcut]))


def residual_encoder_unet(num_classes: int, in_channels: int, features, strides, blocks,
                          convs_per_decoder_stage: int, name: str = "residual_encoder_unet") -> keras.Model:
    """ResidualEncoderUNet: ResNet-D encoder stages, nnU-Net's transposed-convolution decoder."""
    if not len(features) == len(strides) == len(blocks):
        raise ValueError(f"features, strides and blocks must have one entry a stage, got {len(features)}, "
                         f"{len(strides)} and {len(blocks)}")
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.LeakyReLU(0.01)(_conv_norm(inputs, features[0], 3, 1))  # the stem
    skips = []
    for filters, stride, count in zip(features, strides, blocks):
        for index in range(count):
            x = _basic_block_d(x, filters, stride if index == 0 else 1)
        skips.append(x)
    for stage in range(len(features) - 2, -1, -1):
        up = strides[stage + 1]
        x = layers.Conv3DTranspose(features[stage], up, strides=up, name=f"transpconv{stage}")(x)
        x = layers.Concatenate()([x, skips[stage]])
        for _ in range(convs_per_decoder_stage):
            x = layers.LeakyReLU(0.01)(_conv_norm(x, features[stage], 3, 1))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1, name="seg_layer0")(x), name=name)


def build(num_classes=3, in_channels=1):
    """ResEnc-M as nnU-Net plans it for 3d_fullres (6 stages, 1-3-4-6-6-6 blocks, 32 to 320 features)."""
    return residual_encoder_unet(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same blocks and structure at test size: 4 stages (/8) of 1, 3, 4, 6 blocks, 4 to 16 features."""
    return residual_encoder_unet(num_classes, in_channels, **TINY, name="residual_encoder_unet_tiny")
