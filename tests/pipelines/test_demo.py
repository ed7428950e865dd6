"""`fullres demo` runs the ct-segmentation pipeline end to end with the local KFP runner.

A short run (a few steps, few cases) checks the wiring: every step ran, the
summary points at real outputs. The Dice the full demo reaches is measured by
running the README's main command (figures in the README).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the pipeline end to end


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_runs_the_pipeline_and_writes_the_summary(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as users have
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "demo", "--output", str(tmp_path), "--steps", "6", "--cases", "4",
         "--eval-cases", "2"],
        capture_output=True, text=True, cwd=ROOT, env=environment, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.0 <= summary["dice_mean"] <= 1.0
    assert summary["class_names"] == ["background", "liver", "kidney"]
    assert os.path.exists(os.path.join(summary["model"], "model.keras"))
    assert os.path.exists(os.path.join(summary["saved_model"], "saved_model", "saved_model.pb"))
    assert json.loads(open(summary["metrics"]).read())["cases"] == 2
    assert summary["report"].endswith(".html") and open(summary["report"]).read().startswith("<!DOCTYPE html>")
    for step in ("preprocess-ct", "preprocess-ct-2", "train", "evaluate", "export"):
        assert os.path.isdir(os.path.join(summary["run_dir"], step)), step
