"""`fullres preprocess video` on folders of frames: every layout taken, frames in time order by their own names,
and every frame folder that cannot be used named in a dead letter (never a silent jump, gap or hidden file)."""

import json

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
    (clips / "empty").mkdir()
    (clips / "empty" / ".DS_Store").write_bytes(b"Bud1")
    result = _preprocess(tmp_path, clips, "--max-failed-fraction", "1")
    assert result.exit_code == 0, result.output
    output = tmp_path / "out"
    letters = _letters(output)
    assert {source: letter["reason"] for source, letter in letters.items()} == {
        "gap/": "frame_missing", "two_patterns/": "frame_names_unordered", "empty/": "no_frames"}
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
    import numpy as np

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
