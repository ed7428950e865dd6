"""`fullres preprocess video` on folders of frames: every layout taken, frames in time order by their own names,
and every frame folder that cannot be used named in a dead letter (never a silent jump, gap or hidden file)."""

import json
import os

import numpy as np
from typer.testing import CliRunner

from pipelines import cli
from tests.preprocessing.video import video_makers


def _preprocess(tmp_path, source, *extra):
    return CliRunner().invoke(cli.app, ["preprocess", "video", "--input", str(source), "--output",
                                        str(tmp_path / "out"), "--clip-length", "4", "--size", "16,16",
                                        "--workers", "1", "--direct_running_mode=in_memory", *extra])


def _letters(output) -> dict:
    return {json.loads(line)["source"]: json.loads(line) for line in open(output / "dead_letter.jsonl")}


def test_a_folder_of_frame_folders_orders_frames_by_number_and_names_every_folder_it_cannot_use(tmp_path):
    clips = tmp_path / "clips"
    video_makers.write_frames(clips / "ffmpeg", [f"{t:05d}.jpg" for t in range(1, 9)])  # ffmpeg's %05d starts at 1
    (clips / "ffmpeg" / "._00001.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS's copy of the metadata
    video_makers.write_frames(clips / "unpadded", [f"frame_{t}.png" for t in range(1, 13)])
    video_makers.write_frames(clips / "youtube_vos", [f"{t:05d}.jpg" for t in range(0, 40, 5)])
    video_makers.write_frames(clips / "gap", [f"{t:05d}.jpg" for t in range(10) if t != 7])
    video_makers.write_frames(clips / "two_patterns", ["a_1.jpg", "b_2.jpg", "a_3.jpg", "a_4.jpg"])
    video_makers.write_masks(clips / "masks" / "cat", np.zeros((4, 24, 32), np.uint8))  # masks are not frames
    (clips / "empty").mkdir()
    (clips / "empty" / ".DS_Store").write_bytes(b"Bud1")
    result = _preprocess(tmp_path, clips, "--max-failed-fraction", "1")
    assert result.exit_code == 0, result.output
    output = tmp_path / "out"
    letters = _letters(output)
    assert {source: letter["reason"] for source, letter in letters.items()} == {
        "gap/": "frame_missing", "two_patterns/": "frame_names_unordered", "empty/": "no_frames",
        os.path.join("masks", "cat") + "/": "frame_is_a_mask"}
    assert letters["gap/"]["detail"].startswith("frame 00007 is missing: the frames go in steps of 1 but 00006.jpg "
                                                "is followed by 00008.jpg")
    summary = json.loads((output / "summary.json").read_text())
    assert summary["layout"] == "frame folders" and summary["hidden_files_ignored"] == 2
    found = video_makers.clip_frames(output)
    assert found["unpadded@00004"][1] == ("frame_5", "frame_6", "frame_7", "frame_8")  # not frame_10, frame_11, ...
    assert found["unpadded@00008"][1] == ("frame_9", "frame_10", "frame_11", "frame_12")
    assert found["unpadded@00008"][2] == (170, 190, 210, 230)  # the pictures of files 9..12, in that order
    assert found["youtube_vos@00004"][:2] == ((4, 5, 6, 7), ("00020", "00025", "00030", "00035"))
    assert found["ffmpeg@00000"][1] == ("00001", "00002", "00003", "00004")
    assert sorted(found) == ["ffmpeg@00000", "ffmpeg@00004", "unpadded@00000", "unpadded@00004", "unpadded@00008",
                             "youtube_vos@00000", "youtube_vos@00004"]


def test_one_folder_of_frames_is_one_video_with_its_masks_in_labels(tmp_path):
    video_makers.write_frames(tmp_path / "frames", [f"{t:05d}.jpg" for t in range(1, 9)])
    masks = np.zeros((8, 24, 32), np.uint8)
    masks[:, 4:12, 4:12] = 1
    video_makers.write_masks(tmp_path / "masks", masks, start=1)
    result = _preprocess(tmp_path, tmp_path / "frames", "--labels", str(tmp_path / "masks"))
    assert result.exit_code == 0, result.output
    assert "1 videos (a frame folder, 1 with masks)" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["label_values"] == {"0": 2, "1": 2}
    assert video_makers.clip_frames(tmp_path / "out")["frames@00004"][1] == ("00005", "00006", "00007", "00008")


def _davis(root, labelled=("bear", "car")):
    for video in ("bear", "car"):
        video_makers.write_frames(root / "JPEGImages" / video, [f"{t:05d}.jpg" for t in range(4)])
        if video in labelled:
            video_makers.write_masks(root / "Annotations" / video, np.ones((4, 24, 32), np.uint8))
    return root


def test_a_davis_video_without_masks_beside_labelled_ones_is_a_dead_letter_not_background(tmp_path):
    davis = _davis(tmp_path / "DAVIS", labelled=("bear",))
    (davis / "Annotations" / "bear" / "._00000.png").write_bytes(b"AppleDouble")  # not a mask of a frame ._00000
    result = _preprocess(tmp_path, davis, "--max-failed-fraction", "1")
    assert result.exit_code == 0, result.output
    letters = _letters(tmp_path / "out")
    assert list(letters) == ["car/"] and letters["car/"]["reason"] == "masks_missing"
    assert "expected DAVIS/Annotations/car/00000.png" in letters["car/"]["detail"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["label_values"] == {"1": 1} and summary["hidden_files_ignored"] == 1


def test_labels_that_name_no_masks_are_refused_and_nothing_is_written(tmp_path):
    from tests import files

    davis = _davis(tmp_path / "DAVIS")
    bare = _davis(tmp_path / "bare", labelled=())
    (bare / "Annotations").mkdir()  # there, but empty: not a reason to train on all background
    video_makers.write_frames(tmp_path / "plain" / "frames", [f"{t:05d}.jpg" for t in range(1, 5)])
    video_makers.write_frames(tmp_path / "plain" / "frames" / "more", ["00001.jpg"])
    (tmp_path / "notes.txt").write_text("masks are elsewhere")
    video_makers.write_frames(tmp_path / "mixed" / "frames", ["00001.jpg"])
    video_makers.encode(str(tmp_path / "mixed" / "clip.mp4"), video_makers.frames(4, (24, 32)), 25)
    (tmp_path / "empty").mkdir()
    before = files.snapshot(tmp_path)
    cases = [
        (davis, ["--labels", str(tmp_path / "notes.txt")],
         f"--labels {tmp_path / 'notes.txt'} is a file; name the folder that holds the masks, "
         "<folder>/<video>/00000.png, ... (of a DAVIS folder: its Annotations/)."),
        (davis, ["--labels", str(davis)],
         f"--labels {davis} is a DAVIS / YouTube-VOS folder, not its masks; name the masks folder: "
         f"--labels {davis / 'Annotations'}."),
        (davis, ["--labels", str(tmp_path / "empty")],
         f"--labels {tmp_path / 'empty'} holds no masks for any of the 2 videos (expected e.g. "
         f"{tmp_path / 'empty' / 'bear' / '00000.png'}); name the folder that holds <video>/00000.png masks, or leave "
         "the masks out to convert the videos unlabelled."),
        (bare, [],
         f"{bare / 'Annotations'} holds no masks for any of the 2 videos (expected e.g. "
         f"{bare / 'Annotations' / 'bear' / '00000.png'}); name the folder that holds <video>/00000.png masks, or "
         "leave the masks out to convert the videos unlabelled."),
        (tmp_path / "plain" / "frames", [],
         f"--input {tmp_path / 'plain' / 'frames'} holds frames and also folders of frames (more/); pass one frame "
         "folder (one video), or a folder of frame folders (one video each)."),
        (tmp_path / "plain", [],
         f"{tmp_path / 'plain' / 'frames'} holds frames and also a folder of frames (more/), so which video a frame "
         "belongs to is ambiguous; keep each video's frames in a folder of their own, and masks outside them "
         "(--labels)."),
        (tmp_path / "mixed", [],
         f"--input {tmp_path / 'mixed'} holds video files and also a folder of images that no video is named like "
         "(frames/), so it is neither a video's masks nor taken as a video; convert the frame folders apart, or name "
         "the folder like its video."),
        (davis, ["--size", "100000,100000"],
         "--size 100000,100000 with --clip-length 4 makes clips of 149.01 GiB decoded (4 frames × 100000 × 100000 "
         "pixels × 4 bytes: RGB and mask), over --max-decoded-bytes 3.00 GiB; choose a smaller --size (e.g. 128,128) "
         "or --clip-length, or raise --max-decoded-bytes if the workers have that memory to spare."),
    ]
    for source, extra, sentence in cases:
        result = _preprocess(tmp_path, source, *extra)
        assert result.exit_code == 2 and result.stderr.strip() == f"fullres: error: {sentence}", result.output
        assert files.snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_a_video_too_long_to_decode_within_the_bound_is_a_dead_letter_before_it_fills_memory(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    video_makers.encode(str(videos / "long.mp4"), video_makers.frames(12, (24, 32)), 25)
    video_makers.encode(str(videos / "short.mp4"), video_makers.frames(4, (24, 32)), 25)
    # 16 × 16 pixels × 4 bytes = 1 KiB a frame: 4 fit in 5 KiB, 12 do not
    result = _preprocess(tmp_path, videos, "--max-decoded-bytes", "5KiB", "--max-failed-fraction", "1")
    assert result.exit_code == 0, result.output
    letters = _letters(tmp_path / "out")
    assert list(letters) == ["long.mp4"] and letters["long.mp4"]["reason"] == "too_large"
    assert letters["long.mp4"]["detail"].startswith("it has 12 frames, which at --size 16,16 take more than 5.0 KiB")
