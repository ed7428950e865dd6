"""What a browser shows of an HTML report: how many images, which did not load, the table rows, the SVG lines, and
the colour of each image's top-left pixel as drawn.

With Debian's chromium present (the README's test command installs it where it can), the page is opened headless
and the browser itself says what it loaded and drew (`check`). Where Chromium cannot be installed, every embedded
image is decoded and the tables are parsed instead (the issue's stated fallback).
"""

import base64
import html
import html.parser
import io
import json
import re
import shutil
import subprocess

import numpy as np
from PIL import Image

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Appended to a copy of the page: once everything has loaded, the browser writes what it saw into the DOM. Each
# image is drawn on a canvas to read the pixel the browser shows (data: URIs do not taint a canvas).
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const corners = images.map(i => {
    if (!(i.complete && i.naturalWidth > 0)) return null;
    const canvas = document.createElement("canvas");
    canvas.width = i.naturalWidth; canvas.height = i.naturalHeight;
    const context = canvas.getContext("2d");
    context.drawImage(i, 0, 0);
    return [...context.getImageData(0, 0, 1, 1).data.slice(0, 3)];
  });
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({images: images.length, broken: broken,
                                    rows: document.querySelectorAll("tbody tr").length,
                                    svg: document.querySelectorAll("svg polyline").length, corners: corners});
  document.body.appendChild(out);
});
</script>"""


def in_browser(page: str, tmp_path, probe: str = PROBE) -> dict:
    """What `probe` (a script that writes JSON into `<pre id="probe">` once the page has loaded) saw in Chromium."""
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", probe + "</body>"))
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


def decoded(page: str) -> dict:
    parser = _Tables()
    parser.feed(page)
    broken, corners = [], []
    for source in parser.images:
        try:
            header, data = source.split(",", 1)
            assert header == "data:image/png;base64"
            picture = Image.open(io.BytesIO(base64.b64decode(data)))
            picture.load()
            corners.append([int(v) for v in np.asarray(picture.convert("RGB"))[0, 0]])
        except Exception:  # noqa: BLE001  (any failure means the image would not show)
            broken.append(source[:40])
            corners.append(None)
    return {"images": len(parser.images), "broken": broken, "rows": parser.rows,
            "svg": page.count("<polyline"), "corners": corners}


def check(page: str, tmp_path) -> dict:
    """What the page shows (see the module docstring): in Chromium where it is installed, else decoded here."""
    return in_browser(page, tmp_path) if CHROMIUM else decoded(page)
