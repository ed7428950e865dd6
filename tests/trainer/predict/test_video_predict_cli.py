"""`fullres predict` with a video model, through the CLI: each mask carries its own frame's name (after a
gap, with unpadded names, in YouTube-VOS's every-fifth-frame folders); the split changes no mask; a second predict
into its own output folder works; CT-only options are refused. The run is written untrained (`video_runs`)."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from tests import files
from tests.preprocessing.video import video_makers
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


@pytest.mark.slow  # predicts four videos (about 8 s on 2 cores)
def test_each_mask_is_named_after_its_own_frame(run, tmp_path):
    """Before: masks were numbered by position, so a YouTube-VOS folder (00000, 00005, ...) got 00000, 00001, ...
    and `frame_1 ... frame_12` got masks in text order under other names: masks matched neither frames nor
    Annotations. A gap in the numbers is a dead letter naming the missing frame (`frame_order`), not a shift."""
    frames = _davis(tmp_path / "davis", {"vos": [f"{t:05d}.jpg" for t in range(0, 30, 5)],
                                         "plain": [f"frame_{t}.jpg" for t in range(1, 13)],
                                         "gap": ["00000.jpg", "00001.jpg", "00003.jpg", "00004.jpg"]})
    code, errors, said = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "masks"),
                                  "--max-failed-fraction", "0.5")
    assert code == 0, said
    masks = tmp_path / "masks"
    assert sorted(os.listdir(masks / "vos")) == [f"{t:05d}.png" for t in range(0, 30, 5)]
    assert sorted(os.listdir(masks / "plain")) == sorted(f"frame_{t}.png" for t in range(1, 13))
    summary = json.loads((masks / "summary.json").read_text())
    assert [(letter["source"], letter["reason"]) for letter in summary["dead_letters"]] == [("gap/", "frame_missing")]
    assert not (masks / "gap").exists()
    # frame_10's mask is the prediction for frame_10 (the 10th frame, where the square has moved 9 pixels), not for
    # frame_2 (text order put frame_10 second): the mask of each frame equals that of the same frame predicted alone.
    alone = tmp_path / "alone"
    video_runs.write_frames(alone / "JPEGImages" / "plain", [f"frame_{t}.jpg" for t in range(1, 13)])
    assert _predict("--model", run, "--input", str(alone), "--output", str(tmp_path / "alone_masks"))[0] == 0
    for t in (2, 10, 12):
        assert (masks / "plain" / f"frame_{t}.png").read_bytes() == (
            tmp_path / "alone_masks" / "plain" / f"frame_{t}.png").read_bytes()


@pytest.mark.slow  # predicts a plain folder of frames and a folder of two such folders (about 8 s)
def test_a_plain_folder_of_frames_is_a_video(run, tmp_path):
    """What `ffmpeg -i clip.mp4 frames/%05d.jpg` writes was refused ("holds no video ... or frame
    folder"); now it is one video, named after the folder, with a mask per frame and the overlay."""
    video_runs.write_frames(tmp_path / "frames", [f"{t:05d}.jpg" for t in range(1, 11)])
    code, _, said = _predict("--model", run, "--input", str(tmp_path / "frames"), "--output", str(tmp_path / "one"))
    assert code == 0, said
    assert sorted(os.listdir(tmp_path / "one" / "frames")) == [f"{t:05d}.png" for t in range(1, 11)]
    assert video_makers.ffmpeg_probe(str(tmp_path / "one" / "frames.overlay.mp4"))["frames"] == 10
    for name in ("cat", "dog"):
        video_runs.write_frames(tmp_path / "clips" / name, [f"{t:05d}.jpg" for t in range(6)])
    code, _, said = _predict("--model", run, "--input", str(tmp_path / "clips"), "--output", str(tmp_path / "two"))
    assert code == 0, said
    assert sorted(os.listdir(tmp_path / "two")) == sorted([".fullres-output", "cat", "cat.overlay.mp4", "dog",
                                                           "dog.overlay.mp4", "dead_letter.jsonl", "summary.json"])
    assert len(os.listdir(tmp_path / "two" / "dog")) == 6


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


@pytest.mark.slow  # predicts one 20-frame video under five splits (about 15 s)
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
    # 20 frames do not divide 8 ways: padded to 24, and the video's `why` says its masks can differ.
    code, _, said = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "eight"),
                             "--input-partition-dims", "1,8,1,1,1")
    assert code == 0, said
    why = json.loads((tmp_path / "eight" / "summary.json").read_text())["videos"][0]["why"]
    assert ("note: split 1,8,1,1,1 pads 20×16×16 to 24×16×16, beyond the training split's 20×16×16, and the model "
            "sees padding") in why, why


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


@pytest.mark.slow  # writes an untrained CT run (about 3 s), then refuses before reading a frame
def test_a_ct_model_on_video_frames_is_one_sentence(tmp_path):
    """Before: a CT model given a DAVIS folder printed 88 pydicom errors, one per frame it tried as DICOM."""
    run = video_runs.write_ct_run(tmp_path / "ct_run")
    frames = _davis(tmp_path / "davis", {"bear": [f"{t:05d}.jpg" for t in range(4)]})
    (frames / "ImageSets").mkdir()
    (frames / "ImageSets" / "val.txt").write_text("bear\n")  # as DAVIS 2017 ships
    before = files.snapshot(tmp_path)
    code, errors, said = _predict("--model", run, "--input", str(frames), "--output", str(tmp_path / "masks"))
    assert code == 2 and errors == [
        f"--input {frames} holds videos or video frames (.jpg) and no scan, but --model {run} is a CT model, which "
        "segments scans (NIfTI, NRRD, MetaImage, DICOM); predict videos with a model trained on video clips "
        "(fullres preprocess video, then fullres train --preset video)."], said
    assert "pydicom" not in said.lower() and len(said.strip().splitlines()) == 1, said
    assert files.snapshot(tmp_path) == before
