"""`fullres preprocess video` on frame folders with what real cameras, phones and archives leave in them: 16-bit
PNGs, EXIF orientation, symlinked video folders, millisecond timestamps as names, a macOS zip's `__MACOSX/`, a
one-frame video, `--folder-fps inf`. Each case is read as the picture is, or named; none is silently wrong."""

import json
import os

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from pipelines import cli
from tests import files
from tests.preprocessing.video import video_makers

SIZE = (24, 32)  # (H, W) of the frames written here


def _preprocess(tmp_path, source, *extra, output="out"):
    return CliRunner().invoke(cli.app, ["preprocess", "video", "--input", str(source), "--output",
                                        str(tmp_path / output), "--clip-length", "4", "--size", "16,16",
                                        "--workers", "1", "--direct_running_mode=in_memory", *extra])


def _letters(output) -> dict:
    path = output / "dead_letter.jsonl"
    return {json.loads(line)["source"]: json.loads(line) for line in open(path)} if path.exists() else {}


def _pictures(count: int) -> np.ndarray:
    """(count, H, W) uint8 grey pictures: a gradient and a bright square that moves right, so every pixel differs."""
    y, x = np.mgrid[0:SIZE[0], 0:SIZE[1]]
    out = np.empty((count, *SIZE), np.uint8)
    for t in range(count):
        out[t] = 40 + 3 * x + 2 * y
        out[t, 6:14, 4 + 2 * t:12 + 2 * t] = 240
    return out


def test_16_bit_png_frames_are_scaled_to_their_bit_depth_not_clipped_to_white(tmp_path):
    """Before: every pixel of a greyscale I;16 PNG (scientific and depth cameras) became 255, exit 0, no word."""
    pictures = _pictures(4)
    for name, scale, dtype in (("eight", 1, np.uint8), ("sixteen", 257, np.uint16)):
        folder = tmp_path / "clips" / name
        folder.mkdir(parents=True)
        for t, picture in enumerate(pictures):
            Image.fromarray(picture.astype(dtype) * scale).save(folder / f"{t:05d}.png")
    assert Image.open(tmp_path / "clips" / "sixteen" / "00000.png").mode == "I;16"
    result = _preprocess(tmp_path, tmp_path / "clips")
    assert result.exit_code == 0, result.output
    found = video_makers.clip_frames(tmp_path / "out")
    assert found["eight@00000"][2][0] < 200  # the picture's own grey, far from white
    assert found["sixteen@00000"][2] == found["eight@00000"][2]  # 65535 is white as 255 is: the same picture


def _phone_frames(folder, pictures: np.ndarray, orientation: int = 6) -> None:
    """JPEGs stored turned, with the EXIF Orientation that turns them upright (6: turn 90° clockwise to show), as
    phones write them."""
    folder.mkdir(parents=True)
    for t, picture in enumerate(pictures):
        exif = Image.Exif()
        exif[0x0112] = orientation
        stored = np.ascontiguousarray(np.rot90(picture, 1))  # turned 90° counter-clockwise: what the sensor wrote
        Image.fromarray(stored).convert("RGB").save(folder / f"{t:05d}.jpg", exif=exif, quality=95)


def test_jpeg_frames_with_exif_orientation_are_read_upright_and_their_masks_line_up(tmp_path):
    """Before: frames were read as stored (turned 90°), so masks drawn on the upright picture were refused as of
    another size, or, on square frames, turned against their pictures."""
    pictures = _pictures(4)
    upright = tmp_path / "clips" / "upright"
    upright.mkdir(parents=True)
    for t, picture in enumerate(pictures):
        Image.fromarray(picture).convert("RGB").save(upright / f"{t:05d}.jpg", quality=95)
    _phone_frames(tmp_path / "clips" / "phone", pictures)
    _phone_frames(tmp_path / "clips" / "phone_masks", pictures)
    masks = (pictures == 240).astype(np.uint8)  # the square, drawn on the upright picture
    for video in ("upright", "phone"):
        video_makers.write_masks(tmp_path / "masks" / video, masks)
    (tmp_path / "masks" / "phone_masks").mkdir()
    for t, mask in enumerate(masks):  # masks stored turned too, with the tag that turns them upright
        image, exif = Image.fromarray(np.ascontiguousarray(np.rot90(mask, 1))), Image.Exif()
        image.putpalette([0, 0, 0, 255, 0, 0])
        exif[0x0112] = 6
        image.save(tmp_path / "masks" / "phone_masks" / f"{t:05d}.png", exif=exif)
    result = _preprocess(tmp_path, tmp_path / "clips", "--labels", str(tmp_path / "masks"), "--fit", "resize")
    assert result.exit_code == 0, result.output
    assert _letters(tmp_path / "out") == {}
    found = video_makers.clip_frames(tmp_path / "out")
    assert sorted(found) == ["phone@00000", "phone_masks@00000", "upright@00000"]
    # The phone's frames are the upright frames (within JPEG's few levels), not the same picture turned.
    assert np.max(np.abs(np.subtract(found["phone@00000"][2], found["upright@00000"][2]))) <= 2
    from trainer.data import ct_input

    examples = {e["case_id"]: e for e in ct_input.read_examples(str(tmp_path / "out" / "data-*"))}
    for video in ("phone", "phone_masks"):
        np.testing.assert_array_equal(examples[f"{video}@00000"]["label"], examples["upright@00000"]["label"])
        image, label = examples[f"{video}@00000"]["image"][..., 0], examples[f"{video}@00000"]["label"]
        assert image[label == 1].mean() > image[label == 0].mean() + 0.2  # the mask lies on the square


def test_a_symlinked_video_folder_is_read_like_the_others(tmp_path):
    """Before: `clips/dog -> elsewhere/dog` (and `JPEGImages/dog -> ...` in a DAVIS folder) was left out without a
    word: "1 videos", exit 0."""
    video_makers.write_frames(tmp_path / "clips" / "cat", [f"{t:05d}.jpg" for t in range(4)])
    video_makers.write_frames(tmp_path / "elsewhere" / "dog", [f"{t:05d}.jpg" for t in range(4)])
    os.symlink(tmp_path / "elsewhere" / "dog", tmp_path / "clips" / "dog")
    os.symlink(tmp_path / "clips", tmp_path / "clips" / "cat" / "loop")  # a link back up: read once, no loop
    video_makers.write_frames(tmp_path / "davis" / "JPEGImages" / "cat", [f"{t:05d}.jpg" for t in range(4)])
    os.symlink(tmp_path / "elsewhere" / "dog", tmp_path / "davis" / "JPEGImages" / "dog")
    for source, output, layout in (("clips", "out", "frame folders"),
                                   ("davis", "davis_out", "frame folders (DAVIS / YouTube-VOS)")):
        result = _preprocess(tmp_path, tmp_path / source, output=output)
        assert result.exit_code == 0, result.output
        assert f"2 videos ({layout}, 0 with masks)" in result.output
        assert sorted(video_makers.clip_frames(tmp_path / output)) == ["cat@00000", "dog@00000"]


def test_frames_named_by_millisecond_timestamps_are_ordered_without_inventing_a_missing_frame(tmp_path):
    """Before: `1701234567000.jpg, 1701234567033.jpg, 1701234567067.jpg, ...` (30 fps, steps of 33 and 34 ms) was a
    dead letter: "frame 1701234567066 is missing". A frame really dropped (a step of twice the others) is named."""
    start = 1701234567000
    stamps = [start + round(t * 1000 / 30) for t in range(8)]  # 1701234567000, ...033, ...067, ...100, ...
    video_makers.write_frames(tmp_path / "clips" / "camera", [f"{s}.jpg" for s in stamps])
    jitter = [start + 33 * t + (0, 2, -3, 1, 0, -2, 3, 1)[t] for t in range(8)]  # a capture clock's own jitter
    video_makers.write_frames(tmp_path / "clips" / "jitter", [f"frame_{s}.png" for s in jitter])
    dropped = [s for s in stamps if s != stamps[5]]  # ...167 dropped: ...133 is followed by ...200
    video_makers.write_frames(tmp_path / "clips" / "dropped", [f"{s}.jpg" for s in dropped])
    result = _preprocess(tmp_path, tmp_path / "clips", "--max-failed-fraction", "1")
    assert result.exit_code == 0, result.output
    found = video_makers.clip_frames(tmp_path / "out")
    assert sorted(found) == ["camera@00000", "camera@00004", "jitter@00000", "jitter@00004"]
    assert found["camera@00004"][1] == tuple(str(s) for s in stamps[4:])
    assert found["camera@00004"][2] == (90, 110, 130, 150)  # files 4..7's pictures, in time order
    letters = _letters(tmp_path / "out")
    assert list(letters) == ["dropped/"] and letters["dropped/"]["reason"] == "frame_missing"
    assert letters["dropped/"]["detail"].startswith(
        f"a frame is missing between {stamps[4]}.jpg and {stamps[6]}.jpg: their numbers are 67 apart, the other "
        "frames' 33 to 34, so a clip over the gap would jump in time"), letters["dropped/"]["detail"]


def test_a_macos_zips_folder_is_ignored_as_hidden_files_are(tmp_path):
    """Before: unzipping a macOS zip leaves `__MACOSX/<video>/._00000.jpg`, which failed the conversion as two
    frameless videos."""
    for video in ("cat", "dog"):
        video_makers.write_frames(tmp_path / "clips" / video, [f"{t:05d}.jpg" for t in range(4)])
        apple = tmp_path / "clips" / "__MACOSX" / video
        apple.mkdir(parents=True)
        for t in range(4):
            (apple / f"._{t:05d}.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (tmp_path / "clips" / "cat" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")  # Windows' thumbnails
    result = _preprocess(tmp_path, tmp_path / "clips")
    assert result.exit_code == 0, result.output
    assert "2 videos (frame folders, 0 with masks; 2 hidden files (._*, .DS_Store, Thumbs.db, __MACOSX/) ignored)" \
        in result.output
    assert _letters(tmp_path / "out") == {}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["hidden_files_ignored"] == 2


def test_a_video_shorter_than_a_clip_is_told_what_would_help(tmp_path):
    """Before: a 1-frame video was told `--clip-length 1 or less, or leave it out`, though the default (16) is no
    shorter and 0 is no clip length."""
    video_makers.write_frames(tmp_path / "clips" / "still", ["00000.jpg"])
    (tmp_path / "clips" / "short").mkdir()
    for t, picture in enumerate(_pictures(20)):  # longer than the default clip (16 frames)
        Image.fromarray(picture).save(tmp_path / "clips" / "short" / f"{t:05d}.png")
    result = _preprocess(tmp_path, tmp_path / "clips", "--clip-length", "24", "--max-failed-fraction", "1")
    assert "Traceback" not in result.output, result.output
    letters = _letters(tmp_path / "out")
    assert letters["still/"]["detail"] == ("it has 1 frame, fewer than one clip of --clip-length 24; pass "
                                           "--clip-length 1")
    assert letters["short/"]["detail"] == ("it has 20 frames, fewer than one clip of --clip-length 24; pass "
                                           "--clip-length 20 or less, or leave it out (16 frames)")
    result = _preprocess(tmp_path, tmp_path / "clips" / "still", "--max-failed-fraction", "1", output="default")
    assert _letters(tmp_path / "default")["still/"]["detail"] == (
        "it has 1 frame, fewer than one clip of --clip-length 4; pass --clip-length 1")


def test_an_infinite_folder_fps_is_refused_and_nothing_is_written(tmp_path):
    """Before: `--folder-fps inf` was accepted and recorded as the clips' frame rate (nan and 0 were refused)."""
    video_makers.write_frames(tmp_path / "clips" / "cat", [f"{t:05d}.jpg" for t in range(4)])
    before = files.snapshot(tmp_path)
    for value in ("inf", "-inf", "nan", "0"):
        result = _preprocess(tmp_path, tmp_path / "clips", "--folder-fps", value)
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (f"fullres: error: --folder-fps {float(value)} must be a positive, finite "
                                         "frame rate, e.g. 24."), result.output
        assert files.snapshot(tmp_path) == before and not (tmp_path / "out").exists()
