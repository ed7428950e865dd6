"""Dice + cross-entropy loss and the per-class Dice metric, on cases with known answers."""

import jax.numpy as jnp
import numpy as np
import pytest

from trainer.models import losses
from trainer.tasks import metrics


def _logits_for(labels, num_classes, confidence):
    one_hot = np.eye(num_classes, dtype=np.float32)[labels]  # (B, ..., C)
    return jnp.asarray(one_hot * confidence)


def test_loss_near_zero_for_confident_correct_prediction():
    labels = np.random.default_rng(0).integers(0, 3, size=(2, 4, 4, 4))
    assert float(losses.dice_cross_entropy(_logits_for(labels, 3, 30.0), labels)) < 1e-3


def test_loss_large_for_wrong_prediction():
    labels = np.random.default_rng(0).integers(0, 3, size=(2, 4, 4, 4))
    wrong = (labels + 1) % 3
    loss = float(losses.dice_cross_entropy(_logits_for(wrong, 3, 30.0), labels))
    assert loss > 25.0  # cross-entropy ~30 per voxel plus Dice loss ~1


def test_dice_term_weighs_small_classes():
    """Missing a small class entirely costs the full Dice of that class, whatever its size."""
    labels = np.zeros((1, 8, 8), np.int64)
    labels[0, 0, 0] = 1  # one voxel of class 1
    all_background = _logits_for(np.zeros_like(labels), 2, 30.0)
    with_dice = float(losses.dice_cross_entropy(all_background, labels, dice_weight=1.0))
    without = float(losses.dice_cross_entropy(all_background, labels, dice_weight=0.0))
    assert with_dice - without == pytest.approx(1.0, abs=1e-3)


def test_dice_accumulator_counts_over_batches():
    dice = metrics.DiceAccumulator(num_classes=3)
    dice.update(np.array([[0, 1, 1, 2]]), np.array([[0, 1, 2, 2]]))
    dice.update(np.array([[1, 1]]), np.array([[1, 0]]))
    # class 0: I=1, P=1, T=2 -> 2/3; class 1: I=2, P=4, T=2 -> 4/6; class 2: I=1, P=1, T=2 -> 2/3
    assert dice.per_class() == pytest.approx([2 / 3, 2 / 3, 2 / 3])
    assert dice.foreground_mean() == pytest.approx(2 / 3)


def test_dice_of_absent_class_is_none_and_not_averaged():
    dice = metrics.DiceAccumulator(num_classes=3)
    dice.update(np.array([0, 1, 1]), np.array([0, 1, 1]))
    assert dice.per_class() == [1.0, 1.0, None]
    assert dice.foreground_mean() == 1.0


def test_dice_accumulator_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"predictions \(3,\) and labels \(2,\) differ in shape"):
        metrics.DiceAccumulator(2).update(np.zeros(3), np.zeros(2))


def test_deep_supervision_loss_is_the_weighted_sum_on_nearest_downsampled_labels():
    """Labels at 1/2 take the voxel at odd indices of each axis (torch's nearest-exact, as nnU-Net downsamples)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=(1, 8, 8, 4))
    full, half = rng.normal(size=(1, 8, 8, 4, 3)), rng.normal(size=(1, 4, 4, 2, 3))
    total = losses.deep_supervision([full, half], labels, (2 / 3, 1 / 3))
    expected = 2 / 3 * losses.dice_cross_entropy(full, labels) + 1 / 3 * losses.dice_cross_entropy(
        half, labels[:, 1::2, 1::2, 1::2])
    np.testing.assert_allclose(total, expected, rtol=1e-6)
