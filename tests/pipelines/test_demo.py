"""`fullres demo` runs the ct-segmentation pipeline end to end with the local KFP runner.

A short run (a few steps, few cases) checks the wiring: every step ran, the
summary points at real outputs. The run is the session's `demo_run` fixture
(tests/conftest.py), made once: the container test runs the same pipeline on
the same scans in Docker and compares its outputs with this run's. The Dice the
full demo reaches is measured by running the README's main command (figures in
benchmarks/results/by_hand.json, docs/pipelines-and-vertex.md).
"""

import json
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # runs the pipeline end to end


def test_demo_runs_the_pipeline_and_writes_the_summary(demo_run):
    result, summary, _ = demo_run
    assert 0.0 <= summary["dice_mean"] <= 1.0
    assert summary["class_names"] == ["background", "liver", "kidney"]
    assert os.path.exists(os.path.join(summary["model"], "model.keras"))
    assert os.path.exists(os.path.join(summary["saved_model"], "saved_model", "saved_model.pb"))
    assert json.loads(open(summary["metrics"]).read())["cases"] == 2
    assert summary["report"].endswith(".html") and open(summary["report"]).read().startswith("<!DOCTYPE html>")
    # The held-out scans, stored turned and flipped, predicted in their own geometry and scored there.
    predicted = summary["predict"]
    assert predicted["cases"] == 2 and 0.0 <= predicted["dice_mean"] <= 1.0 and len(predicted["dice_per_class"]) == 3
    written = sorted(name for name in os.listdir(predicted["masks"]) if not name.startswith("."))
    assert written == ["case000.nii.gz", "case001.nii.gz", "dead_letter.jsonl", "summary.json"]
    assert "predicted in the held-out scans' own geometry" in result.stdout
    for step in ("preprocess-ct", "preprocess-ct-2", "train", "evaluate", "export", "predict"):
        assert os.path.isdir(os.path.join(summary["run_dir"], step)), step
        assert f"step {step}: SUCCESS" in result.stdout


def test_demo_splits_each_scan_over_two_devices_and_keeps_the_runner_quiet(demo_run):
    result, summary, _ = demo_run
    # The point of fullres, shown: the volume split along depth over 2 virtual CPU devices.
    assert summary["input_partition_dims"] == [1, 2, 1, 1, 1]
    assert summary["mesh"] == {"axes": ["replica", "depth"], "shape": [1, 2]}
    assert "each device holds a (2, 16, 32, 32, 1) shard of every (2, 32, 32, 32, 1) batch" in result.stdout
    assert "split 1,2,1,1,1 over the mesh {'replica': 1, 'depth': 2}" in result.stdout
    # Quiet by default: no executor inputs, executor INFO lines, artifact listings or local-runner warnings ...
    for noise in ("executor_input", '"parameterValues"', "[KFP Executor", "uri='", "have no effect in the current local runner",
                  "non-Python base image"):
        assert noise not in result.stdout + result.stderr, noise
    # ... which all went to the run's log file, named on the terminal.
    log_path = next(line.split(" in ")[-1] for line in result.stdout.splitlines() if "every line of its output in" in line)
    logged = open(log_path).read()
    assert "Got executor_input" in logged and "[KFP Executor" in logged and "have no effect in the current local runner" in logged


def test_the_pipeline_s_predict_names_scans_relative_to_its_input(demo_run):
    """Folders above the input (here the demo's own data folder) often name patients: predict's summary and dead
    letters name scans relative to the input, not by absolute paths."""
    _, summary, output = demo_run
    masks = summary["predict"]["masks"]
    with open(os.path.join(masks, "summary.json")) as file:
        predicted = json.load(file)
    assert predicted["input"] == "images" and predicted["pseudonymized"] is False
    assert sorted(case["source"] for case in predicted["cases"]) == ["case000.nii.gz", "case001.nii.gz"]
    for name in ("summary.json", "dead_letter.jsonl"):
        with open(os.path.join(masks, name)) as file:
            assert str(output / "data") not in file.read(), name


def test_the_trained_run_keeps_the_pipelines_class_names(demo_run):
    """The pipeline's `class_names` are the run's: model_info.json keeps them (it said null), so the predict step
    names the classes in its log and summary.json (it said class_1, class_2), as the DICOM SEG's segment labels do."""
    result, summary, _ = demo_run
    with open(os.path.join(summary["model"], "model_info.json")) as file:
        assert json.load(file)["class_names"] == ["background", "liver", "kidney"]
    with open(os.path.join(summary["predict"]["masks"], "summary.json")) as file:
        assert json.load(file)["class_names"] == ["background", "liver", "kidney"]
    log_path = next(line.split(" in ")[-1] for line in result.stdout.splitlines() if "every line of its output in" in line)
    logged = open(log_path).read()
    assert "(3 classes: background, liver, kidney)" in logged and "class_1" not in logged
