"""`fullres preprocess video` and `fullres demo-data video` on the command line: mistakes in one sentence, before Beam."""

import os

import pytest
from typer.testing import CliRunner

from pipelines import cli


@pytest.mark.parametrize("extra, sentence", [
    (["--size", "64"], "--size 64 must be two positive sizes H,W, e.g. --size 128,128."),
    (["--clip-length", "0"], "--clip-length 0 and --clip-stride 0 must be 1 or more, e.g. --clip-length 16 --clip-stride 8."),
    (["--fit", "squash"], "--fit 'squash' is not known; use one of crop, resize."),
    (["--labels", "nowhere"], "--labels 'nowhere' does not exist."),
])
def test_preprocess_video_refuses_a_bad_option_in_one_sentence(tmp_path, extra, sentence):
    (tmp_path / "videos").mkdir()
    result = CliRunner().invoke(cli.app, ["preprocess", "video", "--input", str(tmp_path / "videos"), "--output",
                                          str(tmp_path / "out"), *extra])
    assert result.exit_code == 2 and result.stderr.strip() == f"fullres: error: {sentence}", result.output
    assert not (tmp_path / "out").exists()


def test_a_folder_without_videos_is_named(tmp_path):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "notes.txt").write_text("no video here")
    result = CliRunner().invoke(cli.app, ["preprocess", "video", "--input", str(tmp_path / "videos"), "--output",
                                          str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 2 and "no videos (.mp4" in result.stderr and str(tmp_path / "videos") in result.stderr


def test_demo_data_video_writes_videos_with_a_mask_per_frame(tmp_path):
    result = CliRunner().invoke(cli.app, ["demo-data", "video", "--output", str(tmp_path / "demo"), "--videos", "2",
                                          "--frames", "5", "--size", "17,20"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "demo" / "videos"
    assert sorted(os.listdir(folder)) == ["motion_000", "motion_000.mp4", "motion_001", "motion_001.mp4"]
    assert sorted(os.listdir(folder / "motion_001")) == [f"{t:05d}.png" for t in range(5)]
    from tests.preprocessing.video import video_makers

    assert video_makers.ffmpeg_probe(str(folder / "motion_000.mp4")) == {"frames": 5, "size": (18, 20), "fps": 24.0}
