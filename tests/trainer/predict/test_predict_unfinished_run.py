"""Predicting from a run that has not finished: it was called "not a fullres run". A run still training
(its lock held) is said to be training, by which process; one that stopped before its end is told to resume. The
output folder is not made."""

import contextlib
import os
import socket

import pytest
from typer.testing import CliRunner

from common import output_lock
from pipelines import cli
from tests.files import snapshot
from trainer import presets
from trainer.engine import run_files


def _unfinished_run(folder) -> str:
    """A run's folder as training leaves it before its end: its config and model_info.json, no model.keras."""
    run = str(folder / "run")
    config = presets.smoke(train_data="data/train-*.tfrecord", output_dir=run)
    os.makedirs(run)
    run_files.write_train_config(run, config)
    run_files.write_model_info(run, "segmentation", (16, 16, 16, 1), ["background", "a", "b"], None)
    return run


@pytest.mark.parametrize("training", [True, False])
def test_predicting_from_an_unfinished_run_says_what_it_is_and_what_to_do(tmp_path, training):
    run = _unfinished_run(tmp_path)
    scan = tmp_path / "scan.nii.gz"
    scan.write_bytes(b"not read")
    with output_lock.lock(run) if training else contextlib.nullcontext():  # a trainer holds it while it trains
        before = snapshot(tmp_path)
        result = CliRunner().invoke(cli.app, ["predict", "--model", run, "--input", str(scan), "--output",
                                              str(tmp_path / "masks")])
        assert snapshot(tmp_path) == before
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    if training:
        assert result.stderr.strip() == (
            f"fullres: error: --model {run} is still training (pid {os.getpid()} on {socket.gethostname()}) and has "
            f"no model.keras yet; predict with it once the run has finished and written {run}/model.keras.")
    else:
        assert result.stderr.strip() == (
            f"fullres: error: --model {run} is a run that has not finished training: it has no model.keras yet; "
            f"resume it with `fullres train --output {run}` (it goes on from its newest checkpoint), then predict.")


def test_a_finished_run_missing_only_its_model_info_is_told_so_not_that_it_has_no_model(tmp_path):
    """A run whose model.keras is there but whose model_info.json was lost is finished: it is told the file it lacks."""
    run = _unfinished_run(tmp_path)
    os.remove(run_files.path(run, run_files.MODEL_INFO))
    with open(run_files.path(run, run_files.MODEL), "wb") as file:
        file.write(b"a trained model")
    scan = tmp_path / "scan.nii.gz"
    scan.write_bytes(b"not read")
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli.app, ["predict", "--model", run, "--input", str(scan), "--output",
                                          str(tmp_path / "masks")])
    assert snapshot(tmp_path) == before
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    assert result.stderr.strip() == (
        f"fullres: error: --model {run} holds a trained model ({run}/model.keras) but no model_info.json, which says "
        "what the model takes (its task, input shape and preprocessing); copy it back from where the run came from "
        "(or a backup).")
