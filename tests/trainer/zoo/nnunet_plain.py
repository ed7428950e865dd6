"""nnU-Net's PlainConvUNet in Keras 3, ported from its published configuration, not from fullres's layers.

Source: MIC-DKFZ/dynamic-network-architectures, `architectures/unet.py:PlainConvUNet` with
`building_blocks/plain_conv_encoder.py` and `building_blocks/unet_decoder.py`; nnU-Net v2's default 3d_fullres
plans (`ExperimentPlanner`): 6 stages, features 32, 64, 128, 256, 320, 320, 3×3×3 kernels, strides 1, 2, 2, 2, 2, 2,
2 convolutions per stage in the encoder and the decoder, conv bias, InstanceNorm (eps 1e-5, affine), LeakyReLU
(0.01), no dropout.

Structure kept: each stage's first convolution is strided (downsampling by convolution, no pooling); each block
is conv → InstanceNorm → LeakyReLU; the decoder upsamples with a transposed convolution whose kernel equals its
stride (k=2, s=2), concatenates the skip and runs the stage's convolutions; a 1×1×1 segmentation layer per decoder
stage (deep supervision), of which the network returns the full-resolution one (fullres's contract: one output).

InstanceNorm is `GroupNormalization(groups=channels)` (what torch's InstanceNorm3d(affine=True) computes).
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import keras
from keras import layers

PUBLISHED = {"features": (32, 64, 128, 256, 320, 320), "strides": (1, 2, 2, 2, 2, 2), "convs_per_stage": 2,
             "convs_per_decoder_stage": 2}
TINY = {"features": (4, 8, 16, 16), "strides": (1, 2, 2, 2), "convs_per_stage": 2, "convs_per_decoder_stage": 2}


def _instance_norm(channels: int):
    return layers.GroupNormalization(groups=channels, epsilon=1e-5)


def _conv_norm_relu(x, filters: int, stride: int, name: str):
    """ConvDropoutNormReLU: conv (3×3×3, bias) → InstanceNorm → LeakyReLU(0.01)."""
    x = layers.Conv3D(filters, 3, strides=stride, padding="same", name=f"{name}_conv")(x)
    x = _instance_norm(filters)(x)
    return layers.LeakyReLU(0.01)(x)


def _stacked(x, count: int, filters: int, first_stride: int, name: str):
    for index in range(count):
        x = _conv_norm_relu(x, filters, first_stride if index == 0 else 1, f"{name}_{index}")
    return x


def plain_conv_unet(num_classes: int, in_channels: int, features, strides, convs_per_stage: int,
                    convs_per_decoder_stage: int, name: str = "plain_conv_unet") -> keras.Model:
    """PlainConvUNet: a plain convolutional encoder (strided convolutions down) and a transposed-convolution decoder."""
    if len(features) != len(strides):
        raise ValueError(f"features ({len(features)} stages) and strides ({len(strides)}) differ in length")
    inputs = keras.Input((None, None, None, in_channels))
    skips, x = [], inputs
    for stage, (filters, stride) in enumerate(zip(features, strides)):
        x = _stacked(x, convs_per_stage, filters, stride, f"encoder{stage}")
        skips.append(x)
    for stage in range(len(features) - 2, -1, -1):  # from the stage above the bottleneck up to full resolution
        up = strides[stage + 1]
        x = layers.Conv3DTranspose(features[stage], up, strides=up, name=f"transpconv{stage}")(x)
        x = layers.Concatenate()([x, skips[stage]])
        x = _stacked(x, convs_per_decoder_stage, features[stage], 1, f"decoder{stage}")
    logits = layers.Conv3D(num_classes, 1, name="seg_layer0")(x)
    return keras.Model(inputs, logits, name=name)


def build(num_classes=3, in_channels=1):
    """nnU-Net's default 3d_fullres PlainConvUNet (6 stages, 32 to 320 features): the published configuration."""
    return plain_conv_unet(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same layer kinds and structure at test size: 4 stages (/8), 4 to 16 features."""
    return plain_conv_unet(num_classes, in_channels, **TINY, name="plain_conv_unet_tiny")
