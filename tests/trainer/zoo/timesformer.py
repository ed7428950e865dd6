"""TimeSformer's divided space-time attention in Keras 3, ported from its published configuration, with a
segmentation head: a video (B, T, H, W, C) is a volume whose first axis is time.

Source: facebookresearch/TimeSformer, `timesformer/models/vit.py` (`VisionTransformer` with
`attention_type="divided_space_time"`, `Block`, `Attention`, `PatchEmbed`) and its published configuration
(`TimeSformer_divST_8x32_224`: 8 frames of 224², 16² patches per frame, `embed_dim=768`, `depth=12`,
`num_heads=12`, `mlp_ratio=4`, `qkv_bias=True`, LayerNorm eps 1e-6, GELU).

Structure kept: each frame patched by a (1, 16, 16) strided convolution; a learned spatial position embedding per
patch and a learned time embedding per frame, added; blocks of LayerNorm → attention over time (each patch attends
to itself in every frame: `attention_axes=(1,)`) → a linear `temporal_fc` → residual, LayerNorm → attention over
space (each frame's patches: `attention_axes=(2, 3)`) → residual, LayerNorm → MLP (GELU) → residual; a final
LayerNorm. Differences: no class token (the head segments every pixel rather than classifying the clip: a (1, 16, 16)
transposed convolution from the tokens to pixel logits), and no dropout or drop path (both 0 in the published
configuration's training of its base model).

Split over time, the attention over time is a ring of the devices that hold the frames
(trainer/parallel/ring_attention.py); the attention over space is each device's own.
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import keras
from keras import layers

PUBLISHED = {"embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4, "patch": 16}
TINY = {"embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2, "patch": 8}


class SpaceTimeEmbedding(layers.Layer):
    """`pos_embed` (one per patch of a frame) and `time_embed` (one per frame), added; truncated normal 0.02."""

    def build(self, input_shape):
        _, frames, height, width, channels = input_shape
        init = keras.initializers.TruncatedNormal(stddev=0.02)
        self.space = self.add_weight(shape=(1, 1, height, width, channels), initializer=init)
        self.time = self.add_weight(shape=(1, frames, 1, 1, channels), initializer="zeros")

    def call(self, tokens):
        return tokens + self.space + self.time


def _attention(x, heads: int, axes, name: str):
    channels = x.shape[-1]
    normed = layers.LayerNormalization(epsilon=1e-6)(x)
    return layers.MultiHeadAttention(heads, channels // heads, attention_axes=axes, name=name)(normed, normed)


def _block(x, heads: int, mlp_ratio: int, name: str):
    channels = x.shape[-1]
    time = layers.Dense(channels, name=f"{name}_temporal_fc")(_attention(x, heads, (1,), f"{name}_time"))
    x = layers.Add()([x, time])
    x = layers.Add()([x, _attention(x, heads, (2, 3), f"{name}_space")])
    y = layers.Dense(channels * mlp_ratio, activation="gelu")(layers.LayerNormalization(epsilon=1e-6)(x))
    return layers.Add()([x, layers.Dense(channels)(y)])


def timesformer(num_classes=2, in_channels=3, clip=(8, 224, 224), embed_dim=768, depth=12, num_heads=12,
                mlp_ratio=4, patch=16):
    """TimeSformer (divided space-time) on clips of `clip` = (frames, height, width), per-pixel logits."""
    inputs = keras.Input((*clip, in_channels))
    x = layers.Conv3D(embed_dim, (1, patch, patch), strides=(1, patch, patch), name="patch_embed")(inputs)
    x = SpaceTimeEmbedding()(x)
    for index in range(depth):
        x = _block(x, num_heads, mlp_ratio, f"block{index}")
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    logits = layers.Conv3DTranspose(num_classes, (1, patch, patch), strides=(1, patch, patch), name="head")(x)
    return keras.Model(inputs, logits, name="timesformer")


def published(num_classes=2, in_channels=3, clip=(8, 224, 224)):
    return timesformer(num_classes, in_channels, clip, **PUBLISHED)


def tiny(num_classes=2, in_channels=3, clip=(8, 16, 16)):
    return timesformer(num_classes, in_channels, clip, **TINY)
