"""A resume need not repeat the run (`engine.recorded_settings`): `fullres train --output RUN --steps 4` goes on with
the run's data, patches, augmentation, partition and `--set` values; an option given is compared, and one that
changes the run is refused with the folder left byte for byte as it was."""

import dataclasses
import json
import os
import re

import pytest
from typer.testing import CliRunner

from pipelines import cli
from preprocessing.records import data_set
from tests.files import snapshot
from trainer import trained_run
from trainer import config_resolution
from trainer import presets
from trainer.engine import program, recorded_settings, run_files, run_record

SMALL = ["--preset", "smoke", "--patch-size", "16,8,8", "--augmentation", "nnunet", "--input-partition-dims",
         "1,4,1,1,1", "--set", "model.base_filters=2"]


def _train(*arguments):
    return CliRunner().invoke(cli.app, ["train", *arguments, "--no-saved-model"])


def _metrics(run):
    return json.loads((run / "metrics.json").read_text())


@pytest.mark.slow
def test_a_bare_resume_goes_on_as_the_run_records_it_and_a_given_change_is_refused(demo_data, tmp_path, monkeypatch):
    data_folder = os.path.dirname(demo_data["train"])
    monkeypatch.chdir(os.path.dirname(data_folder))  # the run is given its data by a relative path ...
    relative = os.path.relpath(demo_data["train"])
    run = tmp_path / "run"
    started = _train("--train", relative, "--output", str(run), "--steps", "2", *SMALL)
    assert started.exit_code == 0, started.output
    monkeypatch.chdir(tmp_path)  # ... and resumed from elsewhere, without --train: the absolute path it recorded

    resumed = _train("--output", str(run), "--steps", "4")
    assert resumed.exit_code == 0, resumed.output + resumed.stderr
    assert (_metrics(run)["resumed_from_step"], _metrics(run)["steps"]) == (2, 4)
    taken = next(line for line in resumed.stdout.splitlines() if line.startswith("taken from the run's record"))
    assert taken.startswith(f"taken from the run's record (not given here): --train {demo_data['train']}, --num-levels "
                            "2, --base-filters 2, --stem none, --input-partition-dims 1,4,1,1,1, --batch-size 2, ")
    assert re.search(r"--patch-size 16,8,8, --augmentation nnunet \(and \d+ settings at their defaults\)$", taken)
    recorded = json.loads((run / "train_config.json").read_text())
    from trainer.augment import recipe

    assert recorded["patch_size"] == [16, 8, 8] and recorded["partition"]["input_partition_dims"] == [1, 4, 1, 1, 1]
    assert recorded["model"]["base_filters"] == 2 and recorded["model"]["num_levels"] == 2
    assert recorded["augmentation"] == json.loads(json.dumps(dataclasses.asdict(recipe.preset("nnunet"))))
    history = json.loads((run / "run_record.json").read_text())["history"]
    assert [line["event"] for line in history] == ["started", "resumed"] and "changed" not in history[1]

    before = snapshot(run)
    for change, sentence in [
        (["--augmentation", "flips"], "augmentation \"nnunet\" but this rerun has \"flips\" (--augmentation); "),
        (["--patch-size", "16,16,16"], "patch_size [16, 8, 8] but this rerun has [16, 16, 16] (--patch-size); "),
        (["--preset", "smoke", "--input-partition-dims", "1,4,1,1,1"],  # a preset given is all of its settings given
         "augmentation \"nnunet\" but this rerun has \"flips\" (--augmentation) (and model.base_filters, patch_size "
         "differ too); "),
    ]:
        refused = _train("--output", str(run), "--steps", "6", *change)
        assert refused.exit_code == 2 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith(f"fullres: error: --output {run} was trained with {sentence}"), refused.stderr
        assert snapshot(run) == before

    # The same values given: a plain resume (to the step it is at, which trains nothing and costs no step's compile).
    again = _train("--output", str(run), "--steps", "4", *SMALL)
    assert again.exit_code == 0, again.output + again.stderr
    assert (_metrics(run)["resumed_from_step"], _metrics(run)["steps"]) == (4, 4)
    assert f"taken from the run's record (not given here): --train {demo_data['train']}" in again.stdout.splitlines()
    history = json.loads((run / "run_record.json").read_text())["history"]
    assert [line["event"] for line in history] == ["started", "resumed", "resumed"] and "changed" not in history[2]


def test_without_a_run_in_output_train_is_required(tmp_path):
    refused = _train("--output", str(tmp_path / "new"), "--steps", "2")
    assert refused.exit_code == 2
    assert refused.stderr == (
        "fullres: error: --train is missing: name the training data set (the --output folder of fullres preprocess, "
        "or a pattern of its records) to start a run, or point --output at an earlier run to resume it on its own "
        "data.\n")
    assert not (tmp_path / "new").exists()


def _recorded_run(run, config):
    """A run folder as training starts it (train_config.json and run_record.json's first line), nothing trained."""
    run.mkdir()
    run_files.write_train_config(str(run), config)
    run_record.record(str(run), run_record.check_rerun(config, trained_run.read_record(str(run)), config.steps, 8,
                                                           program.warmup_steps_used(config, config.steps),
                                                           trained_on=data_set.fingerprint(config.train_data)))


def _bare(run, given=("output_dir", "steps"), overrides=None):
    """What `fullres train --output RUN --steps 9` resolves to, and what check_rerun says of it."""
    overrides = {"steps": 9} if overrides is None else overrides
    rerun = recorded_settings.fill(str(run), set(given), "segmentation", None, None)
    config = config_resolution.resolve(rerun.task, "default", rerun.train_data, str(run), rerun.eval_data, overrides=overrides,
                                recorded=rerun.base)
    line = run_record.check_rerun(config, trained_run.read_record(str(run)), 9, 8, program.warmup_steps_used(config, 9),
                                  trained_on=data_set.fingerprint(config.train_data))
    return rerun, config, line


def test_recorded_set_values_a_users_network_and_epochs_are_kept(demo_data, tmp_path):
    from trainer.augment import recipe
    from trainer.models import user_model

    network = tmp_path / "net.py"
    network.write_text("def build(num_classes, in_channels):\n    return None\n")
    config = presets.smoke(train_data=demo_data["train"], eval_data=demo_data["eval"], output_dir=str(tmp_path / "run"),
                              model=user_model.UserModelConfig(str(network), "build", num_classes=3),
                              class_balance=0.5, epochs=3,
                              augmentation=dataclasses.replace(recipe.preset("flips"), rotation_probability=0.1))
    _recorded_run(tmp_path / "run", config)
    network.write_text("def build(num_classes, in_channels):\n    return 1\n")  # changed since: the run's copy counts
    rerun, resumed, line = _bare(tmp_path / "run")
    assert line["event"] == "resumed" and "changed" not in line
    copy = os.path.abspath(tmp_path / "run" / "model_source.py")
    assert resumed.model.file == copy and (resumed.class_balance, resumed.steps, resumed.epochs) == (0.5, 9, None)
    assert resumed.augmentation == config.augmentation and resumed.eval_data == demo_data["eval"]
    assert re.fullmatch(re.escape(
        f"taken from the run's record (not given here): --train {demo_data['train']}, --eval {demo_data['eval']}, "
        f"--model {copy}:build, --batch-size 2, --learning-rate 0.01, --checkpoint-every 2, --log-every 1, "
        "--set class_balance=0.5, --set augmentation.rotation_probability=0.1 (and ") + r"\d+ settings at their defaults\)",
        recorded_settings.taken_line(rerun, {"steps": 9}, model_given=False))
    _, kept, _ = _bare(tmp_path / "run", given=("output_dir",), overrides={})  # nothing given: the epochs count
    assert (kept.epochs, kept.steps) == (3, config.steps)


def test_data_no_longer_where_the_run_recorded_them(demo_data, tmp_path):
    """The training data moved: refused, naming where they were looked for; the held-out data moved: the resume goes
    on without them (they are scored at the end only) and says so."""
    import shutil

    data, other = tmp_path / "data", tmp_path / "held_out"
    for copy in (data, other):
        shutil.copytree(os.path.dirname(demo_data["train"]), copy)
    train, held_out = str(data / os.path.basename(demo_data["train"])), str(other / os.path.basename(demo_data["eval"]))
    run = tmp_path / "run"
    _recorded_run(run, presets.smoke(train_data=train, eval_data=held_out, output_dir=str(run)))
    shutil.rmtree(other)
    rerun, config, _ = _bare(run)
    assert config.eval_data is None and rerun.taken == (f"--train {train}", f"no --eval (the run's {held_out} is not "
                                                                            "there now)")
    data.rename(tmp_path / "moved")
    before = snapshot(run)
    refused = _train("--output", str(run), "--steps", "9")
    assert refused.exit_code == 2 and refused.stderr == (
        f"fullres: error: --output {run} trained on --train {train} (as the run recorded it), which is not there now; "
        "pass --train with where the run's training data are now (their preprocessing is checked against the "
        "run's), or train into a new --output.\n")
    assert snapshot(run) == before


def test_a_detection_run_resumes_from_its_record_and_a_given_change_is_refused(tmp_path):
    from preprocessing.images import demo_images

    shapes = demo_images.write_demo_tfrecords(str(tmp_path / "shapes"), num_train=8, num_eval=0, size=(64, 64))
    run = tmp_path / "run"
    config = presets.detection_demo(train_data=shapes["train"], output_dir=str(run), image_size=(64, 64),
                                       max_boxes=5, steps=2)
    _recorded_run(run, config)
    rerun, resumed, line = _bare(run)
    assert rerun.task == "detection" and rerun.taken == ("--task detection", f"--train {shapes['train']}")
    assert resumed == dataclasses.replace(config, steps=9) and line["event"] == "resumed"
    before = snapshot(run)
    refused = _train("--output", str(run), "--steps", "4", "--max-boxes", "7")
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith(f"fullres: error: --output {run} was trained with max_boxes 5 but this rerun has "
                                     "7 (--max-boxes); a rerun only resumes the run as it was")
    assert "taken from the run's record (not given here): --task detection, --train " in refused.stdout
    assert snapshot(run) == before


def test_another_task_on_a_runs_resume_is_refused_by_the_runs_task_before_its_data_are_read(tmp_path):
    """A detection run resumed with --task segmentation: the sentence names both tasks and the fix, not the data."""
    from preprocessing.images import demo_images

    shapes = demo_images.write_demo_tfrecords(str(tmp_path / "shapes"), num_train=2, num_eval=0, size=(64, 64))
    run = tmp_path / "run"
    _recorded_run(run, presets.detection_demo(train_data=shapes["train"], output_dir=str(run), image_size=(64, 64),
                                                 max_boxes=5, steps=2))
    before = snapshot(run)
    for given in ([], ["--train", shapes["train"]]):
        refused = _train("--output", str(run), "--steps", "4", "--task", "segmentation", *given)
        assert refused.exit_code == 2, refused.output
        assert refused.stderr == (
            f"fullres: error: --output {run} holds a detection run but --task is segmentation; leave --task out (or "
            "pass --task detection) to resume the run, or train the segmentation run into a new --output.\n")
    assert snapshot(run) == before


def test_local_processes_are_given_only_the_options_given(monkeypatch, tmp_path):
    """Each process resolves the command line again: an option passed on at its default would count as given."""
    from trainer.parallel import local_launcher

    passed = []
    monkeypatch.setattr(local_launcher, "launch", lambda arguments, count, log: passed.append(arguments) or 0)
    result = CliRunner().invoke(cli.app, ["train", "--output", str(tmp_path), "--steps", "4", "--local-processes", "2"])
    assert result.exit_code == 0, result.output
    assert passed == [["--output", str(tmp_path), "--steps", "4"]]


def test_a_bare_resume_from_elsewhere_says_no_eval_change_and_a_shorter_schedule_is_shortened(demo_data, tmp_path,
                                                                                               monkeypatch):
    """The run was given its held-out data by a relative path; the bare resume takes their absolute path, the same
    data: the log named it a change (`--eval "/…/eval-*" (was "eval-*")`), and fewer steps 'stretched' the schedule."""
    monkeypatch.chdir(os.path.dirname(demo_data["eval"]))
    run = tmp_path / "run"
    config = presets.smoke(train_data=demo_data["train"], eval_data=os.path.basename(demo_data["eval"]),
                              output_dir=str(run), steps=12)
    _recorded_run(run, config)
    monkeypatch.chdir(tmp_path)
    rerun = recorded_settings.fill(str(run), {"output_dir", "steps"}, "segmentation", None, None)
    resumed = config_resolution.resolve(rerun.task, "default", rerun.train_data, str(run), rerun.eval_data,
                                 overrides={"steps": 9}, recorded=rerun.base)
    lines = []
    run_record.check_rerun(resumed, trained_run.read_record(str(run)), 9, 8, program.warmup_steps_used(resumed, 9),
                           log=lines.append, trained_on=data_set.fingerprint(resumed.train_data))
    assert resumed.eval_data == demo_data["eval"]
    assert lines == ["resuming with 9 steps in all (was 12; the learning-rate schedule is shortened to the new end)"]
