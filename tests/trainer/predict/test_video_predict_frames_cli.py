"""`fullres predict` with a video model on frame folders as cameras and phones leave them: 16-bit PNGs, EXIF
orientation, a symlinked video folder. Predict reads frames by the rule `fullres preprocess video` does
(`preprocessing.video.frames.read_frame`), so the model sees what it was trained on; the run is untrained
(`video_runs`)."""

import json
import os

import av
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from pipelines import cli
from tests.trainer.predict import video_runs

UPRIGHT = (32, 24)  # (H, W) of the pictures as shown: portrait, as a phone held upright films


def _pictures(count: int) -> np.ndarray:
    """(count, H, W) uint8 grey pictures: a gradient and a bright square that moves down."""
    y, x = np.mgrid[0:UPRIGHT[0], 0:UPRIGHT[1]]
    out = np.empty((count, *UPRIGHT), np.uint8)
    for t in range(count):
        out[t] = 30 + 4 * x + 3 * y
        out[t, 2 + 2 * t:10 + 2 * t, 6:14] = 250
    return out


def _save(folder, pictures, save) -> None:
    folder.mkdir(parents=True)
    for t, picture in enumerate(pictures):
        save(picture, folder / f"{t:05d}.{'jpg' if 'jpg' in save.__name__ else 'png'}")


def _png8(picture, path):
    Image.fromarray(picture).save(path)


def _png16(picture, path):
    Image.fromarray(picture.astype(np.uint16) * 257).save(path)  # 0..65535: 255 × 257 is white


def _jpg_upright(picture, path):
    Image.fromarray(picture).convert("RGB").save(path, quality=95)


def _jpg_phone(picture, path):
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: turn 90° clockwise to show, as phones write
    Image.fromarray(np.ascontiguousarray(np.rot90(picture, 1))).convert("RGB").save(path, exif=exif, quality=95)


def _overlay_means(path) -> list[float]:
    with av.open(str(path)) as container:
        return [float(frame.to_ndarray(format="rgb24").mean()) for frame in container.decode(video=0)]


@pytest.mark.slow  # writes an untrained run and predicts five videos (about 15 s on 2 idle cores, 58 s under load)
def test_predict_reads_16_bit_turned_and_linked_frame_folders_as_preprocess_does(tmp_path):
    """Before: the 16-bit video was predicted from an all-white picture (and its overlay was white), the phone's
    masks were of the stored, turned size, and the linked folder was left out ("4 video(s)", exit 0)."""
    run = video_runs.write_run(tmp_path / "run")
    pictures = _pictures(8)
    clips = tmp_path / "clips"
    _save(clips / "grey8", pictures, _png8)
    _save(clips / "grey16", pictures, _png16)
    _save(clips / "upright", pictures, _jpg_upright)
    _save(clips / "phone", pictures, _jpg_phone)
    _save(tmp_path / "elsewhere" / "linked", pictures, _png8)
    os.symlink(tmp_path / "elsewhere" / "linked", clips / "linked")
    result = CliRunner().invoke(cli.app, ["predict", "--model", run, "--input", str(clips), "--output",
                                          str(tmp_path / "masks")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert result.exit_code == 0, result.output
    masks = tmp_path / "masks"
    summary = json.loads((masks / "summary.json").read_text())
    assert sorted(video["video"] for video in summary["videos"]) == ["grey16", "grey8", "linked", "phone", "upright"]
    assert summary["dead_letters"] == []
    # 16 bits scaled to their depth: the very picture of the 8-bit frames, so the same masks and overlay.
    for t in range(8):
        assert (masks / "grey16" / f"{t:05d}.png").read_bytes() == (masks / "grey8" / f"{t:05d}.png").read_bytes()
        assert (masks / "linked" / f"{t:05d}.png").read_bytes() == (masks / "grey8" / f"{t:05d}.png").read_bytes()
    grey8, grey16 = _overlay_means(masks / "grey8.overlay.mp4"), _overlay_means(masks / "grey16.overlay.mp4")
    assert grey8[0] < 200 and np.allclose(grey16, grey8, atol=1.0), (grey16, grey8)
    # The phone's frames as shown: masks (and overlay) upright, over the same pictures as the upright JPEGs.
    phone = [np.asarray(Image.open(masks / "phone" / f"{t:05d}.png")) for t in range(8)]
    upright = [np.asarray(Image.open(masks / "upright" / f"{t:05d}.png")) for t in range(8)]
    assert phone[0].shape == UPRIGHT
    assert np.mean(np.stack(phone) == np.stack(upright)) > 0.95
    phone_video = next(video for video in summary["videos"] if video["video"] == "phone")
    assert phone_video["source_size"] == list(UPRIGHT)
    with av.open(str(masks / "phone.overlay.mp4")) as container:
        assert (container.streams.video[0].height, container.streams.video[0].width) == UPRIGHT
