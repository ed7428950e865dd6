"""The HTML report renders in a real browser: every image loads, the tables hold the scores.

With Debian's chromium present (the README's test command installs it where
it can), the page is opened headless and the browser itself says which images
loaded. Where Chromium cannot be installed, every embedded image is decoded
and the tables are parsed instead (the issue's stated fallback).
"""

import base64
import html.parser
import io
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from trainer.tasks import report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Appended to a copy of the page: once everything has loaded, the browser writes what it saw into the DOM.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({images: images.length, broken: broken,
                                    rows: document.querySelectorAll("tbody tr").length,
                                    svg: document.querySelectorAll("svg polyline").length});
  document.body.appendChild(out);
});
</script>"""


def _segmentation_page():
    rng = np.random.default_rng(0)
    label = np.zeros((16, 24, 20), np.int32)
    label[4:10, 6:14, 5:12] = 1
    label[10:13, 15:20, 12:16] = 2
    prediction = np.roll(label, 1, axis=1)
    image = (label * 0.3 + rng.normal(0, 0.1, label.shape))[..., None].astype(np.float32)
    samples = [{"case_id": "case-a", "image": image, "label": label, "prediction": prediction}]
    scores = {"dice_per_class": [0.99, 0.81, None], "dice_mean": 0.81, "cases": 1}
    return report.segmentation_report(scores, samples, [[10, 1.2], [20, 0.8], [30, 0.5]],
                                      ["background", "liver", "kidney"])


def _detection_page():
    image = np.full((64, 80, 3), 0.5, np.float32)
    truth = {"boxes": np.array([[10, 10, 30, 40]], np.float32), "classes": np.array([1])}
    found = {"boxes": np.array([[11, 9, 31, 41], [40, 50, 60, 70]], np.float32), "scores": np.array([0.9, 0.2]),
             "classes": np.array([1, 0])}
    scores = {"mAP": 0.55, "mAP@0.5": 0.9, "per_class_AP": {"circle": 0.5, "square": 0.6}, "images": 1}
    return report.detection_report(scores, [{"source_id": "img-1", "image": image, "truth": truth, "detections": found}],
                                   [[1, 2.0], [2, 1.0]], ["circle", "square"])


def _in_browser(page: str, tmp_path) -> dict:
    import json

    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--no-first-run", "--virtual-time-budget=5000", "--dump-dom",
         path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, flags=re.S)
    assert found, f"the browser did not run the page: {result.stderr[-500:]}"
    return json.loads(html.unescape(found.group(1)))


class _Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.rows, self.in_body = [], 0, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "tbody":
            self.in_body = True
        if tag == "tr" and self.in_body:
            self.rows += 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.in_body = False


def _decoded(page: str) -> dict:
    parser = _Tables()
    parser.feed(page)
    broken = []
    for source in parser.images:
        try:
            header, data = source.split(",", 1)
            assert header == "data:image/png;base64"
            Image.open(io.BytesIO(base64.b64decode(data))).load()
        except Exception:  # noqa: BLE001  (any failure means the image would not show)
            broken.append(source[:40])
    return {"images": len(parser.images), "broken": broken, "rows": parser.rows,
            "svg": page.count("<polyline")}


def _check(page: str, tmp_path) -> dict:
    return _in_browser(page, tmp_path) if CHROMIUM else _decoded(page)


@pytest.mark.parametrize("build, images, rows", [(_segmentation_page, 6, 3), (_detection_page, 1, 2)])
def test_report_renders_every_image_and_table(build, images, rows, tmp_path):
    page = build()
    seen = _check(page, tmp_path)
    assert seen == {"images": images, "broken": [], "rows": rows, "svg": 1}, seen


def test_a_broken_image_is_noticed(tmp_path):
    """The check can fail: one corrupted image is reported as not loaded."""
    page = _segmentation_page()
    first = re.search(r'src="(data:image/png;base64,[^"]+)"', page).group(1)
    page = page.replace(first, "data:image/png;base64,bm90IGFuIGltYWdl", 1)
    seen = _check(page, tmp_path)
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
