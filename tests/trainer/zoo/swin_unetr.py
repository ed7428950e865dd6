"""MONAI's SwinUNETR in Keras 3, ported from its published configuration, not from fullres's layers.

Source: Project-MONAI/MONAI, `monai/networks/nets/swin_unetr.py` (`SwinUNETR`, `SwinTransformer`, `BasicLayer`,
`SwinTransformerBlock`, `WindowAttention`, `PatchMerging`, `compute_mask`) with `networks/blocks/unetr_block.py`
(`UnetrBasicBlock`, `UnetrUpBlock`) and `dynunet_block.py` (`UnetResBlock`, `UnetOutBlock`); the class's defaults:
`feature_size=24`, `depths=(2, 2, 2, 2)`, `num_heads=(3, 6, 12, 24)`, window 7, patch 2, MLP ratio 4, qkv bias,
`normalize=True`, InstanceNorm (no affine parameters) and LeakyReLU (0.01) in the convolutional blocks.

Structure kept: a stride-2 patch embedding (k=2 conv); Swin stages of blocks alternating plain and shifted windows
(shift window // 2, the shifted blocks masked where rolled regions meet, as `compute_mask`), each block LayerNorm →
window attention with a relative position bias → residual, LayerNorm → MLP (GELU) → residual; patch merging (the 8
voxels of each 2×2×2 cell concatenated → LayerNorm → linear to twice the channels); every stage's output normalized
without affine parameters (`proj_out`); residual conv encoders on the input and each stage's features; decoders of
a k=2, s=2 transposed conv, concatenation with the skip and a residual conv block; a 1×1×1 output conv.

Windows are kept as axes, (B, D/w, H/w, W/w, w³, C), not flattened into the batch: where windows tile a device's
block, the attention is local to each device. Sizes that are not whole windows are zero-padded after the norm, as
MONAI's.
Self-contained (Keras only): a run keeps a copy of this one file.
"""

import itertools

import keras
import numpy as np
from keras import layers, ops

PUBLISHED = {"feature_size": 24, "depths": (2, 2, 2, 2), "num_heads": (3, 6, 12, 24), "window": 7}
TINY = {"feature_size": 12, "depths": (2, 2), "num_heads": (2, 4), "window": 2}


def _relative_position_index(window: int) -> np.ndarray:
    """(w³, w³) indices into the ((2w−1)³, heads) bias table, as Swin's."""
    coords = np.stack(np.meshgrid(*[np.arange(window)] * 3, indexing="ij")).reshape(3, -1)  # (3, w³)
    relative = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + window - 1  # (w³, w³, 3)
    return (relative[..., 0] * (2 * window - 1) ** 2 + relative[..., 1] * (2 * window - 1) + relative[..., 2])


def _shift_mask(size, window: int, shift: int) -> np.ndarray:
    """(D/w, H/w, W/w, w³, w³): 0 where two voxels of a shifted window came from the same region, −100 elsewhere."""
    regions = np.zeros(size, np.int32)
    count = 0
    cuts = (slice(-window), slice(-window, -shift), slice(-shift, None))
    for d, h, w in itertools.product(cuts, cuts, cuts):
        regions[d, h, w] = count
        count += 1
    n = [s // window for s in size]
    windows = regions.reshape(n[0], window, n[1], window, n[2], window).transpose(0, 2, 4, 1, 3, 5)
    windows = windows.reshape(*n, window**3)
    return np.where(windows[..., :, None] != windows[..., None, :], -100.0, 0.0).astype(np.float32)


class WindowAttention3D(layers.Layer):
    """Swin's (shifted) window multi-head self-attention over (B, D, H, W, C), windows of `window`³ voxels."""

    def __init__(self, heads: int, window: int, shift: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.window, self.shift = heads, window, shift

    def build(self, input_shape):
        channels = input_shape[-1]
        self.qkv = layers.Dense(3 * channels, name="qkv")
        self.qkv.build(input_shape)
        self.proj = layers.Dense(channels, name="proj")
        self.proj.build(input_shape)
        self.bias_table = self.add_weight(shape=((2 * self.window - 1) ** 3, self.heads), name="bias_table",
                                          initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, x):
        size = x.shape[1:4]
        window = min(self.window, *size)  # MONAI's get_window_size: no larger than the volume
        shift = self.shift if min(size) > self.window else 0
        padded = tuple(-(-s // window) * window for s in size)  # MONAI pads to whole windows (zeros, after the norm)
        if padded != tuple(size):
            x = ops.pad(x, [(0, 0)] + [(0, p - s) for p, s in zip(padded, size)] + [(0, 0)])
        depth, height, width, channels = *padded, x.shape[-1]
        if shift:
            x = ops.roll(x, (-shift, -shift, -shift), axis=(1, 2, 3))
        n = (depth // window, height // window, width // window)
        tokens = window**3
        x = ops.reshape(x, (-1, n[0], window, n[1], window, n[2], window, channels))
        x = ops.transpose(x, (0, 1, 3, 5, 2, 4, 6, 7))  # (B, nD, nH, nW, w, w, w, C)
        x = ops.reshape(x, (-1, *n, tokens, channels))
        head_dim = channels // self.heads
        qkv = ops.reshape(self.qkv(x), (-1, *n, tokens, 3, self.heads, head_dim))
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]  # (B, nD, nH, nW, N, heads, d)
        scores = ops.einsum("bxyzqhd,bxyzkhd->bxyzhqk", q * head_dim**-0.5, k)
        index = _relative_position_index(window).reshape(-1)
        bias = ops.reshape(ops.take(self.bias_table, index, axis=0), (tokens, tokens, self.heads))
        scores = scores + ops.transpose(bias, (2, 0, 1))  # (heads, N, N)
        if shift:
            scores = scores + _shift_mask((depth, height, width), window, shift)[:, :, :, None]
        out = ops.einsum("bxyzhqk,bxyzkhd->bxyzqhd", ops.softmax(scores, axis=-1), v)
        out = self.proj(ops.reshape(out, (-1, *n, tokens, channels)))
        out = ops.reshape(out, (-1, *n, window, window, window, channels))
        out = ops.transpose(out, (0, 1, 4, 2, 5, 3, 6, 7))  # (B, nD, w, nH, w, nW, w, C)
        out = ops.reshape(out, (-1, depth, height, width, channels))
        out = ops.roll(out, (shift, shift, shift), axis=(1, 2, 3)) if shift else out
        return out[:, :size[0], :size[1], :size[2], :] if padded != tuple(size) else out

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "heads": self.heads, "window": self.window, "shift": self.shift}


class PatchMerging(layers.Layer):
    """The 8 voxels of each 2×2×2 cell side by side in the channels: (B, D, H, W, C) -> (B, D/2, H/2, W/2, 8C)."""

    def call(self, x):
        return ops.concatenate([x[:, i::2, j::2, k::2, :] for i, j, k in itertools.product(range(2), repeat=3)], -1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *(None if s is None else s // 2 for s in input_shape[1:4]), 8 * input_shape[4])


def _layer_norm(x, affine: bool = True):
    return layers.LayerNormalization(epsilon=1e-5, center=affine, scale=affine)(x)


def _swin_block(x, heads: int, window: int, shift: int):
    channels = x.shape[-1]
    x = layers.Add()([x, WindowAttention3D(heads, window, shift)(_layer_norm(x))])
    y = layers.Dense(4 * channels, activation="gelu")(_layer_norm(x))
    return layers.Add()([x, layers.Dense(channels)(y)])


def _instance_norm(x):
    return layers.GroupNormalization(groups=x.shape[-1], epsilon=1e-5, center=False, scale=False)(x)


def _res_block(x, filters: int):
    """MONAI's UnetResBlock: conv → norm → LeakyReLU → conv → norm, the shortcut 1×1×1 conv → norm, add, LeakyReLU."""
    shortcut = x if x.shape[-1] == filters else _instance_norm(layers.Conv3D(filters, 1, use_bias=False)(x))
    y = layers.LeakyReLU(0.01)(_instance_norm(layers.Conv3D(filters, 3, padding="same", use_bias=False)(x)))
    y = _instance_norm(layers.Conv3D(filters, 3, padding="same", use_bias=False)(y))
    return layers.LeakyReLU(0.01)(layers.Add()([y, shortcut]))


def _up_block(x, skip, filters: int):
    """MONAI's UnetrUpBlock: transposed conv (k=2, s=2), concatenate the skip, a residual block."""
    x = layers.Conv3DTranspose(filters, 2, strides=2, use_bias=False)(x)
    return _res_block(layers.Concatenate()([x, skip]), filters)


def swin_unetr(num_classes: int, in_channels: int, feature_size: int, depths, num_heads, window: int,
               name: str = "swin_unetr") -> keras.Model:
    """SwinUNETR: a Swin transformer encoder of len(depths) stages (/2 patches, then /2 a stage), a conv decoder."""
    if len(depths) != len(num_heads):
        raise ValueError(f"depths and num_heads need one entry a stage, got {len(depths)} and {len(num_heads)}")
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(feature_size, 2, strides=2, name="patch_embed")(inputs)
    hidden = [_layer_norm(x, affine=False)]  # proj_out(x, normalize=True)
    for depth, heads in zip(depths, num_heads):
        for index in range(depth):
            x = _swin_block(x, heads, window, 0 if index % 2 == 0 else window // 2)
        x = layers.Dense(2 * x.shape[-1], use_bias=False)(_layer_norm(PatchMerging()(x)))
        hidden.append(_layer_norm(x, affine=False))
    stages = len(depths)
    skips = [_res_block(inputs, feature_size)] + [_res_block(h, h.shape[-1]) for h in hidden[:stages - 1]]
    skips.append(hidden[stages - 1])  # the deepest skip goes to the decoder as it is (MONAI's hidden_states_out[3])
    x = _res_block(hidden[stages], hidden[stages].shape[-1])  # encoder10
    for skip in reversed(skips):
        x = _up_block(x, skip, skip.shape[-1])
    return keras.Model(inputs, layers.Conv3D(num_classes, 1, name="out")(x), name=name)


def build(num_classes=3, in_channels=1):
    """MONAI's default SwinUNETR: feature size 24, 4 stages of 2 blocks, 3 to 24 heads, 7³ windows (/32)."""
    return swin_unetr(num_classes, in_channels, **PUBLISHED)


def tiny(num_classes=3, in_channels=1):
    """The same blocks at test size: feature size 12, 2 stages of 2 blocks (one plain, one shifted), 2³ windows (/8)."""
    return swin_unetr(num_classes, in_channels, **TINY, name="swin_unetr_tiny")
