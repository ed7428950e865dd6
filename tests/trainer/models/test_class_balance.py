"""The class-balanced cross-entropy of whole-volume runs: its weights, its default, its checks."""

import math

import numpy as np
import pytest

from trainer import config as config_lib

from trainer import config_resolution

from trainer import presets
from trainer.models import losses


def _cross_entropy(logits, labels, balance):
    return float(losses.dice_cross_entropy(logits, labels, dice_weight=0.0, class_balance=balance))


def test_balance_one_weighs_every_present_class_alike_and_zero_is_the_plain_mean():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 4, 4, 3)).astype(np.float32)
    labels = np.zeros((2, 4, 4, 4), np.int64)
    labels[0, :2] = 1  # 32 voxels of class 1, 2 of class 2, 94 of background
    labels[1, 0, 0, :2] = 2
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    voxel = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    per_class = [voxel[labels == c].mean() for c in range(3)]
    assert math.isclose(_cross_entropy(logits, labels, 1.0), np.mean(per_class), rel_tol=1e-5)
    assert math.isclose(_cross_entropy(logits, labels, 0.0), voxel.mean(), rel_tol=1e-5)
    counts = np.array([np.sum(labels == c) for c in range(3)], np.float64)
    weights = counts[labels] ** -0.5
    assert math.isclose(_cross_entropy(logits, labels, 0.5), np.sum(weights * voxel) / np.sum(weights), rel_tol=1e-5)


def test_the_recipe_balances_whole_volumes_and_leaves_patches_and_a_given_value_alone():
    assert losses.class_balance(None, whole_volumes=True) == losses.WHOLE_VOLUME_CLASS_BALANCE
    assert losses.class_balance(None, whole_volumes=False) == 0.0  # patches: a third centred on foreground instead
    assert losses.class_balance(0.25, whole_volumes=True) == 0.25
    assert config_resolution.resolve(preset="demo", overrides={"class_balance": "1"}).class_balance == 1.0
    old_run = config_lib.to_dict(presets.demo())
    del old_run["class_balance"]  # a train_config.json from before the class balance: it trained the plain cross-entropy
    assert config_lib.from_dict(old_run).class_balance == 0.0


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan])
def test_a_balance_outside_zero_to_one_is_refused_in_one_sentence(value):
    with pytest.raises(ValueError, match=r"^TrainConfig.class_balance must be in \[0, 1\] or None, got "):
        presets.demo(class_balance=value)
