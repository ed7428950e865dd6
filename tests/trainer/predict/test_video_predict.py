"""`fullres predict` with a video model: a 300-frame video gives 300 masks (DAVIS layout) and a 300-frame overlay MP4;
whole in one pass when it fits, in overlapping clips when it does not (and the summary says which, and why)."""

import json
import os

import jax
import pytest
from PIL import Image

from preprocessing.records import dataset_files
from preprocessing.video import video_clips
from tests.preprocessing.video import video_makers
from trainer import train, trained_run
from trainer import presets
from trainer.engine import inference
from trainer.models import unet
from trainer.parallel import partitioning
from trainer.predict import video_outputs, video_predict

pytestmark = pytest.mark.slow  # trains a tiny video model (2 steps) and predicts 340 frames

CLIP = (8, 16, 16)


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("video_run")
    data = folder / "clips"
    data.mkdir()
    video_makers.write_motion_clip_records(str(data / "data-00000-of-00001.tfrecord"), CLIP)
    settings = video_clips.VideoPreprocessConfig(clip_length=CLIP[0], size=CLIP[1:])
    dataset_files.write_summary(str(data), {"ok": 2, "failed": 0, "shards": ["data-00000-of-00001.tfrecord"],
                                            "label_values": {"0": 2, "1": 2, "2": 2},
                                            "preprocessing": video_clips.preprocessing_record(settings)})
    config = presets.video(
        train_data=str(data), output_dir=str(folder / "run"), steps=2, checkpoint_every=2, log_every=1,
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, in_channels=3, num_levels=2, base_filters=4, stem="none"),
        partition=partitioning.PartitionConfig((1, 2, 2, 1, 1)))  # 2 replicas on 8 devices
    lines = []
    train.train(config, log=lines.append, export_saved_model=False)
    return folder, lines


def test_training_on_clips_says_its_reach_in_frames_and_pixels(video_run):
    _, lines = video_run
    assert any(line.startswith("receptive field: each output pixel sees") and "frames" in line for line in lines)


def test_a_300_frame_video_gives_300_masks_and_an_overlay(video_run, tmp_path):
    folder, _ = video_run
    videos = tmp_path / "videos"
    videos.mkdir()
    video_makers.encode(str(videos / "long.mp4"), video_makers.frames(300, (36, 50)), 30)
    video_makers.encode(str(videos / "short.avi"), video_makers.frames(20, (24, 24)), 10, codec="mpeg4")
    (videos / "broken.mp4").write_bytes(b"")
    output = tmp_path / "masks"
    summary = video_predict.predict_videos(str(folder / "run"), str(videos), str(output), max_failed_fraction=0.5,
                                           log=lambda line: None)
    by_name = {video["video"]: video for video in summary["videos"]}
    assert sorted(os.listdir(output / "long")) == [f"{t:05d}.png" for t in range(300)]
    mask = Image.open(output / "long" / "00123.png")
    assert mask.mode == "P" and mask.size == (50, 36)  # the source's own frame size
    assert mask.getpalette()[:9] == video_outputs.davis_palette()[:9]
    assert video_makers.ffmpeg_probe(str(output / "long.overlay.mp4")) == {"frames": 300, "size": (36, 50), "fps": 30.0}
    assert by_name["long"]["method"] == "whole" and by_name["long"]["why"].startswith("whole video in one pass (300")
    assert by_name["short"]["frames"] == 20 and len(os.listdir(output / "short")) == 20
    assert [letter["reason"] for letter in summary["dead_letters"]] == ["empty_file"]
    assert json.load(open(output / "summary.json"))["ok"] == 2


def test_a_video_that_does_not_fit_one_pass_goes_in_overlapping_clips(video_run, tmp_path):
    folder, _ = video_run
    loaded = trained_run.load(str(folder / "run"), jax.devices()[:4])
    levels = loaded.config.model.downsampling_levels
    shape = (1, 64, *CLIP[1:], 3)
    probe = inference.VolumePredictor(loaded.model, loaded.state, loaded.config.partition, jax.devices(), levels)
    memory = probe.compiled(shape).memory_analysis()
    whole_bytes = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    tight = inference.VolumePredictor(loaded.model, loaded.state, loaded.config.partition, jax.devices(), levels,
                                      device_memory=whole_bytes // 2)
    in_one, why = video_predict._method(tight, 64, CLIP[1:], CLIP[0], forced=False)
    assert not in_one and why.startswith("overlapping clips of 8 frames") and "does not fit" in why
    videos = tmp_path / "videos"
    videos.mkdir()
    video_makers.encode(str(videos / "walk.mp4"), video_makers.frames(40, (16, 16)), 25)
    summary = video_predict.predict_videos(str(folder / "run"), str(videos), str(tmp_path / "out"), clips=True,
                                           log=lambda line: None)
    assert summary["videos"][0]["method"] == "clips" and len(os.listdir(tmp_path / "out" / "walk")) == 40


def test_the_evaluation_report_shows_clips_in_their_own_colours(video_run, tmp_path):
    """The pipeline's evaluate step on clips: the report drew a clip's red channel in grey; a
    browser now shows each view's background in the frames' own colour (blue here) and names frames, not axial."""
    import numpy as np

    from preprocessing.records import tfrecord_files, video_clips as clip_records
    from tests.trainer.tasks import report_browser
    from trainer import evaluate

    folder, _ = video_run
    data = tmp_path / "coloured"
    data.mkdir()
    background = (51, 102, 204)
    frames = np.empty((*CLIP, 3), np.uint8)
    frames[:] = background
    masks = np.zeros(CLIP, np.uint8)
    for t in range(CLIP[0]):
        frames[t, 6:10, 3 + t:7 + t] = (230, 200, 20)
        masks[t, 6:10, 3 + t:7 + t] = 1
    tfrecord_files.write_records(str(data / "data-00000-of-00001.tfrecord"), [clip_records.encode_video_clip(
        clip_records.VideoClip("yellow@00000", "yellow.mp4", frames, masks, 24.0, tuple(range(CLIP[0])), CLIP[0],
                               CLIP[1:], label_values=(0, 1)))])
    settings = video_clips.VideoPreprocessConfig(clip_length=CLIP[0], size=CLIP[1:])
    dataset_files.write_summary(str(data), {"ok": 1, "failed": 0, "shards": ["data-00000-of-00001.tfrecord"],
                                            "label_values": {"0": 1, "1": 1},
                                            "preprocessing": video_clips.preprocessing_record(settings)})
    report = tmp_path / "report.html"
    scores = evaluate.evaluate_trained(str(folder / "run"), str(data), report_path=str(report), log=lambda line: None)
    assert scores["cases"] == 1
    page = report.read_text()
    seen = report_browser.check(page, tmp_path)
    assert seen["images"] == 6 and seen["broken"] == []
    assert seen["corners"][::2] == [list(background)] * 3, seen["corners"]  # the true masks leave the corners clear
    assert "frame 4: true" in page and "column 8 over time: true" in page and "axial" not in page


def test_a_clip_model_trained_split_2x2_predicts_on_one_device_with_the_same_masks(video_run, tmp_path):
    """As predict and evaluation do for scans: no option, the training split's axes in fewer parts (1,1,1,1,1 on one
    device), the volume padded as the training split pads it; every mask equal to the 4-device prediction's."""
    import subprocess
    import sys

    import numpy as np

    folder, _ = video_run
    videos = tmp_path / "videos"
    videos.mkdir()
    video_makers.encode(str(videos / "clip.mp4"), video_makers.frames(20, (24, 24)), 10)
    split = video_predict.predict_videos(str(folder / "run"), str(videos), str(tmp_path / "split"), overlay=False,
                                         log=lambda line: None)
    assert split["split"]["input_partition_dims"] == [1, 2, 2, 1, 1]
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "predict", "--model", str(folder / "run"), "--input", str(videos),
         "--output", str(tmp_path / "one")],
        capture_output=True, text=True, env=environment, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(__file__))))), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    one = json.load(open(tmp_path / "one" / "summary.json"))
    assert one["split"]["input_partition_dims"] == [1, 1, 1, 1, 1] and one["split"]["devices_present"] == 1
    assert "the same axes in fewer parts" in result.stderr + result.stdout
    for t in range(20):
        a = np.asarray(Image.open(tmp_path / "split" / "clip" / f"{t:05d}.png"))
        b = np.asarray(Image.open(tmp_path / "one" / "clip" / f"{t:05d}.png"))
        assert (a == b).all(), t
