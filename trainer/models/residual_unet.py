"""A UNet with a residual encoder, after nnU-Net's ResEnc presets, shaped for TPU lanes like fullres's default UNet.

nnU-Net's `ResidualEncoderUNet` (dynamic_network_architectures; the nnU-Net
ResEnc M/L/XL plans) puts stacks of residual blocks in the encoder (1, 3, 4, 6,
6, 6 blocks from the first stage down), downsamples by a strided first block in
each stage, and keeps a plain decoder. Isensee et al. (2024) measured it among
the strongest 3D segmentation networks as patch and network sizes grow.

Here: the same encoder, on the 2×2×2 space-to-depth stem of the default model
(`UNetConfig.stem`) so every activation is at least `base_filters` (128) wide
and fills a TPU's lanes; the decoder, logits and deep supervision heads are the
plain UNet's (`unet.decode`: two convolutions per level); `unet.build_unet` builds it. Every layer is a
convolution, pooling or reshape, so it partitions spatially with halo exchange
only, as the plain UNet does.
"""

from __future__ import annotations

import functools

import jax
import keras

from trainer.models import unet_layers


@keras.saving.register_keras_serializable(package="fullres")
class ResidualBlock(keras.layers.Layer):
    """nnU-Net's `BasicBlockD`: conv 3 (strided) → norm → ReLU → conv 3 → norm, plus the skip, then ReLU.

    The skip is the input itself, or, where the block changes the resolution
    or the width, average pooling (stride) and a 1×1 convolution with norm
    (the "D" variant: the pooling keeps every input voxel in the skip).

    Example:
        >>> import numpy as np
        >>> block = ResidualBlock(filters=8, spatial_dims=3, normalization="instance", strides=2)
        >>> tuple(block(np.zeros((1, 4, 4, 4, 2), "float32")).shape)
        (1, 2, 2, 2, 8)
    """

    def __init__(self, filters: int, spatial_dims: int, normalization: str, strides: int = 1, remat: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.filters, self.spatial_dims, self.normalization = filters, spatial_dims, normalization
        self.strides, self.remat = strides, remat
        conv = functools.partial(unet_layers.conv_layer, spatial_dims)
        bias = normalization == "none"
        self.conv1 = conv(filters, 3, strides=strides, padding="same", use_bias=bias, name="conv1",
                          dtype=self.dtype_policy)
        self.norm1 = unet_layers.normalization_layer(normalization, "norm1", self.dtype_policy)
        self.conv2 = conv(filters, 3, padding="same", use_bias=bias, name="conv2", dtype=self.dtype_policy)
        self.norm2 = unet_layers.normalization_layer(normalization, "norm2", self.dtype_policy)
        self.pool = self.projection = self.projection_norm = None
        if strides > 1:
            pool = keras.layers.AveragePooling3D if spatial_dims == 3 else keras.layers.AveragePooling2D
            self.pool = pool(strides, name="pool", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.conv1.build(input_shape)
        shape = self.conv1.compute_output_shape(input_shape)
        for layer in (self.norm1, self.conv2, self.norm2):
            if layer is not None:
                layer.build(shape)
        if input_shape[-1] != self.filters:
            conv = functools.partial(unet_layers.conv_layer, self.spatial_dims)
            self.projection = conv(self.filters, 1, use_bias=self.normalization == "none", name="projection",
                                   dtype=self.dtype_policy)
            self.projection.build((*shape[:-1], input_shape[-1]))
            self.projection_norm = unet_layers.normalization_layer(self.normalization, "projection_norm", self.dtype_policy)
            if self.projection_norm is not None:
                self.projection_norm.build(shape)

    def call(self, x, training=None):
        def norm(layer, y):
            if layer is None:
                return y
            return layer(y, training=training) if isinstance(layer, keras.layers.BatchNormalization) else layer(y)

        def forward(x):
            y = keras.ops.relu(norm(self.norm1, self.conv1(x)))
            y = norm(self.norm2, self.conv2(y))
            skip = x if self.pool is None else self.pool(x)
            if self.projection is not None:
                skip = norm(self.projection_norm, self.projection(skip))
            return keras.ops.relu(y + skip)

        return jax.checkpoint(forward)(x) if self.remat else forward(x)

    def compute_output_shape(self, input_shape):
        spatial = tuple(None if n is None else -(-n // self.strides) for n in input_shape[1:-1])
        return (input_shape[0], *spatial, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "spatial_dims": self.spatial_dims,
                "normalization": self.normalization, "strides": self.strides, "remat": self.remat}


def residual_encoder(config, x, dtype: str, remat: bool):
    """The residual encoder of `config` (a `unet.UNetConfig`) on `x` (after the stem, if any): (bottleneck, skips).

    Level l has `config.residual_blocks[l]` residual blocks of `base_filters × 2^l`
    filters; level 0 starts with a 3×3 convolution to `base_filters` (nnU-Net's
    stem convolution), every later level with a stride-2 block. `unet.build_unet`
    builds the rest (`config.encoder == "residual"`).

    Example:
        >>> import numpy as np
        >>> from trainer.models import unet
        >>> config = unet.UNetConfig(num_levels=3, base_filters=8, encoder="residual", residual_blocks=(1, 2, 2))
        >>> model = unet.build_unet(config)
        >>> tuple(model(np.zeros((1, 16, 16, 16, 1), "float32")).shape), model.name
        ((1, 16, 16, 16, 3), 'residual_unet3d')
    """
    conv = functools.partial(unet_layers.conv_layer, config.spatial_dims)
    x = conv(config.base_filters, 3, padding="same", use_bias=config.normalization == "none", name="stem_conv",
             dtype=dtype)(x)
    norm = unet_layers.normalization_layer(config.normalization, "stem_norm", dtype)
    if norm is not None:
        x = norm(x)
    x = keras.layers.ReLU(name="stem_relu", dtype=dtype)(x)
    skips = []
    for level in range(config.num_levels):
        if level > 0:
            skips.append(x)
        for index in range(config.residual_blocks[level]):
            strides = 2 if level > 0 and index == 0 else 1
            x = ResidualBlock(config.base_filters * 2**level, config.spatial_dims, config.normalization, strides, remat,
                              name=f"down{level}_block{index}", dtype=dtype)(x)
    return x, skips
