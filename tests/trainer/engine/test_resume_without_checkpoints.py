"""A finished run whose `checkpoints/` was deleted is not resumed from step 1: `fullres train --output RUN`
again would have printed "resuming", trained from nothing and overwritten the run's `model.keras`. It is refused in
one sentence naming the model, the missing checkpoints and the fix, with the folder left byte for byte as it was."""

import shutil

import pytest
from typer.testing import CliRunner

from pipelines import cli
from tests.files import snapshot


@pytest.mark.slow  # the session's segmentation run (shared); the refusal itself comes before any model is built
@pytest.mark.parametrize("emptied", [False, True])
def test_a_finished_run_without_checkpoints_is_refused(segmentation_run, tmp_path, emptied):
    config, _, _ = segmentation_run
    run = tmp_path / "run"
    shutil.copytree(config.output_dir, run)
    shutil.rmtree(run / "checkpoints")
    if emptied:
        (run / "checkpoints").mkdir()
    before = snapshot(run)
    result = CliRunner().invoke(cli.app, ["train", "--output", str(run), "--steps", "40", "--no-saved-model"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    state = "empty" if emptied else "missing"
    assert result.stderr.strip() == (
        f"fullres: error: --output {run} holds a trained model ({run}/model.keras) but no checkpoint "
        f"({run}/checkpoints is {state}), so a rerun would train from step 1 and overwrite that model; put the run's "
        f"checkpoints back into {run}/checkpoints to resume it, or train into a new --output.")
    assert "resuming" not in result.stdout
    assert snapshot(run) == before
