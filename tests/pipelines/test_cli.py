"""The `fullres` command: help, and one-sentence errors instead of stack traces."""

import json
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
        (["--input-partition-dims", "1,3,1,1,1"], "asks for 3 cores per replica, which does not divide the 8 devices present"),
        (["--input-partition-dims", "1,4,1,1"], "input_partition_dims [1, 4, 1, 1] has 4 entries but a 3D model takes 5-D inputs"),
        (["--input-partition-dims", "1,4,1,1,1", "--num-levels", "4", "--batch-size", "2"],
         "depth 16 (input_partition_dims[1] = 4) does not fit a model with 3 downsamplings"),
        (["--input-partition-dims", "1,4,1,1,1", "--batch-size", "3"], "global batch size 3 does not divide over 2 replicas"),
        (["--preset", "huge"], "--preset 'huge' is not known"),
        (["--precision", "float16"], "TrainConfig.precision must be one of"),
        (["--task", "detection", "--num-levels", "3"], "--num-levels configure the UNet; they do not apply to --task detection"),
        (["--preset", "detection_demo"], "--preset detection_demo is a detection preset but --task is segmentation"),
        (["--task", "classification"], "--task 'classification' is not known"),
        (["--task", "detection", "--image-size", "256"], "--image-size '256' is not valid"),
        (["--task", "detection", "--preset", "detection_demo", "--input-partition-dims", "1,3,1,1"],
         "asks for 3 cores per replica"),
    ],
)
def test_train_refuses_bad_configuration_in_one_line(demo_data, tmp_path, args, message):
    # In-process (the 8 test devices); the subprocess path is covered by test_train_names_missing_data.
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["train", "--train", demo_data["train"], "--output", str(tmp_path), *args])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_train_refuses_fewer_classes_than_the_data_has(demo_data, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from pipelines import cli

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(demo_data["train"].replace("*", "00000-of-00001"), data)
    (data / "summary.json").write_text(json.dumps({"ok": 6, "failed": 0, "label_values": {"0": 6, "1": 6, "3": 2}}))
    result = CliRunner().invoke(cli.app, ["train", "--train", str(data / "train-*.tfrecord"), "--output",
                                          str(tmp_path / "run"), "--num-classes", "3"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"fullres: error: --num-classes 3 is too small for {data / 'train-*.tfrecord'}: its summary.json lists label "
        "values 0, 1, 3; pass --num-classes 4 or more."
    ]
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_train_names_missing_data(tmp_path):
    result = _fullres("train", "--train", str(tmp_path / "none-*.tfrecord"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no TFRecord files match" in result.stderr and "Traceback" not in result.stderr


def test_preprocess_ct_end_to_end_and_failure_exit(tmp_path):
    written = _fullres("demo-data", "ct", "--output", str(tmp_path / "demo"), "--cases", "2", "--shape", "8,16,16")
    assert written.returncode == 0, written.stderr[-2000:]
    images = tmp_path / "demo" / "nifti" / "images"
    result = _fullres("preprocess", "ct", "--input", str(images), "--labels", str(tmp_path / "demo" / "nifti" / "labels"),
                      "--output", str(tmp_path / "out"), "--spacing", "2,2,4", "--shape", "8,16,16", "--workers", "1",
                      "--num-classes", "3", "--crop", "foreground")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["failed"] == 0
    assert summary["label_values"] == {"0": 2, "1": 2, "2": 2}  # the demo's background, liver and tumour, in both cases
    # Labels asked for but missing: every case fails; exit 2 with one sentence naming the threshold.
    (tmp_path / "nolabels").mkdir()
    result = _fullres("preprocess", "ct", "--input", str(images), "--labels", str(tmp_path / "nolabels"),
                      "--output", str(tmp_path / "out2"), "--workers", "1")
    assert result.returncode == 2
    assert "fullres: error: 2 of 2 inputs failed (100%), more than --max-failed-fraction 0.1" in result.stderr
    assert (tmp_path / "out2" / "dead_letter.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["preprocess", "ct", "--input", "/nonexistent", "--output", "o"], "--input '/nonexistent' does not exist"),
        (["preprocess", "ct", "--input", ".", "--output", "o", "--window", "300,100"],
         "--window needs LOW,HIGH with LOW < HIGH"),
        (["preprocess", "ct", "--input", ".", "--output", "o", "--shape", "1,2"], "--shape '1,2' is not valid"),
        (["preprocess", "ct", "--input", ".", "--output", "o", "--crop", "middle"],
         "--crop 'middle' is not known; use center or foreground."),
        (["preprocess", "ct", "--input", ".", "--output", "o", "--num-classes", "300"],
         "--num-classes must be 1 to 256 (records store class ids as uint8), got 300."),
        (["preprocess", "images", "--annotations", "/no.json", "--images", ".", "--output", "o"],
         "--annotations '/no.json' does not exist"),
    ],
)
def test_preprocess_refuses_bad_arguments_in_one_line(args, message):
    result = _fullres(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_dataflow_workers_get_a_wheel_of_this_checkout():
    import zipfile

    from pipelines import cli

    args = cli._beam_args("DataflowRunner", None, ["--project=p", "--region=europe-west4", "--temp_location=gs://b/t"])
    assert args[:4] == ["--runner=DataflowRunner", "--project=p", "--region=europe-west4", "--temp_location=gs://b/t"]
    wheel = next(a.split("=", 1)[1] for a in args if a.startswith("--extra_package="))
    names = zipfile.ZipFile(wheel).namelist()
    assert "preprocessing/ct_pipeline.py" in names and "preprocessing/example_proto.py" in names
    # A container image given by the user is used as is.
    assert cli._beam_args("DataflowRunner", None, ["--sdk_container_image=img"]) == [
        "--runner=DataflowRunner", "--sdk_container_image=img"]


def test_direct_runner_worker_count():
    from pipelines import cli

    assert "--direct_num_workers=3" in cli._beam_args("DirectRunner", 3, [])
