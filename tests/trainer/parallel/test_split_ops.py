"""The split formulations equal Keras's and JAX's own ops, and replace them only under a spatial split.

`subpixel.conv_transpose` against `keras.ops.conv_transpose` over kernels, strides, paddings, output paddings and
dilations in 1D, 2D and 3D; `interpolation.resize` against `jax.image.resize`; `split_ops` routes the ops only
inside `splitting()` or under a `SpatialParallel` that splits space (test_split_layers.py checks the compiled steps).
"""


import jax
import keras
import numpy as np
import pytest
from keras.src.backend.common import backend_utils

from trainer.parallel import device_mesh, interpolation, split_ops, subpixel

# (spatial dims, kernel, stride, padding, output padding, dilation): kernel = stride (nnU-Net, UNETR), kernel > stride
# (MONAI's k3 s2 "same"), output padding, dilation with stride 1, an uneven output ("valid", k3 s2: 2n + 1).
# (A sweep of 330 such combinations in 1D, 2D and 3D matched when this was written; these keep the kinds.)
TRANSPOSED = [(3, 2, 2, "valid", None, 1), (3, 3, 2, "same", None, 1), (2, 3, 2, "same", 1, 1),
              (2, 3, 2, "valid", None, 1), (2, 3, 1, "same", None, 2), (1, 5, 3, "same", 2, 1)]


@pytest.mark.parametrize("d, k, s, padding, output_padding, dilation", TRANSPOSED)
def test_subpixel_equals_keras_conv_transpose(d, k, s, padding, output_padding, dilation):
    rng = np.random.default_rng(k * 100 + s * 10 + d)
    x = rng.normal(size=(2, *(5, 4, 3)[:d], 3)).astype(np.float32)  # (B, n..., C)
    w = rng.normal(size=(*(k,) * d, 4, 3)).astype(np.float32)  # (k..., filters, C), Keras's layout
    expected = np.asarray(keras.ops.conv_transpose(x, w, s, padding, output_padding, dilation_rate=dilation))
    paddings = backend_utils.compute_conv_transpose_padding_args_for_jax(x.shape, w.shape, s, padding,
                                                                         output_padding, dilation)
    got = np.asarray(jax.jit(subpixel.conv_transpose, static_argnums=(2, 3, 4))(x, w, s, tuple(paddings), dilation))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


# Outputs that are not stride × the input, their phases computed in a multiple of each axis's split (2-way, 2×2,
# 4-way, 2×2×2): "valid" kernel 3 stride 2 (2n + 1), with output padding 1 (2n + 2), "same" with output padding 0
# (kernel 4: 2n − 2), stride 3 "valid" kernel 5 with output padding 2.
UNEVEN = [(2, 3, 2, "valid", None, (2, 1)), (2, 3, 2, "valid", 1, (2, 2)), (2, 4, 2, "same", 0, (4, 1)),
          (3, 3, 2, "valid", None, (2, 2, 2)), (1, 5, 3, "valid", 2, (4,))]


@pytest.mark.parametrize("d, k, s, padding, output_padding, multiples", UNEVEN)
def test_subpixel_with_phases_in_a_multiple_of_the_split_equals_keras(d, k, s, padding, output_padding, multiples):
    rng = np.random.default_rng(k * 100 + s * 10 + d)
    x = rng.normal(size=(2, *(8, 4, 4)[:d], 3)).astype(np.float32)  # (B, n..., C), n a multiple of the split
    w = rng.normal(size=(*(k,) * d, 4, 3)).astype(np.float32)
    expected = np.asarray(keras.ops.conv_transpose(x, w, s, padding, output_padding))
    paddings = backend_utils.compute_conv_transpose_padding_args_for_jax(x.shape, w.shape, s, padding,
                                                                         output_padding, 1)
    function = jax.jit(subpixel.conv_transpose, static_argnums=(2, 3, 4, 5, 6))
    got = np.asarray(function(x, w, s, tuple(paddings), 1, True, multiples))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_spatial_parts_are_the_split_of_each_axis():
    assert split_ops.spatial_parts(3) == (1, 1, 1)  # nothing split
    with split_ops.splitting((1, 2, 4, 1, 1)):
        assert split_ops.spatial_parts(3) == (2, 4, 1)
        assert split_ops.spatial_parts(2) == (4, 4)  # another rank: a multiple of every axis's split
    keras.distribution.set_distribution(device_mesh.SpatialParallel((1, 1, 2, 1), devices=jax.devices()[:2]))
    try:
        assert split_ops.spatial_parts(2) == (1, 2)
    finally:
        keras.distribution.set_distribution(None)


def test_subpixel_channels_first():
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 3, 5, 4)).astype(np.float32), rng.normal(size=(3, 3, 4, 3)).astype(np.float32)
    expected = np.asarray(keras.ops.conv_transpose(x, w, 2, "same", data_format="channels_first"))
    paddings = backend_utils.compute_conv_transpose_padding_args_for_jax((2, 5, 4, 3), w.shape, 2, "same", None, 1)
    np.testing.assert_allclose(np.asarray(subpixel.conv_transpose(x, w, 2, paddings, channels_last=False)), expected,
                               atol=1e-4)


@pytest.mark.parametrize("shape, size, method", [
    ((1, 4, 6, 2), (1, 8, 18, 2), "bilinear"), ((2, 5, 3, 4, 2), (2, 10, 6, 12, 2), "trilinear"),
    ((1, 4, 4, 2), (1, 8, 12, 2), "nearest")])
def test_interpolation_equals_jax_image_resize(shape, size, method):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    assert interpolation.supported(shape, size, method)
    expected = np.asarray(split_ops._ORIGINAL.get("resize", jax.image.resize)(x, size, method))
    got = jax.jit(interpolation.resize, static_argnums=(1, 2))(x, size, method)  # one program, not one per op
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape, size, method", [((1, 8, 8, 2), (1, 12, 12, 2), "linear"),
                                                 ((1, 8, 8, 2), (1, 4, 4, 2), "linear"),
                                                 ((1, 8, 8, 2), (1, 16, 16, 2), "cubic")])
def test_interpolation_leaves_other_resizes_to_jax(shape, size, method):
    assert not interpolation.supported(shape, size, method)


def _conv_transpose_program():
    x, w = np.zeros((1, 4, 4, 2), np.float32), np.zeros((2, 2, 3, 2), np.float32)
    return str(jax.make_jaxpr(lambda x, w: keras.ops.conv_transpose(x, w, 2))(x, w))


def test_the_ops_are_replaced_only_under_a_split():
    split_ops.install()
    assert "lhs_dilation=(2, 2)" in _conv_transpose_program()  # Keras's own: an input-dilated convolution
    with split_ops.splitting((1, 2, 1, 1)):
        assert split_ops.active() and "lhs_dilation=(2, 2)" not in _conv_transpose_program()
    with split_ops.splitting((1, 1, 1, 1)):
        assert not split_ops.active()
    for dims, split in (((1, 1, 1, 1), False), ((1, 2, 1, 1), True), ((1, 1, 2, 1), True)):
        keras.distribution.set_distribution(device_mesh.SpatialParallel(dims, devices=jax.devices()[:2]))
        try:
            assert split_ops.active() is split
            assert ("lhs_dilation=(2, 2)" not in _conv_transpose_program()) is split
        finally:
            keras.distribution.set_distribution(None)
    assert not split_ops.active()
