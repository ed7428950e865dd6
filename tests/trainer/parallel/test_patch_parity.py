"""Partitioned parity in patch mode: the step on a batch of crops, split 2×2 ways (depth and height), equals one
device's (the whole-volume splits are tests/trainer/parallel/test_parity.py's)."""

import jax
import numpy as np
import pytest

from preprocessing.records import tfrecord_schema
from tests.trainer.parallel import test_parity as parity
from trainer.data import ct_batches, ct_input

pytestmark = pytest.mark.slow  # compiles the tiny UNet's step twice


def test_a_patch_batch_steps_alike_split_or_not(demo_data):
    dims = (1, 2, 2, 1, 1)
    records = ct_input.CtRecords(demo_data["train"])
    batches = ct_batches.CtBatches(records, 2, seed=1, steps=1, cache="off", patch=(8, 8, 8))
    batch = next(batches)
    images = tfrecord_schema.dequantize(batch.inputs["image"], batch.inputs["scale"][:, None, None, None, None])
    labels = batch.labels.astype(np.int32)
    batches.close()
    records.close()
    assert images.shape == (2, 8, 8, 8, 1) and labels.max() > 0  # crops, one of them on foreground
    model, state = parity._model_and_state(3)
    reference = parity._loss_and_grads(model, state, (1, 1, 1, 1, 1), jax.devices()[:1], images, labels)
    loss, grads, placed, _ = parity._loss_and_grads(model, state, dims, jax.devices()[:int(np.prod(dims))], images,
                                                   labels)
    assert len(placed.sharding.device_set) == int(np.prod(dims))
    parity._assert_parity(loss, grads, reference[0], reference[1])
