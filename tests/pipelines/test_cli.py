"""The `fullres` command: help, and one-sentence errors instead of stack traces."""

import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fullres(*args):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, env=environment, cwd=REPOSITORY
    )


def test_help_lists_commands():
    result = _fullres("--help")
    assert result.returncode == 0
    assert "train" in result.stdout and "demo" in result.stdout


def test_train_help_documents_partitioning():
    result = _fullres("train", "--help")
    assert result.returncode == 0
    assert "--input-partition-dims" in result.stdout and "--virtual-devices" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input-partition-dims", "1,3,1,1,1", "--virtual-devices", "4"],
         "asks for 3 cores per replica, which does not divide the 4 devices present"),
        (["--input-partition-dims", "1,4,1,1", "--virtual-devices", "4"],
         "input_partition_dims [1, 4, 1, 1] has 4 entries but a 3D model takes 5-D inputs"),
        (["--input-partition-dims", "1,4,1,1,1", "--virtual-devices", "4", "--num-levels", "4"],
         "depth 16 (input_partition_dims[1] = 4) does not fit a model with 3 downsamplings"),
        (["--preset", "huge"], "--preset 'huge' is not known"),
        (["--precision", "float16"], "TrainConfig.precision must be one of"),
    ],
)
def test_train_refuses_bad_configuration_in_one_line(demo_data, tmp_path, args, message):
    result = _fullres("train", "--train", demo_data["train"], "--output", str(tmp_path), *args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_train_names_missing_data(tmp_path):
    result = _fullres("train", "--train", str(tmp_path / "none-*.tfrecord"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no TFRecord files match" in result.stderr and "Traceback" not in result.stderr
