"""MONAI's UNet in Keras 3, ported from its published configuration, not from fullres's layers.

Source: Project-MONAI/MONAI, `monai/networks/nets/unet.py:UNet` with `networks/blocks/convolutions.py`
(`Convolution`, `ResidualUnit`); the configuration of MONAI's 3D segmentation tutorials: channels 16, 32, 64, 128,
256, strides 2, 2, 2, 2, `num_res_units=2`, kernel 3, `up_kernel_size=3`, the class's defaults for the rest
(PReLU, InstanceNorm without affine parameters, ADN order "NDA": conv → norm → act, conv bias).

Structure kept: built recursively like MONAI's (down layer, a skip connection that concatenates the input with the
sub-block's output, up layer); every down layer is a strided residual unit (two conv → norm → PReLU subunits, the
shortcut a strided 3×3×3 conv where the stride or channels change); the up layer is a transposed convolution with
a kernel of 3 and stride 2 ("same" output size, MONAI's `output_padding = stride - 1`) → norm → PReLU, then one
residual unit, the top one ending in a bare convolution (the logits).

PReLU is torch's default: one slope for the whole tensor (`shared_axes` all of them). Self-contained (Keras only):
a run keeps a copy of this one file.
"""

import keras
from keras import layers

PUBLISHED = {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2), "num_res_units": 2}
TINY = {"channels": (4, 8, 16, 16), "strides": (2, 2, 2), "num_res_units": 2}


def _norm_act(x, act: bool = True):
    """InstanceNorm3d (affine=False) → PReLU (one slope)."""
    x = layers.GroupNormalization(groups=x.shape[-1], epsilon=1e-5, center=False, scale=False)(x)
    return layers.PReLU(alpha_initializer=keras.initializers.Constant(0.25), shared_axes=[1, 2, 3, 4])(x) if act else x


def _convolution(x, filters: int, stride: int, kernel: int = 3, conv_only: bool = False, transposed: bool = False):
    """MONAI's `Convolution`: conv (or transposed conv) then, unless `conv_only`, norm and PReLU."""
    conv = layers.Conv3DTranspose if transposed else layers.Conv3D
    x = conv(filters, kernel, strides=stride, padding="same")(x)
    return x if conv_only else _norm_act(x)


def _residual_unit(x, filters: int, stride: int, subunits: int, last_conv_only: bool = False):
    """MONAI's `ResidualUnit`: `subunits` convolutions (the first strided) plus a shortcut, added."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Conv3D(filters, 3 if stride != 1 else 1, strides=stride, padding="same")(x)
    y = x
    for index in range(subunits):
        y = _convolution(y, filters, stride if index == 0 else 1,
                         conv_only=last_conv_only and index == subunits - 1)
    return layers.Add()([y, shortcut])


def _block(x, out_channels: int, channels, strides, num_res_units: int, is_top: bool):
    """One level of MONAI's recursion: down, skip(sub-block), up."""
    down = _residual_unit(x, channels[0], strides[0], num_res_units)
    if len(channels) > 2:
        below = _block(down, channels[0], channels[1:], strides[1:], num_res_units, False)
    else:  # the bottom layer
        below = _residual_unit(down, channels[1], 1, num_res_units)
    x = layers.Concatenate()([down, below])  # SkipConnection: cat([input, sub-block(input)])
    x = _convolution(x, out_channels, strides[0], conv_only=is_top and num_res_units == 0, transposed=True)
    return _residual_unit(x, out_channels, 1, 1, last_conv_only=is_top)


def unet(num_classes: int, in_channels: int, channels, strides, num_res_units: int,
         name: str = "monai_unet") -> keras.Model:
    """MONAI's UNet: residual units down (strided), transposed convolutions (k=3, s=2) up."""
    if len(channels) != len(strides) + 1:
        raise ValueError(f"channels needs one entry more than strides, got {len(channels)} and {len(strides)}")
    inputs = keras.Input((None, None, None, in_channels))
    logits = _block(inputs, num_classes, channels, strides, num_res_units, is_top=True)
    return keras.Model(inputs, logits, name=name)


def build(num_classes=3, in_channels=1):
    """The tutorials' UNet: channels 16 to 256, four stride-2 levels, two residual subunits."""
    return unet(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same units and structure at test size: three stride-2 levels (/8), 4 to 16 channels."""
    return unet(num_classes, in_channels, **TINY, name="monai_unet_tiny")
