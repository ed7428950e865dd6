"""`fullres preprocess video`: good videos become clip records beside a dead letter for each hostile one."""

import json
import os

import numpy as np

from preprocessing.beam import local_workers, video_pipeline
from preprocessing.records import tfrecord_files
from preprocessing.video import video_clips
from tests.preprocessing.video import video_makers
from trainer.data import ct_input

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def test_hostile_videos_are_dead_letters_and_the_good_ones_are_published(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    images = video_makers.frames(16, (48, 64))
    masks = np.zeros((16, 48, 64), np.uint8)
    masks[:, 8:24, 20:40] = 1
    for name in ("good_a", "good_b"):
        video_makers.encode(str(videos / f"{name}.mp4"), images, 25)
        video_makers.write_masks(videos / name, masks)
    video_makers.encode(str(videos / "unlabelled.avi"), images, 10, codec="mpeg4")
    data = open(video_makers.encode(str(videos / "whole.mp4"), images, 25, faststart=True), "rb").read()
    os.remove(videos / "whole.mp4")
    (videos / "cut.mp4").write_bytes(data[:len(data) // 2])
    (videos / "empty.mp4").write_bytes(b"")
    video_makers.encode(str(videos / "vfr.mp4"), images, 25, durations_ms=[40, 100])
    video_makers.encode(str(videos / "phone.mp4"), images, 25, rotation=270)
    video_makers.encode(str(videos / "short_masks.mp4"), images, 25)
    video_makers.write_masks(videos / "short_masks", masks[:15])  # one frame without its mask
    video_makers.encode_audio_only(str(videos / "podcast.mp4"))
    output = tmp_path / "clips"
    config = video_clips.VideoPreprocessConfig(clip_length=8, size=(32, 32))
    summary = video_pipeline.run(str(videos), str(output), config=config, pipeline_args=IN_PROCESS,
                                 max_failed_fraction=1.0, log=lambda line: None)
    letters = {json.loads(line)["source"]: json.loads(line) for line in open(output / "dead_letter.jsonl")}
    assert {source: letter["reason"] for source, letter in letters.items()} == {
        "cut.mp4": "cut_short", "empty.mp4": "empty_file", "vfr.mp4": "variable_frame_rate",
        "phone.mp4": "rotation_metadata", "short_masks.mp4": "label_frames_missing", "podcast.mp4": "audio_only",
        "unlabelled.avi": "masks_missing"}  # beside labelled videos: never clips of all background
    assert "unlabelled/00000.png" in letters["unlabelled.avi"]["detail"]
    assert all(str(tmp_path) not in letter["detail"] for letter in letters.values())  # no absolute paths
    assert summary["ok"] == 4 and summary["videos"] == 2 and summary["frames"] == 32  # 2 good videos, 2 clips each
    assert summary["label_values"] == {"0": 4, "1": 4} and summary["preprocessing"]["shape"] == [8, 32, 32]
    examples = {e["case_id"]: e for e in ct_input.read_examples(str(output))}
    assert sorted(examples) == ["good_a@00000", "good_a@00008", "good_b@00000", "good_b@00008"]
    assert examples["good_a@00008"]["image"].shape == (8, 32, 32, 3)
    assert examples["good_a@00000"]["label"].max() == 1 and examples["good_b@00000"]["label"].max() == 1
    records = ct_input.CtRecords(str(output))
    layout = records.layout(0)
    assert (layout.channels, layout.stored, layout.slab_depth) == (3, np.uint8, 1)  # 8 slabs of one frame
    share_image, share_label = np.empty((2, 32, 32, 3), np.uint8), np.empty((2, 32, 32), np.uint8)
    records.read(0, 2, 4, share_image, share_label)  # a process holding frames 2 and 3 reads only those slabs
    whole = examples[layout.case_id]
    assert np.allclose(share_image * layout.scale, whole["image"][2:4]) and (share_label == whole["label"][2:4]).all()
    shard = tfrecord_files.RecordFile(os.path.join(output, summary["shards"][0]))
    assert len(shard) == 4
    records.close()
    shard.close()
