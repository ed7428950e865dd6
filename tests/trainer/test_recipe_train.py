"""nnU-Net's recipe trains end to end: SGD with Nesterov momentum, the poly schedule, deep supervision, a residual
encoder; evaluation and the exported model see the full-resolution logits only."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import train

from trainer import presets
from trainer.engine import checkpoints
from trainer.models import deep_supervision, unet
from trainer.parallel import partitioning


@pytest.mark.slow
def test_nnunet_recipe_with_a_residual_encoder_trains_evaluates_and_exports_one_tensor(demo_data, tmp_path):
    model = unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=8, deep_supervision=True,
                            encoder="residual", residual_blocks=(1, 1, 2))  # the stem: 16³ folds to 8³, then 4³, 2³
    config = presets.nnunet(train_data=demo_data["train"], eval_data=demo_data["eval"], output_dir=str(tmp_path),
                               model=model, steps=6, batch_size=8, checkpoint_every=6, log_every=1,
                               partition=partitioning.PartitionConfig((1, 1, 1, 1, 1)))
    results = train.train(config, log=lambda line: None)

    # nnU-Net's poly rate, 1e-2 × (1 − t/T)^0.9, at each logged step t (0-based) of T = 6.
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    np.testing.assert_allclose([h["learning_rate"] for h in history],
                               [1e-2 * (1 - t / 6) ** 0.9 for t in range(6)], rtol=1e-5)
    assert all(np.isfinite(h["loss"]) for h in history)
    assert len(results["dice_per_class"]) == 3 and results["cases"] == 2  # scored through the one forward pass

    # SGD's state was checkpointed (one momentum per weight, no Adam moments) and exported with the same optimizer.
    arrays = checkpoints.load_arrays(str(tmp_path / "checkpoints"), 6)
    trainable = [k for k in arrays if k.startswith("trainable")]
    assert len([k for k in arrays if k.startswith("optimizer")]) == len(trainable) + 1  # the step count, momenta

    image = np.random.default_rng(0).normal(size=(1, 16, 16, 16, 1)).astype(np.float32)
    loaded = keras.saving.load_model(results["model"]["keras"])
    assert isinstance(loaded, deep_supervision.DeepSupervision)
    assert tuple(loaded(image).shape) == (1, 16, 16, 16, 3)
    assert [tuple(o.shape) for o in loaded(image, training=True)] == [(1, 16, 16, 16, 3), (1, 8, 8, 8, 3)]
    served = tf.saved_model.load(results["model"]["saved_model"])  # kept: its variables live as long as it does
    np.testing.assert_allclose(served.serve(tf.constant(image)).numpy(), np.asarray(loaded(image)), rtol=1e-4,
                               atol=1e-4)
