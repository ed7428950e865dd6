"""The HTML report renders in a real browser: every image loads, the tables hold the scores, a clip's frames show
in their own colours (`report_browser`: Chromium where installed, else the images decoded here).
"""

import re

import numpy as np
import pytest

from tests.trainer.tasks import report_browser
from trainer.tasks import report

def _segmentation_page(**more_scores):
    rng = np.random.default_rng(0)
    label = np.zeros((16, 24, 20), np.int32)
    label[4:10, 6:14, 5:12] = 1
    label[10:13, 15:20, 12:16] = 2
    prediction = np.roll(label, 1, axis=1)
    image = (label * 0.3 + rng.normal(0, 0.1, label.shape))[..., None].astype(np.float32)
    samples = [{"case_id": "case-a", "image": image, "label": label, "prediction": prediction}]
    scores = {"dice_per_class": [0.99, 0.81, None], "dice_mean": 0.81, "cases": 1, **more_scores}
    return report.segmentation_report(scores, samples, [[10, 1.2], [20, 0.8], [30, 0.5]],
                                      ["background", "liver", "kidney"])


BACKGROUND, SQUARE = (51, 102, 204), (230, 200, 20)  # a clip's blue background and yellow square, uint8 RGB


def _clip_sample():
    """8 frames of 16x20 RGB: a yellow square moving right 1 pixel a frame over blue (class 1), as evaluation gives
    a clip: uint8 / 255 (the records' scale)."""
    frames = np.empty((8, 16, 20, 3), np.uint8)
    frames[:] = BACKGROUND
    label = np.zeros((8, 16, 20), np.int32)
    for t in range(8):
        frames[t, 5:10, 4 + t:9 + t] = SQUARE
        label[t, 5:10, 4 + t:9 + t] = 1
    image = frames.astype(np.float32) * np.float32(1 / 255)
    return {"case_id": "clip-a", "image": image, "label": label, "prediction": np.roll(label, 1, axis=2),
            "video": True}


def _video_page():
    return report.segmentation_report({"dice_per_class": [0.99, 0.8], "dice_mean": 0.8, "cases": 1}, [_clip_sample()],
                                      [[1, 1.0], [2, 0.5]], ["background", "right"])


def test_a_clips_frames_show_in_their_own_colours(tmp_path):
    """Before: the report drew channel 0 (red) of a clip in grey, with CT's axial/coronal/sagittal names; now the
    browser draws the frame's own RGB (the background's exact colour in every view's corner) and names a frame and
    two slices through time."""
    page = _video_page()
    seen = report_browser.check(page, tmp_path)
    assert seen["images"] == 6 and seen["broken"] == [], seen
    assert seen["corners"] == [list(BACKGROUND)] * 6, seen["corners"]
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    # the square's centre over time: frame 4 (of 0-7), row 7, column 10 (4 + t + 2 at t = 4)
    assert captions == ["frame 4: true", "frame 4: predicted", "row 7 over time: true", "row 7 over time: predicted",
                        "column 10 over time: true", "column 10 over time: predicted"]
    assert "axial" not in page and "time runs down" in page


def test_a_clip_overlay_tints_the_frames_colours():
    sample = _clip_sample()
    frame, mask = sample["image"][4], sample["label"][4]
    picture = report.overlay(frame, mask)
    assert (picture[mask == 0] == BACKGROUND).all() and picture.shape == (16, 20, 3)
    tinted = np.round(0.55 * np.array(SQUARE, np.float32) + 0.45 * np.array(report.PALETTE[1], np.float32))
    assert np.abs(picture[mask == 1].astype(np.float32) - tinted).max() <= 1
    # a time slice of a clip: time runs down, the square's slant shows (row 7: x = 4 + t .. 8 + t at frame t)
    row = np.round(report.orthogonal_slices(sample["image"], sample["label"], video=True)["row"][0] * 255)
    assert row.shape == (8, 20, 3) and [int(np.argmax((row[t] == SQUARE).all(-1))) for t in range(8)] == \
        [4 + t for t in range(8)]


def _detection_page(**more_scores):
    image = np.full((64, 80, 3), 0.5, np.float32)
    truth = {"boxes": np.array([[10, 10, 30, 40]], np.float32), "classes": np.array([1])}
    found = {"boxes": np.array([[11, 9, 31, 41], [40, 50, 60, 70]], np.float32), "scores": np.array([0.9, 0.2]),
             "classes": np.array([1, 0])}
    scores = {"mAP": 0.55, "mAP@0.5": 0.9, "per_class_AP": {"circle": 0.5, "square": 0.6}, "images": 1, **more_scores}
    return report.detection_report(scores, [{"source_id": "img-1", "image": image, "truth": truth, "detections": found}],
                                   [[1, 2.0], [2, 1.0]], ["circle", "square"])


@pytest.mark.parametrize("build, images, rows", [(_segmentation_page, 6, 3), (_detection_page, 1, 2)])
def test_report_renders_every_image_and_table(build, images, rows, tmp_path):
    page = build()
    seen = report_browser.check(page, tmp_path)
    corners = seen.pop("corners")
    assert seen == {"images": images, "broken": [], "rows": rows, "svg": 1}, seen
    assert len(corners) == images and all(len(set(corner)) == 1 for corner in corners), corners  # grey pages


def test_a_broken_image_is_noticed(tmp_path):
    """The check can fail: one corrupted image is reported as not loaded."""
    page = _segmentation_page()
    first = re.search(r'src="(data:image/png;base64,[^"]+)"', page).group(1)
    page = page.replace(first, "data:image/png;base64,bm90IGFuIGltYWdl", 1)
    seen = report_browser.check(page, tmp_path)
    assert len(seen["broken"]) == 1


def test_report_shows_the_scores():
    page = _segmentation_page()
    assert "0.810" in page and "n/a" in page and "liver" in page
    assert "mAP@0.5 <strong>0.900</strong>" in _detection_page()


def test_overlay_colours_the_classes():
    slice_2d = np.zeros((4, 4), np.float32)
    mask = np.array([[0, 1, 2, 0]] * 4)
    picture = report.overlay(slice_2d, mask)
    assert (picture[:, 0] == 0).all()  # background untouched (black)
    assert picture[0, 1, 0] > picture[0, 1, 2] and picture[0, 2, 2] > picture[0, 2, 0]  # red-ish vs blue-ish


# What a reader sees first: the element right under the title, whether it is drawn, its text and colour, and the
# line after it (the headline score, so the note comes before any number).
NOTE_PROBE = """<script>
window.addEventListener("load", () => {
  const under = document.querySelector("h1").nextElementSibling;
  const box = under.getBoundingClientRect();
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({id: under.id, text: under.innerText, drawn: box.height > 0 && box.width > 0,
                                    background: getComputedStyle(under).backgroundColor,
                                    then: under.nextElementSibling.innerText.split(";")[0],
                                    above_the_table: box.bottom <= document.querySelector("table").getBoundingClientRect().top});
  document.body.appendChild(out);
});
</script>"""
NOTE = "scored across preprocessings: --eval ct3/data-* has spacing [3.0, 3.0, 3.0], the training data [1.5, 1.5, 2.5]"


@pytest.mark.parametrize("build", [_segmentation_page, _detection_page])
def test_scores_across_preprocessings_say_so_under_the_title(build, tmp_path):
    page = build(across_preprocessings=NOTE)
    if report_browser.CHROMIUM:
        seen = report_browser.in_browser(page, tmp_path, NOTE_PROBE)
        then = "1 held-out cases" if build is _segmentation_page else "1 held-out images"
        assert seen == {"id": "across-preprocessings", "drawn": True, "above_the_table": True, "then": then,
                        "background": "rgb(255, 244, 214)",
                        "text": f"Warning: {NOTE}; these are not the model's scores on data prepared as its training "
                                "data were (--eval-across-preprocessings)."}, seen
    else:
        assert page.index('id="across-preprocessings"') < page.index("<table")
    assert "across-preprocessings" not in build()  # no note where none was asked for


def test_a_three_channel_volume_that_is_not_a_clip_shows_in_grey(tmp_path):
    """Three channels of a CT or an MR (modalities, windows) are not red, green and blue: the report drew any
    3-channel volume in colour; only a clip's frames are. Each view shows channel 0, grey."""
    sample = _clip_sample()
    sample.pop("video")
    page = report.segmentation_report({"dice_per_class": [0.99, 0.8], "dice_mean": 0.8, "cases": 1}, [sample],
                                      [[1, 1.0], [2, 0.5]], ["background", "lesion"])
    seen = report_browser.check(page, tmp_path)
    assert seen["images"] == 6 and seen["broken"] == [], seen
    assert all(red == green == blue for red, green, blue in seen["corners"]), seen["corners"]  # grey, untinted
    assert "axial" in page and "time runs down" not in page
