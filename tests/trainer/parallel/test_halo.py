"""A network's windows (`halo.windows`) and the least halo they need (`layout_measure.lower_bound`), checked against
bounds worked out by hand on tiny models (no compiling: fast)."""

import keras
import pytest

from trainer.engine import program
from trainer.parallel import halo
from trainer.plan import layout_measure

F32 = 4


def _windows(layers, image_shape):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(image_shape[1:])
    x = inputs
    for layer in layers:
        x = layer(x)
    model = keras.Model(inputs, x)
    return halo.windows(model, program.initial_state(model, keras.optimizers.SGD(0.1)), image_shape)


@pytest.fixture(scope="module")
def two_convolutions():
    """(1, 8, 8, 2) → 3×3 conv to 3 channels → 3×3 conv to 5 channels → 1×1 conv to 4 channels."""
    return _windows([keras.layers.Conv2D(3, 3, padding="same"), keras.layers.Conv2D(5, 3, padding="same"),
                     keras.layers.Conv2D(4, 1)], (1, 8, 8, 2))


def test_windows_read_from_the_forward_pass(two_convolutions):
    first, second, pointwise = two_convolutions
    assert (first.in_spatial, first.in_channels, first.out_channels) == ((8, 8), 2, 3)
    assert (first.window, first.strides, first.low) == ((3, 3), (1, 1), (1, 1))
    assert not first.needs_gradient  # its input is the image
    assert second.needs_gradient and (second.in_channels, second.out_channels) == (3, 5)
    assert pointwise.window == (1, 1)


def test_bound_for_four_parts_along_height(two_convolutions):
    # shard 2×8; an interior shard needs 1 row above and 1 below: 2 rows × 8 = 16 voxels per channel.
    # first conv: forward only (the image has no gradient): 16 × 2 channels; second: forward 16 × 3 channels
    # and backward 16 × 5 (gradient of its output); the 1×1 conv needs none.
    expected = (16 * 2 + 16 * 3 + 16 * 5) * F32
    assert layout_measure.lower_bound(two_convolutions, (1, 4, 1, 1)) == expected == 640


def test_bound_for_two_by_two(two_convolutions):
    # shard 4×4; with 2 parts per axis each shard has one neighbour per axis: (4+1)² − 4² = 9 voxels per channel.
    assert layout_measure.lower_bound(two_convolutions, (1, 2, 2, 1)) == 9 * (2 + 3 + 5) * F32


def test_unsplit_needs_no_halo_and_replicas_split_the_batch(two_convolutions):
    assert layout_measure.lower_bound(two_convolutions, (1, 1, 1, 1)) == 0
    batch_two = [w.__class__(**{**w.__dict__, "batch": 2}) for w in two_convolutions]
    assert layout_measure.lower_bound(batch_two, (1, 4, 1, 1)) == 2 * 640
    assert layout_measure.lower_bound(batch_two, (1, 4, 1, 1), replicas=2) == 640


def test_strided_convolution_reaches_one_side():
    # 3×3 stride 2 'same' on 8 rows pads (0, 1): a shard needs only the next row (forward). Backward (a second
    # layer, so the gradient is formed): the input gradient of rows [a, a+L) needs output rows reaching 1 back.
    (strided,) = _windows([keras.layers.Conv2D(3, 3, strides=2, padding="same")], (1, 8, 8, 1))
    assert strided.low == (0, 0) and strided.strides == (2, 2)
    # 4 parts along height: shard 2×8, 1 extra row (below) = 8 voxels × 1 channel.
    assert layout_measure.lower_bound([strided], (1, 4, 1, 1)) == 8 * F32
    learned = halo.Window(**{**strided.__dict__, "needs_gradient": True})
    # backward: output shard 1×4; (3 − 1 − 0) // 2 = 1 row before it, none after: 4 voxels × 3 channels.
    assert layout_measure.lower_bound([learned], (1, 4, 1, 1)) == (8 + 4 * 3) * F32


def test_pooling_windows_that_overlap_count_and_disjoint_ones_do_not():
    windows = _windows([keras.layers.Conv2D(2, 1), keras.layers.MaxPooling2D(2),
                        keras.layers.MaxPooling2D(3, strides=2, padding="same")], (1, 16, 16, 1))
    pools = [w for w in windows if w.window != (1, 1)]
    assert [p.window for p in pools] == [(2, 2), (3, 3)]
    assert layout_measure.lower_bound(pools[:1], (1, 2, 1, 1)) == 0  # 2×2 stride 2: each window inside one shard
    assert layout_measure.lower_bound(pools[1:], (1, 2, 1, 1)) > 0
