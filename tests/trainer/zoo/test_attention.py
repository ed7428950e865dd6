"""Attention split in space: Swin's window attention whose windows tile each device's block
splits with no all-gather; shifted windows (`keras.ops.roll` on a split axis) cross the blocks with halo
exchanges (collective-permutes), not gathers. Global self-attention over all tokens (UNETR's ViT,
`keras.layers.MultiHeadAttention`) splits as a ring (test_ring_attention.py); what still gathers (a `Flatten` into
a dense layer over space, as here) is named and refused. Each split step equals the one-device step within 1e-5.
"""

import keras
import pytest
from keras import layers

from tests.trainer.parallel.test_parity import TOLERANCE
from tests.trainer.zoo import step, swin_unetr
from trainer.plan import gathers

pytestmark = pytest.mark.slow  # compiles two or three small training steps a test

SIZE = (16, 16, 8)  # split 2×2 along D and H: 8×8 voxels a device, two 4³ windows along each


def window_network(shift: int):
    def build(num_classes=3, in_channels=1):
        inputs = keras.Input((None, None, None, in_channels))
        x = layers.Conv3D(8, 3, padding="same")(inputs)
        x = layers.Add()([x, swin_unetr.WindowAttention3D(2, 4, shift, name="window_attention")(
            layers.LayerNormalization()(x))])
        return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x))
    return build


def flattening_network(num_classes=3, in_channels=1):
    """Tokens flattened into one dense layer over space: global by nature, gathered."""
    inputs = keras.Input(SIZE + (in_channels,))
    tokens = layers.Flatten()(layers.Conv3D(2, 4, strides=4)(inputs))  # (B, 64)
    x = layers.Reshape((4, 4, 2, 2))(layers.Dense(64, name="dense_over_space")(tokens))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(layers.UpSampling3D(4)(x)))


def _split_and_reference(function, split):
    images, labels = step.example(SIZE)
    return step.run(function, step.SPLITS[split], images, labels), step.run(function, (1,) * 5, images, labels)


def _assert_parity(split, reference):
    assert abs(split.loss - reference.loss) / abs(reference.loss) <= TOLERANCE
    assert step.worst_gradient(split, reference) <= TOLERANCE


def test_windows_inside_each_devices_block_attend_there_and_shifted_ones_cross_by_halo_exchange():
    plain, plain_reference = _split_and_reference(window_network(shift=0), "2x2")
    assert plain.gathered == [], [(g.layer, g.describe()) for g in plain.gathered]
    _assert_parity(plain, plain_reference)
    shifted, shifted_reference = _split_and_reference(window_network(shift=2), "2x2")
    assert shifted.gathered == [], [(g.layer, g.describe()) for g in shifted.gathered]
    assert shifted.permutes > plain.permutes  # the roll and its reverse (and their gradients) move halos
    _assert_parity(shifted, shifted_reference)


def test_a_dense_layer_over_space_is_gathered_and_named():
    result, reference = _split_and_reference(flattening_network, "2")
    assert result.gathered and {g.layer.split("/")[0] for g in result.gathered} == {"dense_over_space"}
    _assert_parity(result, reference)  # a gather costs memory, not correctness
    with pytest.raises(gathers.GathersRefused, match="layer dense_over_space"):
        gathers.refuse(result.gathered, step.SPLITS["2"])
