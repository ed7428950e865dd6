"""Networks a user might write, none of them fullres's: what `--model FILE.py:FUNCTION` and `fullres.train` take.

Each function takes `num_classes` and `in_channels` and returns an uncompiled Keras model with channels-last
inputs and `num_classes` logits at the input's resolution. Self-contained on purpose (Keras and KerasHub only):
the run keeps a copy of this one file.
"""

import keras
from keras import layers, ops


def _residual_block(x, filters: int, stride: int):
    """Two 3×3×3 convolutions with GroupNorm; the first strided (downsampling), the shortcut a strided 1×1×1."""
    shortcut = x if stride == 1 and x.shape[-1] == filters else layers.Conv3D(filters, 1, strides=stride)(x)
    y = layers.Conv3D(filters, 3, strides=stride, padding="same")(x)
    y = layers.Activation("relu")(layers.GroupNormalization(groups=4)(y))
    y = layers.GroupNormalization(groups=4)(layers.Conv3D(filters, 3, padding="same")(y))
    return layers.Activation("relu")(layers.Add()([shortcut, y]))


def large_mean(num_classes=3, in_channels=1):
    """A first normalization that sees a mean near 1000 against a spread below 0.1 (raw detector counts on an
    offset, say): an InstanceNorm of the offset input, a convolution with GroupNorm, a 1×1×1 head."""
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.GroupNormalization(groups=in_channels)(layers.Rescaling(0.1, offset=1000.0)(inputs))
    x = layers.Conv3D(8, 3, padding="same")(x)
    x = layers.Activation("relu")(layers.GroupNormalization(groups=4)(x))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="large_mean")


def residual_groupnorm(num_classes=3, in_channels=1):
    """3D residual network: GroupNorm, strided-convolution downsampling (/4), nearest upsampling, a skip."""
    inputs = keras.Input((None, None, None, in_channels))
    full = _residual_block(layers.Conv3D(8, 3, padding="same")(inputs), 8, 1)
    coarse = _residual_block(_residual_block(full, 8, 2), 16, 2)  # (D/4, H/4, W/4, 16)
    x = layers.Concatenate()([full, layers.UpSampling3D(4)(coarse)])
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="residual_groupnorm")


def transposed_upsampling(num_classes=3, in_channels=1):
    """3D encoder-decoder that upsamples with `Conv3DTranspose` (split, fullres computes it without gathers)."""
    inputs = keras.Input((None, None, None, in_channels))
    full = layers.Conv3D(8, 3, padding="same", activation="relu")(inputs)
    half = layers.Conv3D(16, 3, strides=2, padding="same", activation="relu")(full)
    up = layers.Conv3DTranspose(8, 2, strides=2, name="upsampling")(half)
    x = layers.Conv3D(8, 3, padding="same", activation="relu")(layers.Concatenate()([full, up]))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="transposed_upsampling")


def transposed_decoder(num_classes=3, in_channels=1):
    """nnU-Net's shape in small: residual GroupNorm blocks, strided-convolution downsampling (/4), and a decoder of
    `Conv3DTranspose(kernel 2, stride 2)` upsamplings, each followed by a skip concatenation and a block."""
    inputs = keras.Input((None, None, None, in_channels))
    full = _residual_block(layers.Conv3D(8, 3, padding="same")(inputs), 8, 1)
    half = _residual_block(full, 8, 2)
    quarter = _residual_block(half, 16, 2)  # (D/4, H/4, W/4, 16)
    x = layers.Conv3DTranspose(8, 2, strides=2, name="up_half")(quarter)
    x = _residual_block(layers.Concatenate()([half, x]), 8, 1)
    x = layers.Conv3DTranspose(8, 2, strides=2, name="up_full")(x)
    x = _residual_block(layers.Concatenate()([full, x]), 8, 1)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="transposed_decoder")


def hub_backbone(num_classes=3, in_channels=1):
    """2D network on a KerasHub ResNet built from its config (no weights downloaded): /8, then upsampled back."""
    import keras_hub

    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 16],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(None, None, in_channels))
    inputs = keras.Input((None, None, in_channels))
    x = layers.UpSampling2D(8, interpolation="bilinear")(backbone(inputs))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(layers.Concatenate()([inputs, x]))
    return keras.Model(inputs, layers.Conv2D(num_classes, 1)(x), name="hub_backbone")


def flattening(num_classes=3, in_channels=1):
    """A 16³ network that mixes its whole (pooled) volume through a Dense layer over the flattened activation: split
    in space, `global_mixing` all-gathers the flattened activation onto every device."""
    inputs = keras.Input((16, 16, 16, in_channels))
    x = layers.Conv3D(4, 3, padding="same", activation="relu")(inputs)
    pooled = layers.Flatten(name="flatten")(layers.AveragePooling3D(4)(x))  # (B, 4·4·4·4)
    mixed = layers.Reshape((4, 4, 4, 4))(layers.Dense(4 * 4 * 4 * 4, name="global_mixing")(pooled))
    x = layers.Concatenate()([x, layers.UpSampling3D(4)(mixed)])
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="flattening")


def not_a_model(num_classes=3, in_channels=1):
    """Returns the layer, not a model."""
    return layers.Conv3D(num_classes, 1)


def wrong_resolution(num_classes=3, in_channels=1):
    """Logits at half the input's resolution."""
    inputs = keras.Input((None, None, None, in_channels))
    return keras.Model(inputs, layers.Conv3D(num_classes, 2, strides=2)(inputs))


def wide_kernels(num_classes=3, in_channels=1):
    """3D network of two 5×5×5 convolutions at full resolution: on (8, 4, 4) split 2×2 along depth and height,
    each device holds 2 voxels along height, no more than a 5-wide window reaches (fullres refuses that split:
    trainer/parallel/thin_shards.py)."""
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(4, 5, padding="same", activation="tanh", name="wide_first")(inputs)
    x = layers.Conv3D(4, 5, padding="same", activation="tanh", name="wide_second")(x)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="wide_kernels")


def wide_coarse(num_classes=3, in_channels=1):
    """3D network with a 5×5×5 convolution at half resolution: on 8³ patches every 2×2 split of 4 devices leaves it
    2 voxels a device along a split axis (refused: trainer/parallel/thin_shards.py), and every 4-way split along one
    axis all-gathers its activation (a 5-wide window over 1 voxel a device); split 2 ways it does neither."""
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(4, 3, padding="same", activation="relu")(inputs)
    coarse = layers.Conv3D(4, 3, strides=2, padding="same", activation="relu")(x)
    coarse = layers.Conv3D(4, 5, padding="same", activation="relu", name="wide_coarse")(coarse)
    merged = layers.Concatenate()([x, layers.UpSampling3D(2)(coarse)])
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(merged), name="wide_coarse")


class WindowAttention(layers.Layer):
    """Self-attention within each 4×4×4 window of a (B, D, H, W, C) tensor: its reshape needs whole windows."""

    window = 4

    def build(self, input_shape):
        self.qkv = layers.Dense(3 * input_shape[-1])
        self.qkv.build(input_shape)

    def call(self, x):
        b, d, h, w, c = ops.shape(x)
        n = self.window
        blocks = ops.reshape(x, (b, d // n, n, h // n, n, w // n, n, c))  # (B, D/n, n, H/n, n, W/n, n, C)
        windows = ops.reshape(ops.transpose(blocks, (0, 1, 3, 5, 2, 4, 6, 7)), (-1, n**3, c))  # (B·windows, n³, C)
        q, k, v = ops.split(self.qkv(windows), 3, axis=-1)
        attended = ops.matmul(ops.softmax(ops.matmul(q, ops.transpose(k, (0, 2, 1))) / c**0.5), v)
        out = ops.reshape(attended, (b, d // n, h // n, w // n, n, n, n, c))  # (B, D/n, H/n, W/n, n, n, n, C)
        return ops.reshape(ops.transpose(out, (0, 1, 4, 2, 5, 3, 6, 7)), (b, d, h, w, c))


def windowed_attention(num_classes=3, in_channels=1):
    """3D network with 4×4×4-window self-attention at a quarter of the resolution: an input it takes is a multiple
    of 16 voxels along every axis (the strides measure only 4)."""
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(4, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.Conv3D(8, 3, strides=2, padding="same", activation="relu")(x)  # (D/4, H/4, W/4, 8)
    x = layers.UpSampling3D(4)(layers.Add()([x, WindowAttention()(x)]))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="windowed_attention")


def global_attention(num_classes=3, in_channels=1):
    """UNETR in small: 2³ patches embedded by a strided convolution, global multi-head self-attention of every token
    of the volume's grid to every other (pre-norm, residual), nearest upsampling back to the input's resolution and
    a convolution, a skip from the input. (Not 4³ patches: `fullres train` of a k=4 s=4 patch embedding on the 16³
    demo volumes split 2×2 all-gathers 2 KiB "outside any layer", attention or not; measured 2026-11-28.)"""
    inputs = keras.Input((None, None, None, in_channels))
    tokens = layers.Conv3D(16, 2, strides=2, name="patch_embedding")(inputs)
    normed = layers.LayerNormalization()(tokens)
    attended = layers.MultiHeadAttention(2, 8, attention_axes=(1, 2, 3), name="global_attention")(normed, normed)
    x = layers.Conv3D(8, 1, name="up")(layers.UpSampling3D(2)(layers.Add()([tokens, attended])))
    x = layers.Conv3D(8, 3, padding="same", activation="relu")(layers.Concatenate()([inputs, x]))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x), name="global_attention")
