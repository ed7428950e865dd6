"""`fullres preprocess images` reads a photo as it is shown: a JPEG stored turned, with the EXIF Orientation that
turns it upright (6: turn 90° clockwise to show, as phones write), becomes an upright record whose boxes fall on the
object they were drawn around; one annotated at its stored size is a dead letter that names both sizes."""

import glob
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from typer.testing import CliRunner

from pipelines import cli
from preprocessing.records import detection_schema

BEAM = ("--workers", "1", "--direct_running_mode=in_memory")
SHOWN = (40, 80)  # (H, W) of the picture as shown: landscape
SQUARE = (5, 50, 25, 70)  # (top, left, bottom, right) of the white square on the picture as shown


def _photo(path, turned: bool) -> None:
    """A white square on black; `turned` stores it as a phone does: turned 90° anticlockwise, tagged Orientation 6."""
    picture = np.zeros((*SHOWN, 3), np.uint8)
    top, left, bottom, right = SQUARE
    picture[top:bottom, left:right] = 255
    if not turned:
        Image.fromarray(picture).save(path, quality=95)
        return
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.rot90(picture).copy()).save(path, quality=95, exif=exif)  # (W, H, 3) as stored


def _convert(tmp_path, sizes: dict[str, tuple[int, int]]):
    """Runs the command on one COCO file whose images have the annotated (width, height) `sizes`; the square's box."""
    images = tmp_path / "images"
    images.mkdir()
    for name in sizes:
        _photo(images / name, turned=name.startswith("phone"))
    top, left, bottom, right = SQUARE
    coco = {"images": [{"id": i + 1, "file_name": name, "width": w, "height": h}
                       for i, (name, (w, h)) in enumerate(sizes.items())],
            "categories": [{"id": 1, "name": "square"}],
            "annotations": [{"id": i + 1, "image_id": i + 1, "category_id": 1,
                             "bbox": [left, top, right - left, bottom - top]} for i in range(len(sizes))]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    return CliRunner().invoke(cli.app, [
        "preprocess", "images", "--annotations", str(tmp_path / "coco.json"), "--images", str(images),
        "--output", str(tmp_path / "out"), "--max-failed-fraction", "1", *BEAM])


def _records(output, names):
    """The records by image name (`names` in the COCO file's order: its ids are 1, 2, ...)."""
    files = sorted(glob.glob(str(output / "data-*.tfrecord")))
    parsed = [detection_schema.parse_detection_example(raw) for raw in tf.data.TFRecordDataset(files)]
    return {names[int(record["source_id"].numpy()) - 1]: record for record in parsed}


@pytest.mark.slow
def test_a_phone_photo_is_stored_upright_with_its_boxes_on_the_object(tmp_path):
    """Before: the JPEG's bytes were kept as stored (80 tall, 40 wide) while COCO said 80×40, a size_mismatch dead
    letter; had the size been left out, the record was sideways and the box fell on black; and one annotated at its
    stored size was converted sideways. That one is set aside with a sentence naming both sizes and both fixes: which
    picture its boxes were drawn on is not known."""
    names = ["phone.jpg", "upright.jpg", "phone_stored_size.jpg"]
    result = _convert(tmp_path, dict(zip(names, [(80, 40), (80, 40), (40, 80)])))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    records = _records(tmp_path / "out", names)
    assert sorted(records) == ["phone.jpg", "upright.jpg"]
    for record in records.values():
        image = record["image"].numpy()  # (H, W, 3) decoded as training decodes it
        assert image.shape == (*SHOWN, 3)
        ymin, xmin, ymax, xmax = np.round(record["boxes"].numpy()[0] * [*SHOWN, *SHOWN]).astype(int)
        assert image[ymin:ymax, xmin:xmax].mean() > 240  # the box holds the white square...
        inside = np.zeros(SHOWN, bool)
        inside[ymin:ymax, xmin:xmax] = True
        assert image[~inside].mean() < 10  # ...and nothing white lies outside it
    # The turned photo is the upright one (within JPEG's few levels), not the same picture turned.
    assert np.max(np.abs(np.subtract(records["phone.jpg"]["image"].numpy(), records["upright.jpg"]["image"].numpy(),
                                     dtype=int))) <= 40
    letters = [json.loads(line) for line in (tmp_path / "out" / "dead_letter.jsonl").read_text().splitlines()]
    assert [(letter["source"].rsplit("/", 1)[-1], letter["reason"]) for letter in letters] == [
        ("phone_stored_size.jpg", "orientation_mismatch")]
    assert letters[0]["detail"] == (
        "annotations say 40×80, the size of the picture as stored, but its EXIF Orientation 6 shows it turned, as "
        "80×40, and boxes may have been drawn on either: if they were drawn on the picture as shown (as viewers and "
        "annotation tools show it), set the width and height to 80×40; if on the picture as stored, remove the tag "
        "(exiftool -Orientation= FILE)")
