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
                                          "--frames", "5", "--size", "18,20"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "demo" / "videos"
    assert sorted(os.listdir(folder)) == ["motion_000", "motion_000.mp4", "motion_001", "motion_001.mp4"]
    assert sorted(os.listdir(folder / "motion_001")) == [f"{t:05d}.png" for t in range(5)]
    from tests.preprocessing.video import video_makers

    assert video_makers.ffmpeg_probe(str(folder / "motion_000.mp4")) == {"frames": 5, "size": (18, 20), "fps": 24.0}


@pytest.mark.parametrize("extra, sentence", [
    # Before: 33,33 became 34×34 without a word, and any mistake listed every option as if each were wrong.
    (["--size", "33,33"], "--size 33,33: H.264 stores frames of even sizes only; pass --size 32,32 or --size 34,34."),
    (["--size", "a,b"], "--size 'a,b' is not a comma-separated list of ints; write it like 64,64."),
    (["--size", "64"], "--size 64 is not H,W; write it like --size 64,64."),
    (["--size", "8,8"], "--size 8,8: the squares need frames of 16 pixels or more a side; write it like --size 64,64."),
    (["--frames", "1"], "--frames 1 must be 2 or more, e.g. --frames 24."),
    (["--videos", "0"], "--videos 0 must be 1 or more, e.g. --videos 8."),
    (["--size", "100000,100000"], "--size 100000,100000 with --frames 24 makes a demo video of more than 3 GiB in "
                                  "memory; choose a smaller --size or fewer --frames, e.g. --size 64,64 --frames 24."),
])
def test_demo_data_video_names_the_one_option_that_is_wrong(tmp_path, extra, sentence):
    result = CliRunner().invoke(cli.app, ["demo-data", "video", "--output", str(tmp_path / "demo"), *extra])
    assert result.exit_code == 2 and result.stderr.strip() == f"fullres: error: {sentence}", result.output
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("command, sentence", [
    (["preprocess", "video", "--input", ".", "--output", "out", "--size", "a,b"],
     "--size 'a,b' is not a comma-separated list of ints; write it like 128,128."),
    (["plan", "--partitions", "two", "--image-size", "32,32,32"],
     "--partitions 'two' is not a comma-separated list of ints; write it like 1,2,4,8."),
    (["train", "--train", "data", "--output", "run", "--patch-size", "a,b,c"],
     "--patch-size 'a,b,c' is not a comma-separated list of ints; write it like 128,128,128."),
    (["train", "--train", "data", "--output", "run", "--patch-size", "0,1"],  # before: named TrainConfig.patch_size
     "--patch-size 0,1: patch_size must be 3 positive sizes (segmentation only), got [0, 1]; write it like "
     "128,128,128."),
    (["train", "--train", "data", "--output", "run", "--set", "patch_size=a,b"],
     "--set patch_size 'a,b' is not a comma-separated list of ints; write it like 128,128,128."),
    (["pipeline", "run", "--local", "--pipeline", "video-segmentation", "--param", "train_input_uri=data",
      "--param", "eval_input_uri=data", "--param", "size=a,b"],
     "--param size 'a,b' is not a comma-separated list of ints; write it like 64,64."),
])
def test_a_list_option_that_does_not_parse_is_named_with_an_example_of_its_own_shape(tmp_path, monkeypatch, command,
                                                                                      sentence):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    result = CliRunner().invoke(cli.app, command)
    assert result.exit_code == 2 and result.stderr.strip() == f"fullres: error: {sentence}", result.output
    assert sorted(os.listdir(tmp_path)) == ["data"]
