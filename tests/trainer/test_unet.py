"""UNet shapes in 2D and 3D, and every constructor check."""

import numpy as np
import pytest

from trainer import unet


@pytest.mark.parametrize(
    "spatial_dims, levels, normalization, input_shape",
    [
        (3, 3, "instance", (2, 16, 32, 8, 1)),
        (3, 2, "batch", (1, 8, 8, 8, 2)),
        (3, 1, "none", (1, 5, 7, 3, 1)),
        (2, 4, "group", (2, 32, 16, 1)),
        (2, 3, "instance", (1, 64, 64, 3)),
    ],
)
def test_output_shape(spatial_dims, levels, normalization, input_shape):
    config = unet.UNetConfig(
        spatial_dims=spatial_dims, num_classes=4, in_channels=input_shape[-1], num_levels=levels,
        base_filters=8, normalization=normalization,
    )
    model = unet.build_unet(config)
    logits = model(np.zeros(input_shape, np.float32))
    assert tuple(logits.shape) == (*input_shape[:-1], 4)
    assert logits.dtype == "float32"


def test_mixed_bfloat16_keeps_float32_weights_and_logits():
    model = unet.build_unet(unet.UNetConfig(num_levels=2, base_filters=4), dtype="mixed_bfloat16")
    assert all(w.dtype == "float32" for w in model.weights)
    assert model.get_layer("down0_conv1").compute_dtype == "bfloat16"
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
