"""The per-frame network of the motion benchmark (`benchmarks/learning/video_motion.py`), as a user's `--model` would be.

`frame_unet` is a 2D UNet applied to every frame on its own: its convolutions
are 1×3×3 and its pooling 1×2×2 over (T, H, W), so no output pixel sees another
frame. It takes the same clip records, trainer and split as the whole-clip 3D
UNet; only what it can see differs. Self-contained (Keras only): the run keeps a
copy of this file.
"""

import keras
from keras import layers

FRAME = (1, 3, 3)  # no reach across frames


def _block(x, filters: int):
    for _ in range(2):
        x = layers.Conv3D(filters, FRAME, padding="same")(x)
        x = layers.Activation("relu")(layers.GroupNormalization(groups=-1)(x))  # instance norm, per frame's channels
    return x


def frame_unet(num_classes=3, in_channels=3, base_filters=14, num_levels=3):
    """A 3-level 2D UNet per frame. 14 filters at the first level give about the parameters of the whole-clip 3D UNet
    of 8 (a 3×3 kernel has a third of a 3×3×3 kernel's weights)."""
    inputs = keras.Input((None, None, None, in_channels))
    x, skips = inputs, []
    for level in range(num_levels):
        x = _block(x, base_filters * 2**level)
        if level < num_levels - 1:
            skips.append(x)
            x = layers.MaxPooling3D((1, 2, 2))(x)
    for level in reversed(range(num_levels - 1)):
        x = layers.UpSampling3D((1, 2, 2))(x)
        x = _block(layers.Concatenate()([skips[level], x]), base_filters * 2**level)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="frame_unet")
