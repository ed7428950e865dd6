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
