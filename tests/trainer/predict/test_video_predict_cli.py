"""`fullres predict` with a video model, through the CLI (issue 51): each mask carries its own frame's name (after a
gap, with unpadded names, in YouTube-VOS's every-fifth-frame folders); the split changes no mask; a second predict
into its own output folder works; CT-only options are refused. The run is written untrained (`video_runs`)."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from tests import files
from tests.trainer.predict import video_runs


def _predict(*arguments) -> tuple[int, list[str], str]:
    """`fullres predict` in this process (the 8 test devices): (exit code, error lines, everything said)."""
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["predict", *arguments])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line.removeprefix("fullres: error: ") for line in result.stderr.splitlines()
              if line.startswith("fullres: error:")]
    return result.exit_code, errors, result.stdout + result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return video_runs.write_run(tmp_path_factory.mktemp("video_run") / "run")


def _davis(root, videos: dict[str, list[str]]):
    for video, names in videos.items():
        video_runs.write_frames(root / "JPEGImages" / video, names)
    return root


@pytest.mark.slow  # predicts three videos (about 8 s on 2 cores)
def test_each_mask_is_named_after_its_own_frame(run, tmp_path):
    """Before: masks were numbered by position, so after a gap frame 00003.jpg was masked as 00002.png, and a
    YouTube-VOS folder (00000, 00005, ...) got 00000, 00001, ...: masks matched neither frames nor Annotations."""
    frames = _davis(tmp_path / "davis", {"gap": ["00000.jpg", "00001.jpg", "00003.jpg", "00004.jpg"],
                                         "vos": [f"{t:05d}.jpg" for t in range(0, 30, 5)],
                                         "plain": ["frame_1.jpg", "frame_2.jpg", "frame_3.jpg"]})
    code, errors, said = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "masks"))
    assert code == 0, said
    masks = tmp_path / "masks"
    assert sorted(os.listdir(masks / "gap")) == ["00000.png", "00001.png", "00003.png", "00004.png"]
    assert sorted(os.listdir(masks / "vos")) == [f"{t:05d}.png" for t in range(0, 30, 5)]
    assert sorted(os.listdir(masks / "plain")) == ["frame_1.png", "frame_2.png", "frame_3.png"]


@pytest.mark.slow  # predicts once, then again into the same folder (about 6 s)
def test_a_second_predict_into_its_own_output_works_and_a_foreign_file_is_refused(run, tmp_path):
    """Before: the rerun was refused as "files fullres did not write" (the masks' folder was not listed)."""
    frames = _davis(tmp_path / "davis", {"walk": [f"{t:05d}.jpg" for t in range(4)]})
    output = tmp_path / "masks"
    arguments = ("--model", run, "--input", str(frames), "--output", str(output))
    assert _predict(*arguments)[0] == 0
    first = (output / "walk" / "00002.png").read_bytes()
    code, errors, said = _predict(*arguments)
    assert code == 0, said
    assert (output / "walk" / "00002.png").read_bytes() == first
    (output / "walk" / "notes.txt").write_text("mine")  # a user's file among the masks
    before = files.snapshot(output)
    code, errors, _ = _predict(*arguments)
    assert code == 2 and len(errors) == 1 and "walk/notes.txt" in errors[0], errors
    assert files.snapshot(output) == before


@pytest.mark.slow  # predicts one 20-frame video under three splits (about 10 s)
def test_the_split_changes_no_mask(tmp_path):
    """Before: a 20-frame video split 2 ways in time was padded to 24 frames, unsplit to 20; instance normalization
    averages over the padding, so 12 % of mask pixels differed. Now every split runs on the training split's
    padding (each axis divisible by its parts; XLA splits the lower levels unevenly, exactly)."""
    run = video_runs.write_run(tmp_path / "run", dims=(1, 1, 1, 1, 1))
    frames = _davis(tmp_path / "davis", {"clip": [f"{t:05d}.jpg" for t in range(20)]})
    masks = {}
    for dims in ("1,1,1,1,1", "1,2,1,1,1", "1,4,1,1,1", "1,2,2,1,1"):
        output = tmp_path / dims
        code, _, said = _predict("--model", run, "--input", str(frames), "--output", str(output),
                                 "--input-partition-dims", dims)
        assert code == 0, said
        summary = json.loads((output / "summary.json").read_text())
        assert summary["split"]["input_partition_dims"] == [int(d) for d in dims.split(",")]
        assert "note" not in summary["videos"][0]["why"], summary["videos"][0]["why"]
        masks[dims] = np.stack([np.asarray(Image.open(output / "clip" / f"{t:05d}.png")) for t in range(20)])
    assert len(np.unique(masks["1,1,1,1,1"])) > 1  # the comparison is not of empty masks
    for dims, mask in masks.items():
        assert np.array_equal(mask, masks["1,1,1,1,1"]), dims


@pytest.mark.slow  # writes the untrained run (module fixture, about 5 s), then refuses twice before reading
def test_options_for_scans_are_refused_with_a_video_model(run, tmp_path):
    """Before: `--format nifti`, `--probabilities` and `--sliding-window` did nothing with a video model, silently."""
    frames = _davis(tmp_path / "davis", {"walk": ["00000.jpg", "00001.jpg"]})
    before = files.snapshot(tmp_path)
    code, errors, said = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "masks"),
                                  "--format", "nifti", "--probabilities", "--sliding-window")
    assert code == 2 and errors == [
        f"--format nifti, --probabilities, --sliding-window apply to CT scans, but --model {run} is a video model, "
        "which writes a palette PNG mask per frame and an overlay MP4 (docs/video.md); leave them out."], said
    code, errors, _ = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "masks"),
                               "--no-dicom-seg")
    assert code == 2 and errors[0].startswith("--no-dicom-seg applies to CT scans"), errors
    assert files.snapshot(tmp_path) == before
