"""`fullres train --model FILE.py:FUNCTION`, then `fullres predict --model RUN` in a fresh process, with the file gone.

The network (tests/trainer/user_networks.py:flattening) mixes its whole pooled volume through a Dense layer, which
XLA can only compute by all-gathering the flattened activation: training refuses it in one sentence naming that
layer and its bytes per device, before the run folder is written, and trains it with --allow-gathers. The run keeps
a copy of the file, so predict rebuilds the network after the original is moved away.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

pytestmark = pytest.mark.slow  # trains a network and predicts with it in a fresh process

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETWORKS = os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py")
# No resampling (spacing None): the 16³ scan reaches the network, whose input is 16³, as it is.
PREPROCESSING = {"spacing": None, "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct", "shape": None}


def _train(demo_data, network_file, output, *more):
    from typer.testing import CliRunner

    from pipelines import cli

    return CliRunner().invoke(cli.app, [
        "train", "--train", demo_data["train"], "--output", str(output), "--model", f"{network_file}:flattening",
        "--preset", "smoke", "--steps", "2", "--input-partition-dims", "1,4,1,1,1", "--no-augment", *more])


@pytest.fixture(scope="module")
def user_run(demo_data, tmp_path_factory):
    """The refused run's output, and the run trained with --allow-gathers (its network's file since removed)."""
    folder = tmp_path_factory.mktemp("user-network")
    network_file = folder / "nets" / "my_net.py"
    network_file.parent.mkdir()
    shutil.copy(NETWORKS, network_file)
    refused = _train(demo_data, network_file, folder / "refused")
    allowed = _train(demo_data, network_file, folder / "run", "--allow-gathers")
    shutil.rmtree(network_file.parent)  # moved away: the run must not need it
    return refused, allowed, folder


def test_a_network_that_gathers_is_refused_before_training_naming_the_layer(user_run):
    refused, _, folder = user_run
    errors = [line for line in refused.stderr.splitlines() if line.startswith("fullres: error:")]
    assert refused.exit_code == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert ("the training step split 1,4,1,1,1 all-gathers whole activations onto every device, which the split "
            "was meant to divide: layer global_mixing (3 all-gathers, the largest f32[1,256], 1.0 KiB per device); "
            "rewrite those layers") in errors[0]
    assert "or pass --allow-gathers to train anyway" in errors[0]
    assert not (folder / "refused").exists() or not os.listdir(folder / "refused")  # nothing written


def test_the_same_network_trains_with_allow_gathers_and_the_run_keeps_its_file(user_run):
    _, allowed, folder = user_run
    assert allowed.exit_code == 0, allowed.stderr[-3000:]
    assert "warning: the training step all-gathers whole activations (--allow-gathers): layer global_mixing (" \
        in allowed.stdout
    run = folder / "run"
    config = json.loads((run / "train_config.json").read_text())
    assert config["model"] == {"file": "model_source.py", "function": "flattening", "spatial_dims": 3,
                               "num_classes": 3, "in_channels": 1}
    assert (run / "model_source.py").read_text() == open(NETWORKS).read()
    assert (run / "model.keras").exists() and (run / "saved_model").is_dir()


def test_predict_in_a_fresh_process_rebuilds_the_network_from_the_runs_copy(user_run, tmp_path):
    _, allowed, folder = user_run
    assert allowed.exit_code == 0
    run = tmp_path / "run"
    shutil.copytree(folder / "run", run)
    info = json.loads((run / "model_info.json").read_text())
    (run / "model_info.json").write_text(json.dumps({**info, "preprocessing": PREPROCESSING}))
    scan = sitk.GetImageFromArray(np.random.default_rng(0).integers(-200, 300, (16, 16, 16)).astype(np.int16))
    sitk.WriteImage(scan, str(tmp_path / "scan.nii.gz"))
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "predict", "--model", str(run), "--input", str(tmp_path / "scan.nii.gz"),
         "--output", str(tmp_path / "masks"), "--virtual-devices", "4"],
        capture_output=True, text=True, env=environment, cwd=str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "masks" / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["input_partition_dims"] == [1, 4, 1, 1, 1]
    mask = sitk.ReadImage(summary["cases"][0]["outputs"][0])
    assert mask.GetSize() == (16, 16, 16) and set(np.unique(sitk.GetArrayViewFromImage(mask))) <= {0, 1, 2}
