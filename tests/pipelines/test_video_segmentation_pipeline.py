"""The `video-segmentation` pipeline: compiled like the others, and run end to end with the local KFP runner."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from PIL import Image

from pipelines import definitions
from preprocessing.video import demo_video

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_video_pipeline_has_every_step_and_its_clip_parameters():
    spec = yaml.safe_load(open(os.path.join(ROOT, definitions.COMPILED_FILES[definitions.VIDEO_PIPELINE])))
    assert spec["pipelineInfo"]["name"] == "video-segmentation"
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["clip_length"]["defaultValue"] == 16 and parameters["size"]["defaultValue"] == "128,128"
    assert parameters["preset"]["defaultValue"] == "video" and parameters["predict_input_uri"]["defaultValue"] == ""
    for name in ("train_input_uri", "eval_input_uri", "accelerator_type", "tpu_topology", "input_partition_dims"):
        assert name in parameters
    for step in ("comp-preprocess-video", "comp-train", "comp-evaluate", "comp-export", "comp-predict"):
        assert any(c.startswith(step) for c in spec["components"]), step
    assert not any(c.startswith("comp-preprocess-ct") for c in spec["components"])


@pytest.mark.slow
@pytest.mark.e2e
def test_video_pipeline_runs_locally(tmp_path):
    train = demo_video.write_demo_videos(str(tmp_path / "train"), videos=2, frames=8, size=(16, 16), seed=0)
    held_out = demo_video.write_demo_videos(str(tmp_path / "eval"), videos=1, frames=12, size=(16, 16), seed=1)
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as users have
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline", "video-segmentation",
         "--pipeline-root", str(tmp_path / "root"), "--param", f"train_input_uri={train['videos']}",
         "--param", f"eval_input_uri={held_out['videos']}", "--param", f"predict_input_uri={held_out['videos']}",
         "--param", "clip_length=8", "--param", "size=16,16", "--param", "steps=2",
         "--param", 'train_overrides={"model.num_levels": 2, "model.base_filters": 4}'],
        capture_output=True, text=True, cwd=ROOT, env=environment, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = dict(line.rsplit(": ", 1) for line in result.stdout.splitlines() if line.count("/") and ": /" in line)
    summary = json.load(open(os.path.join(outputs["preprocess-video/dataset"], "summary.json")))
    assert summary["ok"] == 2 and summary["preprocessing"]["shape"] == [8, 16, 16]  # one 8-frame clip per video
    scores = json.load(open(outputs["evaluate/metrics"]))
    assert len(scores["dice_per_class"]) == 3
    assert os.path.exists(os.path.join(outputs["export/exported"], "saved_model", "saved_model.pb"))
    masks = outputs["predict/masks"]
    predicted = json.load(open(os.path.join(masks, "summary.json")))
    assert predicted["videos"][0]["frames"] == 12 and len(os.listdir(os.path.join(masks, "motion_000"))) == 12
    assert Image.open(os.path.join(masks, "motion_000", "00011.png")).size == (16, 16)
    assert os.path.getsize(os.path.join(masks, "motion_000.overlay.mp4")) > 0
