"""Draws the memory-scaling plot for the README from `memory_scaling.py`'s JSON (Pillow only).

Left: activation memory per device against N (log-log), with the ideal 1/N
line from each series' N = 1. Right: efficiency E(N).

    uv run python benchmarks/partitioning/plot_memory_scaling.py benchmarks/results/memory_scaling.json benchmarks/results/memory_scaling.png
"""

from __future__ import annotations

import json
import math
import sys

from PIL import Image, ImageDraw

COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
PANEL_W, PANEL_H, MARGIN = 430, 320, 60


def _panel(draw, left, title, series, y_of, y_ticks, y_label, ideal=False):
    top = 40
    x0, x1, y0, y1 = left + MARGIN, left + PANEL_W - 10, top + PANEL_H - MARGIN, top + 10
    draw.rectangle([x0, y1, x1, y0], outline=(0, 0, 0))
    draw.text((left + MARGIN, 12), title, fill=(0, 0, 0))
    max_n = max(r["partitions"] for s in series for r in s["rows"])
    x_of = lambda n: x0 + (x1 - x0) * math.log2(n) / math.log2(max_n)  # noqa: E731
    for n in sorted({r["partitions"] for s in series for r in s["rows"]}):
        draw.line([x_of(n), y0, x_of(n), y0 + 4], fill=(0, 0, 0))
        draw.text((x_of(n) - 4, y0 + 8), str(n), fill=(0, 0, 0))
    draw.text(((x0 + x1) / 2 - 40, y0 + 24), "cores per replica N", fill=(0, 0, 0))
    for value, text in y_ticks:
        y = y_of(value, y0, y1)
        draw.line([x0 - 4, y, x0, y], fill=(0, 0, 0))
        draw.text((left + 8, y - 6), text, fill=(0, 0, 0))
    draw.text((left + 8, y1 - 30 + 10), y_label, fill=(0, 0, 0))
    for colour, s in zip(COLOURS, series):
        points = [(x_of(r["partitions"]), y_of(s["value"](r), y0, y1)) for r in s["rows"]]
        draw.line(points, fill=colour, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        if ideal:
            first = s["rows"][0]
            ideal_points = [(x_of(r["partitions"]), y_of(s["value"](first) / r["partitions"] * first["partitions"], y0, y1))
                            for r in s["rows"]]
            for (xa, ya), (xb, yb) in zip(ideal_points, ideal_points[1:]):  # dashed
                for t in range(0, 10, 2):
                    draw.line([xa + (xb - xa) * t / 10, ya + (yb - ya) * t / 10,
                               xa + (xb - xa) * (t + 1) / 10, ya + (yb - ya) * (t + 1) / 10], fill=colour)


def main(source: str, target: str) -> None:
    results = json.load(open(source))
    series = [{"label": f"{r['model']} {'x'.join(map(str, r['image_size']))} {r['precision']}{' + remat' if r['remat'] else ''}",
               "rows": r["rows"]} for r in results]
    image = Image.new("RGB", (2 * PANEL_W, PANEL_H + 40 + 20 * len(series) + 10), "white")
    draw = ImageDraw.Draw(image)
    gib = 2**30
    for s in series:
        s["value"] = lambda row: row["temp_bytes"] / gib
    low, high = math.log2(0.5), math.log2(32)
    log_y = lambda v, y0, y1: y0 - (y0 - y1) * (math.log2(max(v, 0.5)) - low) / (high - low)  # noqa: E731
    _panel(draw, 0, "activation memory per device (dashed: ideal 1/N)", series, log_y,
           [(v, f"{v:g} GiB") for v in (0.5, 1, 2, 4, 8, 16, 32)], "", ideal=True)
    efficiency_series = [{**s, "value": (lambda row: row["efficiency"])} for s in series]
    linear_y = lambda v, y0, y1: y0 - (y0 - y1) * (v - 0.5) / 0.55  # noqa: E731
    _panel(draw, PANEL_W, "efficiency E(N) = M(1) / (N * M(N))", efficiency_series, linear_y,
           [(v, f"{v:.1f}") for v in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)], "")
    for i, (colour, s) in enumerate(zip(COLOURS, series)):
        y = PANEL_H + 40 + 20 * i
        draw.rectangle([MARGIN, y + 4, MARGIN + 14, y + 10], fill=colour)
        draw.text((MARGIN + 22, y), s["label"], fill=(0, 0, 0))
    image.save(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
