"""`fullres pipeline run --local --pipeline detection`: the detection pipeline end to end with the local KFP runner."""

import json
import os
import subprocess
import sys

import pytest

from preprocessing.images import demo_images

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # runs the pipeline end to end


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_detection_pipeline_runs_locally(tmp_path):
    train = demo_images.write_demo_coco(str(tmp_path / "train"), num_images=8, size=(128, 128), seed=0)
    held_out = demo_images.write_demo_coco(str(tmp_path / "eval"), num_images=3, size=(128, 128), seed=1)
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline", "detection",
         "--pipeline-root", str(tmp_path / "root"),
         "--param", f"train_annotations_uri={train['annotations']}", "--param", f"train_images_uri={train['images']}",
         "--param", f"eval_annotations_uri={held_out['annotations']}", "--param", f"eval_images_uri={held_out['images']}",
         "--param", "preset=detection_demo", "--param", "steps=2", "--param", "batch_size=2",
         "--param", 'train_overrides={"image_size": [128, 128], "log_every": 1}'],
        capture_output=True, text=True, cwd=ROOT, env=environment, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = dict(line.rsplit(": ", 1) for line in result.stdout.splitlines() if line.count("/") and ": /" in line)
    scores = json.loads(open(outputs["evaluate/metrics"]).read())
    assert scores["task"] == "detection" and scores["images"] == 3
    assert set(scores["per_class_AP"]) == {"circle", "square", "triangle"}
    page = open(outputs["evaluate/report"]).read()
    assert page.count("<img") == 3 and "mAP@0.5" in page
    assert os.path.exists(os.path.join(outputs["export/exported"], "saved_model", "saved_model.pb"))
    with open(os.path.join(outputs["train/model"], "train_config.json")) as file:
        config = json.load(file)
    assert config["task"] == "detection" and config["model"]["num_classes"] == 3 and config["steps"] == 2
    assert config["image_size"] == [128, 128]  # train_overrides reach the TrainConfig
