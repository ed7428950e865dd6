"""The receptive field is measured from the network: a known small network's field is its hand-computed value."""

import keras
import pytest

from trainer.models import receptive_field


def _known_network():
    """Depth sees 1 + 2 + 4 = 7 voxels, height 1 + 2 + 2 = 5, width 1 + 0 + 2 = 3 (kernel radius × dilation per
    convolution), whatever instance normalization in between does to every voxel through its statistics."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, None, None, 1))
    x = keras.layers.Conv3D(8, (3, 3, 1), padding="same")(inputs)
    x = keras.layers.GroupNormalization(groups=-1)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv3D(8, (3, 3, 3), padding="same", dilation_rate=(2, 1, 1))(x)
    x = keras.layers.GroupNormalization(groups=-1)(x)
    outputs = keras.layers.Conv3D(2, 1)(keras.layers.ReLU()(x))
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("size", [(16, 12, 12), pytest.param((48, 40, 40), marks=pytest.mark.slow)])  # whole; per axis
def test_a_known_network_sees_its_hand_computed_field(size):
    field = receptive_field.measure(_known_network(), size, (1, 1, 1))
    assert field.seen == (7, 5, 3) and field.size == size and not field.covers
    assert str(field) == (f"each output voxel sees 7 of {size[0]} voxels of depth, 5 of {size[1]} of height, "
                          f"3 of {size[2]} of width")


def test_a_field_wider_than_the_volume_is_all_of_it():
    assert str(receptive_field.measure(_known_network(), (4, 4, 2), (1, 1, 1))) == (
        "each output voxel sees all 4 voxels of depth, all 4 of height, all 2 of width")


def test_a_narrow_unet_is_not_measured_through_one_inputs_dead_relus():
    """A 4-filter UNet (seed 3): for the first random input every path to the centre voxel along the width has an
    inactive ReLU, so that input's gradient said the width field is 1 voxel; the union over several inputs says 18,
    the field along depth and height, and so does that one input now that a ReLU passes the gradient whether it is
    active or not (the union alone still missed an axis in about one plan in 17)."""
    from trainer.models import unet

    keras.utils.set_random_seed(3)
    model = unet.build_unet(unet.UNetConfig(num_levels=2, base_filters=4, stem="none"))
    field = receptive_field.measure(model, (64, 64, 64), (2, 2, 2))
    assert field.seen == (18, 18, 18)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    low, high = receptive_field.support(lambda x: model.stateless_call(trainable, non_trainable, x)[0],
                                        (8, 8, 64, 1), samples=1)[2]
    assert high - low + 1 == 18  # what one input alone said before: 1


def test_a_network_of_a_fixed_input_size_is_probed_at_that_size(monkeypatch):
    """A network built for exactly the data's shape takes nothing else: the per-axis probe's thin inputs failed in
    Keras. Volumes above the whole-volume limit are measured per axis, so the limit is lowered."""
    monkeypatch.setattr(receptive_field, "WHOLE_VOLUME_VOXELS", 100)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 10, 14, 1))  # fixed: the data's shape
    x = keras.layers.Conv3D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Reshape((12, 10, 14, 4))(keras.layers.Flatten()(x))  # only this size passes
    outputs = keras.layers.Conv3D(2, 3, padding="same")(x)
    field = receptive_field.measure(keras.Model(inputs, outputs), (12, 10, 14), (1, 1, 1))
    assert field.seen == (5, 5, 5) and field.size == (12, 10, 14)


def test_a_network_of_attention_windows_is_probed_at_sizes_its_windows_tile(monkeypatch):
    """Windows of 4 at a quarter of the resolution need 16 voxels across; the strides alone say 4, and the probe's
    8-voxel-thin inputs failed in the windows' reshape. It is probed at 16 (a divisor of 32) instead."""
    from tests.trainer import user_networks

    monkeypatch.setattr(receptive_field, "WHOLE_VOLUME_VOXELS", 0)  # axis by axis, as a larger volume is measured
    keras.utils.set_random_seed(0)
    field = receptive_field.measure(user_networks.windowed_attention(), (16, 16, 32), (4, 4, 4))
    assert field.size == (16, 16, 32) and field.seen[:2] == (16, 16) and 16 <= field.seen[2] < 32
