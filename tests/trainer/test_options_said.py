"""Options that did nothing, silently: `--warmup-steps 50` in a 2-step run was cut to 1 while
train_config.json recorded 50; `--no-augment --augmentation nnunet` was accepted and trained without augmentation;
`--input-cache on` with more data than memory said nothing. Now the cut is said and the warm-up used recorded, the
contradiction refused with the folders untouched, and the cache's excess warned with both sizes."""

import json

import pytest
from typer.testing import CliRunner

from pipelines import cli
from tests.files import snapshot

TINY = ["--preset", "smoke", "--set", "model.base_filters=2", "--input-partition-dims", "1,4,1,1,1", "--no-saved-model"]


def _train(*arguments):
    return CliRunner().invoke(cli.app, ["train", *TINY, *arguments])


@pytest.mark.parametrize("contradiction, sentence", [
    (["--no-augment", "--augmentation", "nnunet"],
     "--no-augment switches augmentation off, but --augmentation nnunet configures it; pass one of them: "
     "--augmentation nnunet alone, or --no-augment alone (or with --augmentation none)."),
    (["--set", "augment=false", "--set", "augmentation.rotation_probability=0.5"],
     "--set augment=false switches augmentation off, but --set augmentation.rotation_probability=0.5 configures it; "
     "pass one of them: --set augmentation.rotation_probability=0.5 alone, or --set augment=false alone (or with "
     "--augmentation none)."),
])
def test_augmentation_switched_off_and_configured_is_refused(demo_data, tmp_path, contradiction, sentence):
    before = snapshot(tmp_path)
    result = _train("--train", demo_data["train"], "--output", str(tmp_path / "run"), "--steps", "2", *contradiction)
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    assert result.stderr.strip() == f"fullres: error: {sentence}"
    assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()


@pytest.mark.slow  # one 2-step training run (50 s measured on the shared 2-core machine)
def test_a_warm_up_longer_than_the_run_is_said_and_recorded_and_a_cache_over_memory_warned(demo_data, tmp_path,
                                                                                           monkeypatch):
    from trainer.data import decoded_cache

    monkeypatch.setattr(decoded_cache, "memory_available", lambda: 2**10)  # 1 KiB: less than the demo share
    run = tmp_path / "run"
    result = _train("--train", demo_data["train"], "--output", str(run), "--steps", "2", "--warmup-steps", "50",
                    "--input-cache", "on")
    assert result.exit_code == 0, result.output + result.stderr
    lines = result.stdout.splitlines()
    assert ("warning: --warmup-steps 50 is cut to 1: this run has 2 steps and its warm-up must end before the last; "
            "run_record.json records the 1 used (train_config.json keeps the 50 asked, which a resume to more steps "
            "would use); pass --warmup-steps 1 or fewer, or more --steps, to make them agree.") in lines
    history = json.loads((run / "run_record.json").read_text())["history"]
    assert [line["warmup_steps"] for line in history] == [1]
    assert json.loads((run / "train_config.json").read_text())["warmup_steps"] == 50
    cache = next(line for line in lines if line.startswith("input cache "))
    assert cache.startswith("input cache on (--input-cache on): this process's share of the data set, ")
    assert cache.endswith(" held in memory; warning: that is more than the 1.0 KiB of memory available, so the host "
                          "will swap or the process be killed as the cache fills; pass --input-cache auto, which "
                          "reads the records every step where they do not fit")


@pytest.mark.slow  # the session's segmentation run (shared, 40 steps); the refusals come before any model is built
@pytest.mark.parametrize("steps, sentence", [
    ("30", "nothing to train: the run in {run} is at step 40 of the 30 that --steps 30 asks for; "),
    ("40", "--output {run} was trained with warmup_steps 0 but this rerun has 50 (--warmup-steps); "),
])
def test_a_refused_resume_says_no_warm_up_warning_first(segmentation_run, tmp_path, steps, sentence):
    """A rerun's checks all come before what it warns of: a resume refused is told its refusal alone."""
    import shutil

    config, _, _ = segmentation_run
    run = tmp_path / "run"
    shutil.copytree(config.output_dir, run)
    before = snapshot(run)
    result = CliRunner().invoke(cli.app, ["train", "--output", str(run), "--steps", steps, "--warmup-steps", "50",
                                          "--no-saved-model"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    assert result.stderr.strip().startswith("fullres: error: " + sentence.format(run=run)), result.stderr
    assert "warning" not in result.stdout, result.stdout
    assert snapshot(run) == before
