"""Global self-attention over a volume's tokens, split in space: `keras.layers.MultiHeadAttention` over
every token, as UNETR's ViT, computes as a ring (`trainer/parallel/ring_attention.py`): the split training step
all-gathers no activation, its keys and values travel by collective-permutes, and it equals the one-device step
to float64 rounding (≤ 1e-12) split 2, 4 and 2×2, float32 within the zoo's 1e-5; each device's attention scores
are a fraction of the unsplit layer's.
"""

import jax
import keras
import numpy as np
import pytest
from keras import layers

import fullres
from tests.trainer.parallel.test_parity import TOLERANCE
from tests.trainer.zoo import step

pytestmark = pytest.mark.slow  # compiles two small training steps a test (8-30 s each on the shared machine)

SIZE = (16, 16, 8)  # 4³ patches: a 4×4×2 grid of 32 tokens


def flat_tokens(num_classes=3, in_channels=1):
    """UNETR's encoder in small: 4³ patches embedded by a strided conv, flattened to (B, N, C), every token
    attending to every other, reshaped back to the grid and upsampled."""
    inputs = keras.Input(SIZE + (in_channels,))
    tokens = layers.Conv3D(8, 4, strides=4)(inputs)  # (B, 4, 4, 2, 8)
    flat = layers.Reshape((-1, 8))(tokens)  # (B, 32, 8)
    attended = layers.MultiHeadAttention(2, 4, name="global_attention")(flat, flat)
    x = layers.UpSampling3D(4)(layers.Reshape((4, 4, 2, 8))(layers.Add()([flat, attended])))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x))


def grouped_query_tokens(num_classes=3, in_channels=1):
    """The same flattened tokens under grouped-query attention: 4 query heads sharing 2 key and value heads."""
    inputs = keras.Input(SIZE + (in_channels,))
    tokens = layers.Conv3D(8, 4, strides=4)(inputs)  # (B, 4, 4, 2, 8)
    flat = layers.Reshape((-1, 8))(tokens)  # (B, 32, 8)
    attended = layers.GroupQueryAttention(4, 4, 2, name="global_attention")(flat, flat)
    x = layers.UpSampling3D(4)(layers.Reshape((4, 4, 2, 8))(layers.Add()([flat, attended])))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x))


def grid_tokens(num_classes=3, in_channels=1):
    """The same attention over the grid of tokens as it lies (`attention_axes` = the three spatial axes)."""
    inputs = keras.Input(SIZE + (in_channels,))
    tokens = layers.Conv3D(8, 4, strides=4)(inputs)  # (B, 4, 4, 2, 8)
    attended = layers.MultiHeadAttention(2, 4, attention_axes=(1, 2, 3), name="global_attention")(tokens, tokens)
    x = layers.UpSampling3D(4)(layers.Add()([tokens, attended]))
    return keras.Model(inputs, layers.Conv3D(num_classes, 1)(x))


def _both(function, split, dtype):
    images, labels = step.example(SIZE)
    return (step.run(function, step.SPLITS[split], images, labels, dtype=dtype),
            step.run(function, (1,) * 5, images, labels, dtype=dtype))


@pytest.mark.parametrize("split", ["2", "4", "2x2"])
def test_global_attention_over_flattened_tokens_is_a_ring_equal_to_one_device(split):
    result, reference = _both(flat_tokens, split, "float64")
    assert result.gathered == [], [(g.layer, g.describe()) for g in result.gathered]
    parts = int(np.prod(step.SPLITS[split]))
    # The ring: parts − 1 steps of keys and values forward, and their gradients back.
    assert result.permutes >= 2 * (parts - 1)
    assert abs(result.loss - reference.loss) / abs(reference.loss) <= 1e-12
    assert step.worst_gradient(result, reference) <= 1e-12


def test_grouped_query_heads_are_a_ring_too():
    """Keras's `GroupQueryAttention` repeats each key and value head for its query heads, on each device's own
    tokens, before the attention: the ring takes it as it takes `MultiHeadAttention`."""
    result, reference = _both(grouped_query_tokens, "2", "float64")
    assert result.gathered == [], [(g.layer, g.describe()) for g in result.gathered]
    assert result.permutes >= 2
    assert abs(result.loss - reference.loss) / abs(reference.loss) <= 1e-12
    assert step.worst_gradient(result, reference) <= 1e-12


def test_attention_over_the_grid_keeps_each_axis_split_without_moving_a_block():
    """Flattened tokens split 2×2 are re-blocked by all-to-alls before the ring (each device's tokens are not
    contiguous in D·H·W order); attention over the grid as it lies needs none."""
    result, reference = _both(grid_tokens, "2x2", "float64")
    assert result.gathered == [] and result.all_to_alls == 0
    assert abs(result.loss - reference.loss) / abs(reference.loss) <= 1e-12
    assert step.worst_gradient(result, reference) <= 1e-12


def test_float32_ring_is_within_the_zoos_tolerance():
    result, reference = _both(flat_tokens, "2", "float32")
    assert result.gathered == []
    assert abs(result.loss - reference.loss) / abs(reference.loss) <= TOLERANCE
    assert step.worst_gradient(result, reference) <= TOLERANCE


def _temp_bytes(dims, tokens_side=8):
    """Per-device temporary bytes of the training step (loss and gradients) of one attention layer over
    tokens_side³ tokens of 4 channels, 4 heads: the scores dominate."""
    distribution = fullres.SpatialParallel(dims, devices=jax.devices()[:int(np.prod(dims))])
    keras.distribution.set_distribution(distribution)
    try:
        inputs = keras.Input((tokens_side,) * 3 + (4,))
        flat = layers.Reshape((-1, 4))(inputs)
        model = keras.Model(inputs, layers.MultiHeadAttention(4, 4)(flat, flat))
        trainable = [v.value for v in model.trainable_variables]

        def loss(trainable, x):
            return keras.ops.mean(keras.ops.square(model.stateless_call(trainable, [], x)[0]))

        x = jax.ShapeDtypeStruct((1, *(tokens_side,) * 3, 4), np.float32,
                                 sharding=distribution.get_data_layout((1, 8, 8, 8, 4)).backend_layout)
        compiled = jax.jit(jax.grad(loss)).lower(trainable, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes
    finally:
        keras.distribution.set_distribution(None)


def test_each_devices_scores_are_a_fraction_of_the_unsplit_layers():
    unsplit = _temp_bytes((1, 1, 1, 1, 1))
    assert unsplit >= 4 * 512 * 512 * 4  # one layer's scores: 4 heads × 512² float32 (4 MiB)
    assert _temp_bytes((1, 2, 1, 1, 1)) <= 0.6 * unsplit
