"""Every file a training run writes is written and read by `engine.run_files`: each writer's output passes its reader."""

import dataclasses


from trainer import presets
from trainer.engine import run_files


def test_train_config_round_trip(tmp_path):
    config = presets.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path))
    config = dataclasses.replace(config, partition=dataclasses.replace(config.partition,
                                                                       input_partition_dims=(1, 2, 1, 1, 1)))
    run_files.write_train_config(str(tmp_path), config)
    assert run_files.read_train_config(str(tmp_path)) == config


def _cut_short_run(tmp_path) -> str:
    """A run copied in part: its files there, train_config.json cut short half way."""
    config = presets.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path / "run"))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    run_files.write_train_config(str(run), config)
    run_files.write_history(str(run), [{"step": 1, "loss": 2.5}])
    text = (run / "train_config.json").read_text()
    (run / "train_config.json").write_text(text[:len(text) // 2])
    return str(run)


def test_a_damaged_train_config_is_named_with_the_fix(tmp_path):
    """The issue: a cut-short train_config.json was reported as "holds files fullres did not write (checkpoints,
    history.jsonl ...)"; they are fullres's files, and the damaged one went unnamed."""
    import pytest

    from common import output_guard

    run = _cut_short_run(tmp_path)
    size = len((tmp_path / "run" / "train_config.json").read_bytes())
    with pytest.raises(output_guard.OutputRefused) as refused:
        run_files.check_resumable(run)
    assert str(refused.value).startswith(f"{run}/train_config.json is damaged (not valid JSON, ")
    assert str(refused.value).endswith(
        f"; {size} bytes), so fullres cannot resume the run; fullres writes it whole, so a copy of the run was cut "
        "short or the file was changed since: copy train_config.json again from where the run came from (or a "
        "backup), or train again into a new --output.")
    with pytest.raises(ValueError, match=r"train_config.json is damaged \(.*\), so fullres cannot read this run; "):
        run_files.read_train_config(run)  # evaluate, export and predict read it so
    run_files.check_resumable(str(tmp_path))  # no run files: nothing to say (the output guard judges the folder)


def test_a_users_network_run_with_a_damaged_train_config_is_named_too(tmp_path):
    """A run of a user's network holds its copy of the network (model_source.py), a file of fullres's own: with a
    damaged train_config.json beside it, the damage is named, not the copy called foreign."""
    import pytest

    from common import output_guard

    run = tmp_path / "run"
    run.mkdir()
    (run / "model_source.py").write_text("def build(num_classes, in_channels):\n    return None\n")
    (run / "train_config.json").write_text('{"task": "segmentation", "model": {"file": "model_sou')
    with pytest.raises(output_guard.OutputRefused, match=r"train_config.json is damaged \(not valid JSON, "):
        run_files.check_resumable(str(run))


def test_train_names_a_damaged_train_config_instead_of_calling_the_run_foreign(demo_data, tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    run = _cut_short_run(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", "--train", demo_data["train"], "--output", run, "--preset", "smoke"])
    assert result.exit_code == 2
    (error,) = result.stderr.splitlines()
    assert error.startswith(f"fullres: error: {run}/train_config.json is damaged (not valid JSON, ")
    assert "did not write" not in error and error.endswith("or train again into a new --output.")


def test_train_judges_the_run_folder_before_it_reads_the_data(tmp_path):
    """`resolved_run.resolve` asks `resume_check` first of all a run's checks: a damaged run is named even where the
    data are missing, and the run folder is left as it was."""
    import pytest

    from common import output_guard
    from tests.files import snapshot
    from trainer import train

    run = _cut_short_run(tmp_path)
    before = snapshot(tmp_path / "run")
    config = presets.smoke(train_data=str(tmp_path / "nothing-*.tfrecord"), output_dir=run, steps=1)
    with pytest.raises(output_guard.OutputRefused, match=r"train_config.json is damaged \(not valid JSON, "):
        train.train(config, log=lambda line: None)
    assert snapshot(tmp_path / "run") == before


def test_model_info_round_trip(tmp_path):
    preprocessing = {"spacing": [1.0, 1.0, 2.5], "orientation": "LPS", "window": [-160, 240], "modality": "ct",
                     "shape": None}
    run_files.write_model_info(str(tmp_path), "segmentation", (16, 16, 16, 1), ["background", "liver"], preprocessing)
    assert run_files.read_model_info(str(tmp_path)) == {
        "task": "segmentation", "image_shape": [16, 16, 16, 1], "class_names": ["background", "liver"],
        "preprocessing": preprocessing}


def test_model_info_records_what_the_training_scans_turned_out_to_be(tmp_path):
    """`modality: auto` says how scans were normalized, not what they were; `data_modality` says that, for predict."""
    seen = {"modalities": {"CT": 12}, "intensity_range": [-1024, 1460]}
    run_files.write_model_info(str(tmp_path), "segmentation", (16, 16, 16, 1), ["background", "liver"], None,
                               data_modality=seen)
    assert run_files.read_model_info(str(tmp_path))["data_modality"] == seen


def test_history_round_trip_and_loss_curve(tmp_path):
    entries = [{"step": 1, "loss": 2.5, "grad_norm": 0.5}, {"step": 2, "loss": 1.5, "grad_norm": 0.25}]
    run_files.write_history(str(tmp_path), entries)
    assert run_files.read_history(str(tmp_path)) == entries
    assert run_files.read_history(str(tmp_path), up_to_step=1) == entries[:1]
    assert run_files.loss_curve(str(tmp_path)) == [[1, 2.5], [2, 1.5]]


def test_metrics_round_trip(tmp_path):
    results = {"final_loss": 0.5, "dice_per_class": [0.9, None], "input_partition_dims": [1, 2, 1, 1, 1]}
    path = run_files.write_metrics(str(tmp_path), results)
    assert path == run_files.path(str(tmp_path), run_files.METRICS)
    assert run_files.read_metrics(str(tmp_path)) == results


def test_a_write_the_disk_refuses_leaves_no_partial_file(tmp_path):
    """A full disk (here /dev/full, behind the temporary name) fails the write and leaves no 0-byte `.tmp` behind."""
    import errno
    import os

    import pytest

    (tmp_path / "history.jsonl").write_text('{"step": 1, "loss": 1.0, "learning_rate": 0.1}\n')
    os.symlink("/dev/full", tmp_path / "history.jsonl.tmp")
    with pytest.raises(OSError) as error:
        run_files.write_history(str(tmp_path), [{"step": 2, "loss": 0.5, "learning_rate": 0.1}])
    assert error.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["history.jsonl"]
    assert run_files.read_history(str(tmp_path)) == [{"step": 1, "loss": 1.0, "learning_rate": 0.1}]
