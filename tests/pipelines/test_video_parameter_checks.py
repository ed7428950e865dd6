"""The video pipeline's clip parameters are judged one at a time: `clip_length=0` was refused together
with the default `clip_stride 0`, which means clips side by side and is valid."""

import pytest
from typer.testing import CliRunner

from pipelines import cli
from tests.pipelines.test_parameter_checks import _one_sentence


@pytest.mark.parametrize("given, sentence", [
    (["--param", "clip_length=0"],
     "--param clip_length 0 must be 1 or more, e.g. --param clip_length=16 --param clip_stride=8."),
    (["--param", "clip_length=8", "--param", "clip_stride=-1"],
     "--param clip_stride -1 must be 0 (clips side by side) or more, e.g. --param clip_length=16 --param "
     "clip_stride=8."),
])
def test_one_wrong_clip_parameter_is_named_alone(tmp_path, given, sentence):
    videos = tmp_path / "videos"
    videos.mkdir()
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline", "video-segmentation",
                                          "--pipeline-root", str(tmp_path / "root"), "--param",
                                          f"train_input_uri={videos}", "--param", f"eval_input_uri={videos}", *given])
    assert _one_sentence(result) == sentence
    assert not (tmp_path / "root").exists()
