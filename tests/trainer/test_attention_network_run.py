"""A user's network with global multi-head self-attention over a volume's 3D tokens
(tests/trainer/user_networks.py:global_attention, UNETR in small, attending over the grid of tokens) trains split in space without --allow-gathers,
through `fullres train --model` split 1,2,1,1,1 and 1,2,2,1,1 and through `fullres.SpatialParallel` with
`model.fit`, as the one-device run does; fullres's partitioned predictor then predicts a whole volume with it.
The attention is a ring (trainer/parallel/ring_attention.py); test_ring_attention.py in the zoo holds the float64
parity of its steps.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest

import fullres
from tests.trainer import user_networks
from tests.trainer.test_transposed_network_run import NETWORKS, REPOSITORY

pytestmark = pytest.mark.slow  # three short trainings in fresh processes


def _train(demo_data, network, output, dims, devices):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "train", "--train", demo_data["train"], "--output", str(output),
         "--model", f"{network}:global_attention", "--preset", "smoke", "--steps", "3", "--no-augment",
         "--input-partition-dims", dims, "--virtual-devices", str(devices)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, cwd=REPOSITORY)


def _losses(run):
    with open(run / "history.jsonl") as file:
        return [json.loads(line)["loss"] for line in file]


@pytest.fixture(scope="module")
def runs(demo_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("attention")
    network = folder / "net.py"
    shutil.copy(NETWORKS, network)
    started = {name: _train(demo_data, network, folder / name, dims, devices)
               for name, dims, devices in (("whole", "1,1,1,1,1", 1), ("two", "1,2,1,1,1", 2),
                                           ("two_by_two", "1,2,2,1,1", 4))}
    finished = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=900)
        finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return folder, finished


@pytest.mark.parametrize("name", ["two", "two_by_two"])
def test_trains_split_without_allow_gathers_and_equals_one_device(runs, name):
    folder, finished = runs
    for run in (finished["whole"], finished[name]):
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "all-gathers" not in finished[name].stdout + finished[name].stderr
    split, whole = _losses(folder / name), _losses(folder / "whole")
    assert len(split) == len(whole) == 3
    for a, b in zip(split, whole):
        assert abs(a - b) / abs(b) <= 1e-4, (split, whole)


def test_the_split_model_predicts_a_whole_volume_as_one_device_does(runs):
    from trainer import trained_run
    from trainer.engine import inference

    folder, finished = runs
    assert finished["two_by_two"].returncode == 0
    volume = np.random.default_rng(0).normal(size=(32, 16, 16, 1)).astype(np.float32)  # larger than training's
    predicted = {}
    for dims, devices in (((1, 2, 2, 1, 1), 4), ((1, 1, 1, 1, 1), 1)):
        loaded = trained_run.load(str(folder / "two_by_two"), jax.devices()[:devices], dims)
        predictor = inference.VolumePredictor(loaded.model, loaded.state, loaded.config.partition,
                                              jax.devices()[:devices], loaded.config.model.downsampling_levels)
        predicted[devices] = predictor.probabilities(volume)
    assert predicted[4].shape == (32, 16, 16, 3)
    assert np.abs(predicted[4] - predicted[1]).max() <= 1e-5


def _fit(dims):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 16, 16, 16, 1)).astype(np.float32)
    labels = rng.integers(0, 3, size=(2, 16, 16, 16)).astype(np.int32)
    keras.distribution.set_distribution(fullres.SpatialParallel(dims, label_partition_dims=dims[:-1],
                                                                devices=jax.devices()[:int(np.prod(dims))]))
    try:
        model = user_networks.global_attention()
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(images, labels, batch_size=1, epochs=2, shuffle=False, verbose=0)
        return history.history["loss"], np.asarray(model.predict(images[:1], verbose=0))
    finally:
        keras.distribution.set_distribution(None)


def test_model_fit_under_spatial_parallel_equals_one_device():
    (split_losses, split_logits), (losses, logits) = _fit((1, 2, 2, 1, 1)), _fit((1, 1, 1, 1, 1))
    np.testing.assert_allclose(split_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(split_logits, logits, rtol=1e-4, atol=1e-5)
