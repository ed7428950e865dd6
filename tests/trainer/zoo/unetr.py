"""MONAI's UNETR in Keras 3, ported from its published configuration, not from fullres's layers.

Source: Project-MONAI/MONAI, `monai/networks/nets/unetr.py` (`UNETR`) with `networks/nets/vit.py` (`ViT`),
`networks/blocks/patchembedding.py` (`PatchEmbeddingBlock`, "conv" embedding, learned position embedding),
`transformerblock.py` / `selfattention.py` / `mlp.py` (pre-norm blocks: LayerNorm → multi-head self-attention over
every token → residual, LayerNorm → MLP with GELU → residual) and `unetr_block.py` (`UnetrBasicBlock`,
`UnetrPrUpBlock`, `UnetrUpBlock`), `dynunet_block.py` (`UnetResBlock`, `UnetOutBlock`); the class's defaults:
`feature_size=16`, `hidden_size=768`, `mlp_dim=3072`, `num_heads=12`, 12 transformer layers, 16³ patches,
InstanceNorm (no affine parameters) and LeakyReLU (0.01) in the convolutional blocks, `res_block=True`.

Structure kept: the ViT encoder on 16³ patches (a k=16, s=16 convolution, a reshape to (B, N, hidden) in D·H·W
order, a learned position embedding per token, global attention over all N tokens), its hidden states
`hidden_states_out[3]`, `[6]` and `[9]` (of 12: a quarter, half and three quarters of the depth) and its normalized output reshaped back to the
patch grid; the input's residual conv block; those states brought up to 1/8, 1/4 and 1/2 resolution by k=2, s=2
transposed convolutions with residual blocks (2, 1 and 0 further up-steps); four decoders of a k=2, s=2 transposed
conv, concatenation with the skip and a residual block; a 1×1×1 output conv. Differences: Keras's
`MultiHeadAttention` has one `use_bias` for its four projections, MONAI's `qkv_bias=False` leaves the query, key
and value projections without bias but the output's with one (here all four have one).
The position embedding makes the input size part of the network (`img_size`), as in MONAI.
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import keras
from keras import layers

PUBLISHED = {"feature_size": 16, "hidden_size": 768, "mlp_dim": 3072, "num_heads": 12, "num_layers": 12,
             "patch": 16}
TINY = {"feature_size": 4, "hidden_size": 16, "mlp_dim": 32, "num_heads": 2, "num_layers": 4, "patch": 16}


def _norm(x):
    return layers.GroupNormalization(groups=-1, center=False, scale=False, epsilon=1e-5)(x)  # InstanceNorm3d


def _res_block(x, filters: int):
    """`UnetResBlock`: conv3 → norm → LeakyReLU → conv3 → norm, + (1×1×1 conv → norm where channels change)."""
    residual = x
    y = layers.LeakyReLU(0.01)(_norm(layers.Conv3D(filters, 3, padding="same", use_bias=False)(x)))
    y = _norm(layers.Conv3D(filters, 3, padding="same", use_bias=False)(y))
    if x.shape[-1] != filters:
        residual = _norm(layers.Conv3D(filters, 1, use_bias=False)(x))
    return layers.LeakyReLU(0.01)(layers.Add()([y, residual]))


def _up(x, filters: int):
    return layers.Conv3DTranspose(filters, 2, strides=2, use_bias=False)(x)


def _pr_up_block(x, filters: int, num_layer: int):
    """`UnetrPrUpBlock`: an up-step, then `num_layer` more, each with a residual block."""
    x = _up(x, filters)
    for _ in range(num_layer):
        x = _res_block(_up(x, filters), filters)
    return x


def _up_block(x, skip, filters: int):
    """`UnetrUpBlock`: an up-step, the skip concatenated, a residual block."""
    return _res_block(layers.Concatenate()([_up(x, filters), skip]), filters)


class PositionEmbedding(layers.Layer):
    """A learned embedding per token, added (`PatchEmbeddingBlock.position_embeddings`, truncated normal 0.02)."""

    def build(self, input_shape):
        self.embedding = self.add_weight(shape=(1, *input_shape[1:]),
                                         initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, tokens):
        return tokens + self.embedding


def _transformer_block(x, hidden: int, mlp_dim: int, heads: int, name: str):
    normed = layers.LayerNormalization(epsilon=1e-5)(x)
    x = layers.Add()([x, layers.MultiHeadAttention(heads, hidden // heads, name=f"{name}_attention")(normed, normed)])
    y = layers.Dense(mlp_dim, activation="gelu")(layers.LayerNormalization(epsilon=1e-5)(x))
    return layers.Add()([x, layers.Dense(hidden)(y)])


def unetr(num_classes=14, in_channels=1, img_size=(96, 96, 96), feature_size=16, hidden_size=768, mlp_dim=3072,
          num_heads=12, num_layers=12, patch=16):
    """MONAI's `UNETR(in_channels, out_channels, img_size, ...)`, channels last."""
    grid = tuple(s // patch for s in img_size)
    inputs = keras.Input((*img_size, in_channels))
    tokens = layers.Conv3D(hidden_size, patch, strides=patch, name="patch_embedding")(inputs)
    x = PositionEmbedding()(layers.Reshape((-1, hidden_size))(tokens))
    states = []
    for index in range(num_layers):
        x = _transformer_block(x, hidden_size, mlp_dim, num_heads, f"vit_block{index}")
        states.append(x)
    x = layers.LayerNormalization(epsilon=1e-5)(x)

    def grid_of(t):
        return layers.Reshape((*grid, hidden_size))(t)

    quarter, half, three_quarters = (states[num_layers * k // 4] for k in (1, 2, 3))
    enc1 = _res_block(inputs, feature_size)
    enc2 = _pr_up_block(grid_of(quarter), feature_size * 2, 2)
    enc3 = _pr_up_block(grid_of(half), feature_size * 4, 1)
    enc4 = _pr_up_block(grid_of(three_quarters), feature_size * 8, 0)
    dec = _up_block(grid_of(x), enc4, feature_size * 8)
    dec = _up_block(dec, enc3, feature_size * 4)
    dec = _up_block(dec, enc2, feature_size * 2)
    dec = _up_block(dec, enc1, feature_size)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(dec), name="unetr")


def published(num_classes=14, in_channels=1, img_size=(96, 96, 96)):
    return unetr(num_classes, in_channels, img_size, **PUBLISHED)


def tiny(num_classes=3, in_channels=1, img_size=(64, 32, 32)):
    return unetr(num_classes, in_channels, img_size, **TINY)


def published_256(num_classes=14, in_channels=1):
    """The published UNETR on 256³ volumes (16³ patches: 4,096 tokens), as `fullres plan --image-size 256,256,256`
    sizes it (docs/planning.md)."""
    return published(num_classes, in_channels, (256, 256, 256))
