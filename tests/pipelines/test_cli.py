"""The `fullres` command: help, and one-sentence errors instead of stack traces."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from tests.files import snapshot

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fullres(*args):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    environment["COLUMNS"] = "80"  # what CI's captured output gets: every option name must still show whole
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, env=environment, cwd=REPOSITORY
    )


@pytest.mark.slow
def test_help_lists_commands():
    result = _fullres("--help")
    assert result.returncode == 0
    assert "train" in result.stdout and "demo" in result.stdout


@pytest.mark.slow
def test_train_help_documents_partitioning():
    result = _fullres("train", "--help")
    assert result.returncode == 0
    assert "--input-partition-dims" in result.stdout and "--virtual-devices" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input-partition-dims", "1,3,1,1,1"], "asks for 3 cores per replica, which does not divide the 8 devices present"),
        (["--input-partition-dims", "1,4,1,1"], "input_partition_dims [1, 4, 1, 1] has 4 entries but a 3D model takes 5-D inputs"),
        (["--input-partition-dims", "1,4,1,1,1", "--num-levels", "3", "--batch-size", "2"],
         "depth 16 (input_partition_dims[1] = 4) does not fit a model with 3 downsamplings"),
        (["--input-partition-dims", "1,4,1,1,1", "--batch-size", "3"], "global batch size 3 does not divide over 2 replicas"),
        # a split of the batch is named as such, not as a batch that its replicas cannot share
        (["--input-partition-dims", "2,1,1,1,1", "--batch-size", "3"], "input_partition_dims[0] = 2 partitions the batch"),
        (["--preset", "huge"], "--preset 'huge' is not known"),
        (["--precision", "float16"], "--precision float16: precision must be one of"),  # the option typed, not the field
        (["--task", "detection", "--num-levels", "3"], "--num-levels configure the UNet; they do not apply to --task detection"),
        (["--preset", "detection_demo"], "--preset detection_demo is a detection preset but --task is segmentation"),
        (["--task", "classification"], "--task 'classification' is not known"),
        (["--task", "detection", "--image-size", "256"], "--image-size '256' is not valid"),
        (["--task", "detection", "--preset", "detection_demo", "--input-partition-dims", "1,3,1,1"],
         "asks for 3 cores per replica"),
        (["--set", "partition.input_partition_dims=1,3,1,1,1"], "asks for 3 cores per replica"),
        (["--set", "model.num_level=3"], "unknown setting --set model.num_level=3; valid ones: allow_gathers, augment, augmentation, augmentation.blur_probability"),
        (["--set", "steps"], "--set 'steps' is not key=value"),
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


@pytest.mark.slow
def test_train_names_missing_data(tmp_path):
    result = _fullres("train", "--train", str(tmp_path / "none-*.tfrecord"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no TFRecord files match" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.parametrize("command", [["preprocess", "ct", "--input", "{here}", "--output", "{out}"],
                                     ["preprocess", "images", "--annotations", "{here}", "--images", "{here}",
                                      "--output", "{out}"],
                                     ["predict", "--model", "{here}", "--input", "{here}", "--output", "{out}"]])
def test_a_failed_fraction_outside_0_to_1_is_refused_by_every_command(tmp_path, command):
    """-3 was taken as it came (a pipeline's max_failed_fraction=-3 reached preprocess so): one rule, checked first."""
    from typer.testing import CliRunner

    from pipelines import cli

    arguments = [part.format(here=tmp_path, out=tmp_path / "out") for part in command]
    result = CliRunner().invoke(cli.app, [*arguments, "--max-failed-fraction", "-3"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("fullres: error: --max-failed-fraction -3 must be a fraction from 0 to 1 (the share "
                                     "of inputs that may fail before the run counts as failed), e.g. 0.1.")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, sentence", [
    (["--num-shards", "-1"], "--num-shards -1 must be 0 (the runner decides) or more, e.g. --num-shards 16."),
    (["--workers", "0"], "--workers 0 must be 1 or more (leave it out for one per core), e.g. --workers 2."),
])
@pytest.mark.parametrize("command", ["ct", "images"])
def test_shard_and_worker_counts_below_their_floor_are_refused(tmp_path, command, extra, sentence):
    """Both were taken as 'let the runner decide' without a word."""
    from typer.testing import CliRunner

    from pipelines import cli

    given = (["--input", str(tmp_path)] if command == "ct" else ["--annotations", str(tmp_path), "--images",
                                                                  str(tmp_path)])
    result = CliRunner().invoke(cli.app, ["preprocess", command, *given, "--output", str(tmp_path / "out"), *extra])
    assert result.exit_code == 2 and result.stderr.strip() == f"fullres: error: {sentence}"
    assert not (tmp_path / "out").exists()


def test_dataflow_workers_get_a_wheel_of_this_checkout():
    import zipfile

    from preprocessing import cli

    args = cli._beam_args("DataflowRunner", None, ["--project=p", "--region=europe-west4", "--temp_location=gs://b/t"])
    assert args[:4] == ["--runner=DataflowRunner", "--project=p", "--region=europe-west4", "--temp_location=gs://b/t"]
    wheel = next(a.split("=", 1)[1] for a in args if a.startswith("--extra_package="))
    names = zipfile.ZipFile(wheel).namelist()
    assert "preprocessing/beam/ct_pipeline.py" in names and "preprocessing/records/example_proto.py" in names and "common/console.py" in names
    # A container image given by the user is used as is.
    assert cli._beam_args("DataflowRunner", None, ["--sdk_container_image=img"]) == [
        "--runner=DataflowRunner", "--sdk_container_image=img"]


def test_direct_runner_worker_count():
    from preprocessing import cli

    assert "--direct_num_workers=3" in cli._beam_args("DirectRunner", 3, [])


def _without_dac_override():
    """Run as root without CAP_DAC_OVERRIDE: folder permissions then apply to us too (root ignores them otherwise)."""
    import ctypes

    pr_capbset_drop, cap_dac_override = 24, 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, cap_dac_override, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _fullres_on_small_disk(mount_point, size, *args, listing=None, copy_in=None):
    """`fullres ARGS` with a tmpfs of `size` mounted at `mount_point` (a private user and mount namespace).

    With `listing` (a path outside the mount), what the command left on the small disk is written there
    before the namespace ends: one `SIZE PATH` line per file. With `copy_in` (a folder outside the mount), that
    folder is copied onto the small disk as `run` first.
    """
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    prepare = f'mount -t tmpfs -o size={size} tmpfs "$0"'
    if copy_in is not None:
        prepare += f' && cp -a "{copy_in}" "$0/run"'
    command = f'{prepare} && exec "$@"'
    if listing is not None:
        command = f'{prepare} && {{ "$@"; status=$?; find "$0" -type f -printf "%s %P\\n" > "{listing}"; exit $status; }}'
    return subprocess.run(["unshare", "-Urm", "sh", "-c", command, str(mount_point), sys.executable, "-m",
                           "pipelines.cli", *args], capture_output=True, text=True, env=environment, cwd=REPOSITORY)


@pytest.mark.slow
def test_preprocess_into_the_folder_above_the_scans_is_refused_and_nothing_is_deleted(tmp_path):
    """The issue's reproduction: --output /tmp/x with the scans in /tmp/x/s deleted them, notes and thesis too."""
    from preprocessing.ct import demo_ct

    demo_ct.write_demo_cases(str(tmp_path / "x" / "s"), 1, (8, 16, 16), seed=0, formats=("nifti",))
    (tmp_path / "x" / "notes.txt").write_text("t\n")
    (tmp_path / "x" / "thesis.tex").write_text("\\chapter{Results}\n")
    before = snapshot(tmp_path)
    result = _fullres("preprocess", "ct", "--input", str(tmp_path / "x" / "s" / "nifti" / "images"),
                      "--output", str(tmp_path / "x"), "--spacing", "2,2,2", "--shape", "8,16,16")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fullres: error: --output {tmp_path / 'x'} contains the input {tmp_path / 'x' / 's' / 'nifti' / 'images'}; "
        f"fullres would replace or mix its files with yours, so choose an --output outside "
        f"{tmp_path / 'x' / 's' / 'nifti' / 'images'} (e.g. {tmp_path / 'x' / 's' / 'nifti'}/fullres-output).")
    assert snapshot(tmp_path) == before
    # An existing file as --output: kept as it is, not renamed to *.old-xxxx.
    result = _fullres("preprocess", "ct", "--input", str(tmp_path / "x" / "s" / "nifti" / "images"),
                      "--output", str(tmp_path / "x" / "thesis.tex"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--output {tmp_path / 'x' / 'thesis.tex'} is an existing file, not a directory;" in result.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_permission_denied_is_one_sentence_and_verbose_shows_the_traceback(tmp_path):
    from preprocessing.images import demo_images

    written = demo_images.write_demo_coco(str(tmp_path / "coco"), num_images=2, size=(64, 64), seed=0)
    (tmp_path / "locked").mkdir()
    os.chmod(tmp_path / "locked", 0o555)
    args = ["preprocess", "images", "--annotations", written["annotations"], "--images", written["images"],
            "--output", str(tmp_path / "locked" / "out")]
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    for verbose in ([], ["--verbose"]):
        result = subprocess.run([sys.executable, "-m", "pipelines.cli", *verbose, *args], capture_output=True,
                                text=True, env=environment, cwd=REPOSITORY, preexec_fn=_without_dac_override)
        assert result.returncode == 2
        assert result.stderr.strip().endswith(
            f"fullres: error: permission denied while writing {tmp_path / 'locked' / 'out'}.fullres-lock; choose an "
            f"--output you may write to, or fix the permissions of {tmp_path / 'locked'}.")
        assert ("Traceback" in result.stderr) == bool(verbose)
        assert "PermissionError: [Errno 13]" in result.stderr or not verbose
    assert os.listdir(tmp_path / "locked") == []


@pytest.mark.slow
def test_disk_full_while_converting_is_one_sentence(tmp_path):
    from preprocessing.ct import demo_ct

    demo_ct.write_demo_cases(str(tmp_path / "demo"), 1, (16, 32, 32), seed=0, formats=("nifti",))
    (tmp_path / "disk").mkdir()
    result = _fullres_on_small_disk(
        tmp_path / "disk", "16k", "preprocess", "ct", "--input", str(tmp_path / "demo" / "nifti" / "images"),
        "--output", str(tmp_path / "disk" / "out"), "--spacing", "1,1,1", "--workers", "1")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1 and errors[0].startswith("fullres: error: the disk is full while writing ")
    assert errors[0].endswith("; free space there or choose an --output on a disk with room, then run again.")


@pytest.mark.slow
def test_disk_full_while_training_is_one_sentence(demo_data, tmp_path):
    (tmp_path / "disk").mkdir()
    result = _fullres_on_small_disk(
        tmp_path / "disk", "12k", "train", "--train", demo_data["train"], "--output", str(tmp_path / "disk" / "run"),
        "--preset", "smoke", "--steps", "2", "--checkpoint-every", "2", "--virtual-devices", "2",
        "--input-partition-dims", "1,2,1,1,1")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"fullres: error: the disk is full while writing {tmp_path}/disk/run")


@pytest.mark.slow
def test_disk_full_while_checkpointing_is_one_sentence_and_leaves_no_partial_files(demo_data, tmp_path):
    """The issue: Orbax's writer threads printed a traceback each, then 1,000 characters of RESOURCE_EXHAUSTED.

    100 kB hold the run's JSON files but not its first checkpoint (212 kB).
    """
    (tmp_path / "disk").mkdir()
    result = _fullres_on_small_disk(
        tmp_path / "disk", "100k", "train", "--train", demo_data["train"], "--output", str(tmp_path / "disk" / "run"),
        "--preset", "smoke", "--steps", "2", "--checkpoint-every", "2", "--virtual-devices", "2",
        "--input-partition-dims", "1,2,1,1,1", listing=tmp_path / "left.txt")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "step 2/2" in result.stdout  # it trained, and failed at the checkpoint
    assert "Traceback" not in result.stderr and "RESOURCE_EXHAUSTED" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert errors == [f"fullres: error: the disk is full while writing {tmp_path}/disk/run/checkpoints/00000002; free "
                      "space there or choose an --output on a disk with room, then run again."]
    left = dict(line.split(" ", 1)[::-1] for line in (tmp_path / "left.txt").read_text().splitlines())
    assert not any(".orbax-checkpoint-tmp" in name or name.endswith(".tmp") for name in left), left
    assert not [name for name, size in left.items() if size == "0"], left
    assert {"run/train_config.json", "run/model_info.json", "run/history.jsonl"} <= set(left)


@pytest.mark.parametrize("command", [
    ["demo", "--output", "{folder}"],
    ["pipeline", "run", "--local", "--pipeline-root", "{folder}", "--param", "train_input_uri={scans}",
     "--param", "eval_input_uri={scans}"],
])
def test_demo_and_pipeline_root_refuse_a_folder_of_other_files(tmp_path, tmp_path_factory, command):
    from typer.testing import CliRunner

    from pipelines import cli

    (tmp_path / "thesis.tex").write_text("mine")
    scans = tmp_path_factory.mktemp("scans")  # the inputs exist (the parameters are checked first)
    option = "--output" if command[0] == "demo" else "--pipeline-root"
    result = CliRunner().invoke(cli.app, [part.format(folder=tmp_path, scans=scans) for part in command])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"fullres: error: {option} {tmp_path} holds files fullres did not write "
                                     f"(thesis.tex); fullres never deletes or overwrites them, so pass a new or empty "
                                     f"directory as {option}.")
    assert os.listdir(tmp_path) == ["thesis.tex"]


def test_pipeline_root_inside_an_input_is_refused(tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    (tmp_path / "scans").mkdir()
    (tmp_path / "eval").mkdir()
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(tmp_path / "scans" / "root"),
                                          "--param", f"train_input_uri={tmp_path / 'scans'}", "--param",
                                          f"eval_input_uri={tmp_path / 'eval'}"])
    assert result.exit_code == 2
    assert (f"fullres: error: --pipeline-root {tmp_path / 'scans' / 'root'} lies inside the --param train_input_uri "
            f"{tmp_path / 'scans'};") in result.stderr
    assert os.listdir(tmp_path / "scans") == []


def _pages(folder, keep=lambda name: True) -> int:
    """Bytes the files under `folder` take on a tmpfs (whole 4 KiB pages each), those whose path `keep` accepts."""
    return sum(-(-os.path.getsize(os.path.join(root, name)) // 4096) * 4096 for root, _, names in os.walk(folder)
               for name in names if keep(os.path.relpath(os.path.join(root, name), folder)))


@pytest.mark.slow
@pytest.mark.parametrize("unwritten", ["saved_model/"])
def test_disk_full_while_exporting_leaves_no_cut_short_model(demo_data, tmp_path, unwritten):
    """A disk with room for the trained run and half of model.keras, or for model.keras and half the SavedModel.
    Keras left a cut-short model.keras, TensorFlow a `saved_model.pb.tmp…`.

    The run on the small disk resumes a copy of a finished run's checkpoint (trained on a roomy disk), so that the
    room left for the export is known to the page: Orbax lays the same checkpoint out differently from run to run
    (7 data files and 60 KB in one run, 16 and 157 KB in the next, measured), more than half a SavedModel, and a
    disk sized from another run filled in the checkpoint or after the export (CI, 2026-11-25)."""
    arguments = ["train", "--train", demo_data["train"], "--preset", "smoke", "--steps", "2", "--checkpoint-every", "2",
                 "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1"]
    sized = _fullres(*arguments, "--output", str(tmp_path / "sized"))
    assert sized.returncode == 0, sized.stderr[-3000:]
    exported = ("model.keras", "saved_model", "metrics.json")
    shutil.copytree(tmp_path / "sized", tmp_path / "trained", ignore=lambda folder, names: [
        n for n in names if folder == str(tmp_path / "sized") and n in exported])
    before = _pages(tmp_path / "trained")
    keras_bytes = _pages(tmp_path / "sized", lambda name: name == "model.keras")
    half = keras_bytes // 2 if unwritten == "model.keras" else keras_bytes + _pages(tmp_path / "sized" / "saved_model") // 2
    (tmp_path / "disk").mkdir()
    # 4 pages for what the resumed run adds before exporting: its TensorBoard file, train_config.json rewritten.
    result = _fullres_on_small_disk(tmp_path / "disk", str(before + 4 * 4096 + half // 4096 * 4096), *arguments,
                                    "--output", str(tmp_path / "disk" / "run"), listing=tmp_path / "left.txt",
                                    copy_in=tmp_path / "trained")
    assert "resuming from checkpoint at step 2" in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert errors == [f"fullres: error: the disk is full while writing {tmp_path}/disk/run; free space there or "
                      "choose an --output on a disk with room, then run again."]
    left = dict(line.split(" ", 1)[::-1] for line in (tmp_path / "left.txt").read_text().splitlines())
    assert "run/checkpoints/00000002/_CHECKPOINT_METADATA" in left  # the run can be resumed once there is room
    assert not [name for name in left if name.startswith("run/" + unwritten)], left
    if unwritten == "saved_model/":  # the disk filled in the SavedModel, after a whole model.keras
        assert "run/model.keras" in left, left
    assert not [name for name in left if ".tmp" in name or "fullres-partial" in name or left[name] == "0"], left


@pytest.mark.parametrize("args, message", [
    (["--pipeline", "detection", "--model", "nets/net.py:build"],
     "--model nets/net.py:build applies to the segmentation pipelines; the detection pipeline trains fullres's "
     "RetinaNet."),
    (["--model", "nets/missing.py:build"], "--model nets/missing.py:build: nets/missing.py does not exist; pass the "
                                          "Python file that defines build."),
    (["--model", "nets/net.py"], "--model 'nets/net.py' is not FILE.py:FUNCTION"),
])
def test_pipeline_run_refuses_a_network_it_cannot_pass_in_one_sentence(tmp_path, args, message):
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(tmp_path / "root"),
                                          *args])
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert result.exit_code == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "root").exists()
