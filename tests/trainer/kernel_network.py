"""A small network of every op the kernel candidates replace (`trainer/parallel/kernels.py`), 2D or 3D: convolutions
(stride 1 and 2, dilated, 1×1), InstanceNorm and GroupNorm, BatchNorm, transposed convolutions (kernel = stride,
nnU-Net's; kernel 3 stride 2 "same", MONAI's). `build3d` is it as a user's network (`--model FILE.py:build3d`)."""

import keras


def network(spatial_dims: int, num_classes=3, in_channels=1):
    conv = {2: keras.layers.Conv2D, 3: keras.layers.Conv3D}[spatial_dims]
    transpose = {2: keras.layers.Conv2DTranspose, 3: keras.layers.Conv3DTranspose}[spatial_dims]
    inputs = keras.Input((None,) * spatial_dims + (in_channels,))
    x = conv(4, 3, padding="same")(inputs)
    x = keras.layers.GroupNormalization(groups=4, epsilon=1e-5)(x)  # InstanceNorm
    skip = keras.layers.LeakyReLU(0.01)(x)
    x = conv(6, 3, strides=2, padding="same")(skip)
    x = keras.layers.GroupNormalization(groups=2)(x)
    x = keras.layers.Activation("relu")(conv(6, 3, dilation_rate=2, padding="same")(x))
    x = keras.layers.BatchNormalization()(x)
    up = transpose(4, 2, strides=2)(x)
    other = transpose(4, 3, strides=2, padding="same")(x)
    x = keras.layers.Concatenate()([skip, up, other])
    return keras.Model(inputs, conv(num_classes, 1)(x))


def build3d(num_classes=3, in_channels=1):
    return network(3, num_classes, in_channels)
