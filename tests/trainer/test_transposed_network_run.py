"""A user's nnU-Net-like network with `Conv3DTranspose(kernel 2, stride 2)` decoders, GroupNorm and residual blocks
(tests/trainer/user_networks.py:transposed_decoder, a file outside trainer/), trained by `fullres train --model`
split 1,2,1,1,1 without --allow-gathers: it starts (no activation all-gathers), its losses equal the one-device
run's, and its `model.keras` loads in a plain Keras process (no fullres import) and predicts what fullres's
partitioned forward pass (`inference.VolumePredictor`, which `fullres predict` runs) predicts.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # two short trainings in fresh processes and a plain Keras process

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETWORKS = os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py")
PLAIN_KERAS = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
import keras, numpy as np
model = keras.saving.load_model(sys.argv[1])
logits = np.asarray(model.predict(np.load(sys.argv[2]), verbose=0))
np.save(sys.argv[3], np.asarray(keras.ops.softmax(logits, axis=-1)))
assert not any(name.split(".")[0] in ("trainer", "fullres") for name in sys.modules), "fullres was imported"
"""


def _train(demo_data, network, output, dims, devices):
    """`fullres train` in a fresh process (started, not waited for: the two runs train side by side)."""
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "train", "--train", demo_data["train"], "--output", str(output),
         "--model", f"{network}:transposed_decoder", "--preset", "smoke", "--steps", "3", "--no-augment",
         "--input-partition-dims", dims, "--virtual-devices", str(devices)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, cwd=REPOSITORY)


def _finished(process):
    stdout, stderr = process.communicate(timeout=900)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def runs(demo_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("transposed")
    network = folder / "net.py"
    shutil.copy(NETWORKS, network)
    split = _train(demo_data, network, folder / "split", "1,2,1,1,1", 2)
    whole = _train(demo_data, network, folder / "whole", "1,1,1,1,1", 1)
    return folder, _finished(split), _finished(whole)


def _losses(run):
    with open(run / "history.jsonl") as file:
        return [json.loads(line)["loss"] for line in file]


def test_trains_split_without_allow_gathers_and_equals_one_device(runs):
    folder, split, whole = runs
    assert split.returncode == 0, split.stdout[-2000:] + split.stderr[-3000:]
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-3000:]
    assert "all-gathers" not in split.stdout + split.stderr
    split_losses, whole_losses = _losses(folder / "split"), _losses(folder / "whole")
    assert len(split_losses) == len(whole_losses) == 3
    for a, b in zip(split_losses, whole_losses):
        assert abs(a - b) / abs(b) <= 1e-4, (split_losses, whole_losses)


def test_model_keras_predicts_in_plain_keras_as_fullres_does(runs, tmp_path):
    import jax

    from trainer import trained_run
    from trainer.engine import inference

    folder, split, _ = runs
    assert split.returncode == 0
    volume = np.random.default_rng(0).normal(size=(16, 16, 16, 1)).astype(np.float32)  # (D, H, W, C)
    np.save(tmp_path / "volume.npy", volume[None])
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    result = subprocess.run([sys.executable, "-c", PLAIN_KERAS, str(folder / "split" / "model.keras"),
                             str(tmp_path / "volume.npy"), str(tmp_path / "plain.npy")],
                            capture_output=True, text=True, env=environment, cwd=str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = np.load(tmp_path / "plain.npy")[0]
    loaded = trained_run.load(str(folder / "split"), jax.devices()[:2], (1, 2, 1, 1, 1))
    predictor = inference.VolumePredictor(loaded.model, loaded.state, loaded.config.partition, jax.devices()[:2],
                                          loaded.config.model.downsampling_levels)
    ours = predictor.probabilities(volume)
    assert ours.shape == plain.shape == (16, 16, 16, 3)
    assert np.abs(ours - plain).max() <= 1e-5
