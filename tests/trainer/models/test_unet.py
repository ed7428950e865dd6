"""UNet shapes in 2D and 3D, and every constructor check."""

import numpy as np
import pytest

from trainer.models import unet, unet_layers


@pytest.mark.parametrize(
    "spatial_dims, levels, normalization, input_shape, stem",
    [
        pytest.param(3, 3, "instance", (2, 16, 32, 8, 1), "none", marks=pytest.mark.slow),
        (3, 2, "batch", (1, 8, 8, 8, 2), "none"),
        (3, 1, "none", (1, 5, 7, 3, 1), "none"),
        pytest.param(2, 4, "group", (2, 32, 16, 1), "none", marks=pytest.mark.slow),
        (2, 3, "instance", (1, 64, 64, 3), "none"),
        (3, 2, "instance", (1, 8, 12, 16, 1), "space_to_depth"),
        (3, 1, "batch", (2, 2, 4, 6, 2), "space_to_depth"),
        (2, 2, "group", (1, 16, 8, 3), "space_to_depth"),
    ],
)
def test_output_shape(spatial_dims, levels, normalization, input_shape, stem):
    config = unet.UNetConfig(
        spatial_dims=spatial_dims, num_classes=4, in_channels=input_shape[-1], num_levels=levels,
        base_filters=8, normalization=normalization, stem=stem,
    )
    model = unet.build_unet(config)
    logits = model(np.zeros(input_shape, np.float32))
    assert tuple(logits.shape) == (*input_shape[:-1], 4)
    assert logits.dtype == "float32"


@pytest.mark.slow
def test_mixed_bfloat16_keeps_float32_weights_and_logits():
    model = unet.build_unet(unet.UNetConfig(num_levels=2, base_filters=4), dtype="mixed_bfloat16")
    assert all(w.dtype == "float32" for w in model.weights)
    assert model.get_layer("down0").steps[0].compute_dtype == "bfloat16"
    assert model(np.zeros((1, 8, 8, 8, 1), np.float32)).dtype == "float32"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("spatial_dims", 4, r"UNetConfig.spatial_dims must be 2 or 3, got 4"),
        ("num_classes", 1, r"UNetConfig.num_classes must be >= 2 \(background \+ one class\), got 1"),
        ("in_channels", 0, r"UNetConfig.in_channels must be >= 1, got 0"),
        ("num_levels", 0, r"UNetConfig.num_levels must be >= 1, got 0"),
        ("base_filters", 0, r"UNetConfig.base_filters must be >= 1, got 0"),
        ("normalization", "layer", r"UNetConfig.normalization must be one of .*'instance'.*, got 'layer'"),
    ],
)
def test_config_refuses_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        unet.UNetConfig(**{field: value})


def test_group_normalization_needs_filters_divisible_by_groups():
    with pytest.raises(ValueError, match=r"8 groups, so base_filters must be a multiple of 8, got 12"):
        unet.UNetConfig(normalization="group", base_filters=12)


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_subpixel_upsampling_is_a_stride_2_transposed_convolution(spatial_dims):
    """Same function as Conv{2,3}DTranspose(kernel 2, stride 2) once the weights are mapped across."""
    import keras

    rng = np.random.default_rng(0)
    in_channels, filters = 3, 5
    shape = (2, *([4, 5, 3][:spatial_dims]), in_channels)
    x = rng.normal(size=shape).astype(np.float32)
    transpose_layer = (keras.layers.Conv3DTranspose if spatial_dims == 3 else keras.layers.Conv2DTranspose)(
        filters, 2, strides=2)
    expected = np.asarray(transpose_layer(x))
    kernel, bias = (np.asarray(w) for w in transpose_layer.weights)  # (2,)*d + (filters, in_channels), (filters,)
    layer = unet_layers.SubpixelUpsampling(filters, spatial_dims)
    layer.build(shape)
    offsets = kernel.reshape(2**spatial_dims, filters, in_channels)  # offset index (a, b[, c]) in C order
    projection = np.transpose(offsets, (2, 0, 1)).reshape(in_channels, 2**spatial_dims * filters)
    layer.projection.kernel.assign(projection.reshape((1,) * spatial_dims + projection.shape))
    layer.projection.bias.assign(np.tile(bias, 2**spatial_dims))
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-5)


def test_remat_checkpoints_every_conv_block():
    import jax
    import keras

    from trainer.engine import program, step
    from trainer.models import losses

    config = unet.UNetConfig(num_levels=3, base_filters=4)
    images, labels = np.zeros((1, 8, 8, 8, 1), np.float32), np.zeros((1, 8, 8, 8), np.int32)
    counts = []
    for remat in (False, True):
        keras.utils.set_random_seed(0)
        model = unet.build_unet(config, remat=remat)
        state = program.initial_state(model, keras.optimizers.SGD(0.1))
        lowered = jax.jit(step.make_loss_and_grads(model, losses.dice_cross_entropy)).lower(state, images, labels)
        counts.append(lowered.as_text().count("optimization_barrier"))
    assert counts == [0, 5]  # 3 down blocks + 2 decode blocks


def test_the_default_model_is_tpu_shaped():
    """Every activation of the default model is at least 128 channels wide (a TPU's lane count), at half resolution.

    What that buys on a TPU is a compiler's figure, measured by benchmarks/partitioning/seed_configs.py (libtpu, 2-3 minutes a
    compile here): at 256³ split 16 ways the default takes 1.26× the CPU plan's memory per v5e core, the plain UNet
    7.96×. The target tier compiled the default at 64³ on every run until 2026-11-26 (181-320 s, the longest test in
    the suite); this layout check guards the cause, the benchmark the figure."""
    config = unet.UNetConfig()
    assert (config.stem, config.num_levels, config.base_filters, config.downsampling_levels) == (
        "space_to_depth", 3, 128, 3)
    model = unet.build_unet(config)
    widths = {layer.name: layer.output.shape[-1] for layer in model.layers if layer.name.startswith(("down", "decode"))}
    assert min(widths.values()) == 128 and widths["down2"] == 512
    assert tuple(model(np.zeros((1, 16, 16, 16, 1), np.float32)).shape) == (1, 16, 16, 16, 3)


def test_space_to_depth_folds_blocks_that_subpixel_upsampling_unfolds():
    """The stem's fold is the exact inverse of the logits' unfold (SubpixelUpsampling with an identity projection)."""
    images = np.random.default_rng(0).normal(size=(2, 4, 6, 8, 3)).astype(np.float32)
    folded = unet_layers.SpaceToDepth(3)(images)
    assert tuple(folded.shape) == (2, 2, 3, 4, 24)
    # Voxel (d, h, w) of block (0, 0, 0), channel c, lands at channel ((d·2 + h)·2 + w)·3 + c.
    np.testing.assert_array_equal(np.asarray(folded)[0, 0, 0, 0].reshape(2, 2, 2, 3), images[0, :2, :2, :2])
    unfold = unet_layers.SubpixelUpsampling(3, 3)
    unfold.build(folded.shape)
    unfold.projection.kernel.assign(np.eye(24, dtype=np.float32)[None, None, None])
    unfold.projection.bias.assign(np.zeros(24, np.float32))
    np.testing.assert_array_equal(np.asarray(unfold(folded)), images)


@pytest.mark.parametrize(
    "num_levels, stem, weights",
    [(3, "space_to_depth", (2 / 3, 1 / 3)), (4, "none", (2 / 3, 1 / 3)), (5, "none", (4 / 7, 2 / 7, 1 / 7))],
)
def test_deep_supervision_weights_are_nnunets(num_levels, stem, weights):
    """1/2^i per decoder output, the lowest one 0, normalized (nnunetv2 nnUNetTrainer._build_loss)."""
    config = unet.UNetConfig(num_levels=num_levels, base_filters=4, stem=stem, deep_supervision=True)
    np.testing.assert_allclose(config.output_weights, weights)


def test_deep_supervision_builds_the_outputs_it_weighs_and_infers_with_the_first():
    config = unet.UNetConfig(num_levels=3, base_filters=4, deep_supervision=True)  # stem: outputs at 1, 1/2 (1/4: 0)
    model = unet.build_unet(config)
    image = np.zeros((1, 16, 16, 16, 1), np.float32)
    assert [tuple(o.shape) for o in model(image, training=True)] == [(1, 16, 16, 16, 3), (1, 8, 8, 8, 3)]
    assert tuple(model(image).shape) == (1, 16, 16, 16, 3)


def test_deep_supervision_without_a_lower_resolution_to_supervise_is_refused():
    with pytest.raises(ValueError, match=r"3 levels without the stem give 2, and nnU-Net weighs the lowest 0; use "
                                         r"num_levels 4 or more"):
        unet.UNetConfig(num_levels=3, stem="none", deep_supervision=True)


@pytest.mark.parametrize(
    "field, value, message",
    [("encoder", "dense", r"UNetConfig.encoder must be one of \('plain', 'residual'\), got 'dense'"),
     ("residual_blocks", (1, 2), r"residual_blocks needs a count of 1 or more for each of the 3 levels")],
)
def test_residual_encoder_settings_are_checked(field, value, message):
    with pytest.raises(ValueError, match=message):
        unet.UNetConfig(**{"num_levels": 3, "encoder": "residual", field: value})
