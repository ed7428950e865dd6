"""The evaluation report: one self-contained HTML file (images embedded as PNG data URIs, the loss curve as SVG).

Segmentation: axial, coronal and sagittal slices of held-out cases with the
true and the predicted masks overlaid, a per-class Dice table, the loss curve.
A video clip (a sample with `video`) shows a frame and two slices through time
instead, in the frames' own RGB colours.
Detection: held-out images with true and predicted boxes, a per-class AP table,
the loss curve. Held-out data scored across preprocessings say so under the title.
Nothing is fetched from the network when it is opened.
"""

from __future__ import annotations

import base64
import html
import io

import numpy as np
from PIL import Image, ImageDraw

# Overlay colours per class id (class 0, background, is never drawn).
PALETTE = ((0, 0, 0), (230, 70, 60), (60, 140, 235), (250, 200, 40), (90, 200, 110), (200, 90, 220), (240, 140, 50))
TRUTH_COLOUR = (40, 220, 90)
# A clip's views (its first axis is time): a frame and two slices through time, none flipped; their captions.
VIDEO_VIEWS = {"frame": "frame {index}", "row": "row {index} over time", "column": "column {index} over time"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 70rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
table { border-collapse: collapse; } td, th { padding: .3rem .8rem; border-bottom: 1px solid #ddd; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
.cases { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; } figcaption { font-size: .85rem; color: #555; }
img { image-rendering: pixelated; border: 1px solid #ccc; }
.note { background: #fff4d6; border-left: .3rem solid #d99a00; padding: .6rem .9rem; }
.swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: middle; }
"""


def png_data_uri(image: np.ndarray) -> str:
    """An (H, W, 3) uint8 array as a `data:image/png;base64,...` URI."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _grey(slice_2d: np.ndarray) -> np.ndarray:
    low, high = float(slice_2d.min()), float(slice_2d.max())
    scaled = (slice_2d - low) / (high - low) if high > low else np.zeros_like(slice_2d)
    return np.repeat((scaled * 255).astype(np.uint8)[..., None], 3, axis=-1)


def _colour(slice_rgb: np.ndarray) -> np.ndarray:
    """An (h, w, 3) RGB slice as uint8: values in [0, 1] (a clip's frames, uint8 / 255) as they are; other ranges
    stretched to it over all three channels at once, so the colours keep their balance."""
    low, high = float(slice_rgb.min()), float(slice_rgb.max())
    if low < 0 or high > 1:
        slice_rgb = (slice_rgb - low) / (high - low) if high > low else np.zeros_like(slice_rgb)
    return np.round(np.clip(slice_rgb, 0, 1) * 255).astype(np.uint8)


def overlay(image_slice: np.ndarray, mask: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The slice, grey (h, w) or RGB (h, w, 3), with each foreground class of `mask` tinted in its palette colour."""
    picture = (_colour(image_slice) if image_slice.ndim == 3 else _grey(image_slice)).astype(np.float32)
    for class_id in np.unique(mask):
        if class_id == 0:
            continue
        colour = np.array(PALETTE[int(class_id) % len(PALETTE)], np.float32)
        where = mask == class_id
        picture[where] = (1 - alpha) * picture[where] + alpha * colour
    return picture.astype(np.uint8)


def _upscale(image: np.ndarray, minimum: int = 160) -> np.ndarray:
    factor = max(1, int(np.ceil(minimum / max(image.shape[:2]))))
    return np.kron(image, np.ones((factor, factor, 1), np.uint8)) if factor > 1 else image


def orthogonal_slices(volume: np.ndarray, label: np.ndarray, video: bool = False) -> dict[str, tuple[np.ndarray, int]]:
    """Axial, coronal and sagittal slices through the centre of the labelled foreground (or the volume).

    Args:
        volume: (D, H, W) intensities, or (D, H, W, C) channels (a clip's RGB frames); label: (D, H, W) class ids
            (or predictions).
        video: the first axis is time: a frame and the slices along time (`VIDEO_VIEWS`) instead.

    Returns:
        `{"axial": (slice, index), ...}` (a clip: `{"frame": ...}`) where each slice is 2-D (with the channels, if
        any) and the index is its position.
    """
    foreground = np.argwhere(label > 0)
    centre = foreground.mean(axis=0).round().astype(int) if len(foreground) else np.array(label.shape) // 2
    depth, row, column = (int(c) for c in centre)
    views = VIDEO_VIEWS if video else ("axial", "coronal", "sagittal")
    return {view: (_take(volume, view, index), index) for view, index in zip(views, (depth, row, column))}


def loss_curve_svg(history: list[list[float]], width: int = 640, height: int = 240) -> str:
    """The training loss (`[[step, loss], ...]`) as an inline SVG line chart with labelled axes."""
    if not history:
        return "<p>No loss was logged.</p>"
    steps = np.array([h[0] for h in history], np.float64)
    losses = np.array([h[1] for h in history], np.float64)
    left, right, top, bottom = 60, 20, 15, 40
    x_span = max(steps.max() - steps.min(), 1.0)
    y_low, y_high = float(losses.min()), float(losses.max())
    y_span = max(y_high - y_low, 1e-9)
    xs = left + (steps - steps.min()) / x_span * (width - left - right)
    ys = top + (y_high - losses) / y_span * (height - top - bottom)
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    ticks = []
    for fraction in (0.0, 0.5, 1.0):
        value = y_low + fraction * y_span
        y = top + (1 - fraction) * (height - top - bottom)
        ticks.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{value:.3g}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="training loss by step">'
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>'
        f'<polyline points="{points}" fill="none" stroke="#2a6fdb" stroke-width="2"/>'
        + "".join(ticks)
        + f'<text x="{left}" y="{height - 22}" font-size="11">{int(steps.min())}</text>'
        f'<text x="{width - right}" y="{height - 22}" font-size="11" text-anchor="end">{int(steps.max())}</text>'
        f'<text x="{(left + width - right) / 2}" y="{height - 6}" font-size="11" text-anchor="middle">step</text>'
        f'<text x="12" y="{(top + height - bottom) / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {(top + height - bottom) / 2})">loss</text>'
        "</svg>"
    )


def _page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _notes(scores: dict) -> list[str]:
    """What a reader must know before the numbers, shown under the title: held-out data scored although they were
    preprocessed otherwise than the training data (`--eval-across-preprocessings`, `run_data.check_eval`)."""
    note = scores.get("across_preprocessings")
    if not note:
        return []
    return [f'<p class="note" id="across-preprocessings" role="note"><strong>Warning:</strong> {html.escape(note)}; '
            "these are not the model's scores on data prepared as its training data were "
            "(--eval-across-preprocessings).</p>"]


def _score(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def segmentation_report(scores: dict, samples: list[dict], loss_history: list, class_names: list[str],
                        title: str = "fullres segmentation report") -> str:
    """The HTML report of a segmentation evaluation (see the module docstring)."""
    rows = []
    for class_id, (name, dice) in enumerate(zip(class_names, scores["dice_per_class"])):
        swatch = "" if class_id == 0 else f'<span class="swatch" style="background:rgb{PALETTE[class_id % len(PALETTE)]}"></span>'
        rows.append(f"<tr><td>{swatch}{html.escape(name)}</td><td class=\"number\">{_score(dice)}</td></tr>")
    body = [
        f"<h1>{html.escape(title)}</h1>",
        *_notes(scores),
        f"<p>{scores.get('cases', len(samples))} held-out cases; mean foreground Dice "
        f"<strong>{_score(scores.get('dice_mean'))}</strong>.</p>",
        "<h2>Dice per class</h2>",
        "<table><thead><tr><th>class</th><th>Dice</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>",
        "<h2>Training loss</h2>", loss_curve_svg(loss_history),
        "<h2>Held-out cases</h2>",
        "<p>Each view shows the true mask (left) and the prediction (right), coloured by class.</p>",
    ]
    for sample in samples:
        image = sample["image"]  # (D, H, W, C)
        video = bool(sample.get("video"))
        # A clip's RGB frames in colour; any other volume by its first channel, in grey (three channels of a CT or an
        # MR are three modalities or windows, not red, green and blue).
        volume = image if video and image.shape[-1] == 3 else image[..., 0]
        label, prediction = sample["label"], sample["prediction"]
        figures = []
        for view, (image_slice, index) in orthogonal_slices(volume, label, video).items():
            label_slice = _take(label, view, index)
            prediction_slice = _take(prediction, view, index)
            for kind, mask in (("true", label_slice), ("predicted", prediction_slice)):
                picture = _upscale(overlay(image_slice, mask))
                place = VIDEO_VIEWS.get(view, "{view} {index}").format(view=view, index=index)
                figures.append(
                    f'<figure><img src="{png_data_uri(picture)}" alt="{place}, {kind} mask" '
                    f'width="{picture.shape[1]}" height="{picture.shape[0]}">'
                    f"<figcaption>{place}: {kind}</figcaption></figure>")
        body.append(f"<h3>{html.escape(sample['case_id'])}</h3><div class=\"cases\">{''.join(figures)}</div>")
    if any(sample.get("video") for sample in samples):
        body.append("<p>Clips: a frame, then one row and one column of every frame stacked in time order (time runs "
                    "down), so that motion shows as a slant.</p>")
    return _page(title, body)



def _take(volume: np.ndarray, view: str, index: int) -> np.ndarray:
    """One slice of a (D, H, W[, C]) LPS volume; coronal and sagittal slices upside down, so superior is up.

    A clip's views (`VIDEO_VIEWS`) keep time running down: frame t, row y of every frame, column x of every frame.
    """
    return {"axial": lambda: volume[index], "coronal": lambda: volume[::-1, index, :],
            "sagittal": lambda: volume[::-1, :, index], "frame": lambda: volume[index],
            "row": lambda: volume[:, index, :], "column": lambda: volume[:, :, index]}[view]()


def draw_boxes(image: np.ndarray, truth: dict, detections: dict, class_names: list[str],
               min_score: float = 0.3) -> np.ndarray:
    """An (H, W, 3) float image in [0, 1] with true boxes (green, dashed look) and detections (class colour + score)."""
    picture = Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8))
    draw = ImageDraw.Draw(picture)
    for y0, x0, y1, x1 in truth["boxes"]:
        draw.rectangle([x0, y0, x1, y1], outline=TRUTH_COLOUR, width=3)
    for (y0, x0, y1, x1), score, label in zip(detections["boxes"], detections["scores"], detections["classes"]):
        if score < min_score:
            continue
        colour = PALETTE[(int(label) + 1) % len(PALETTE)]
        draw.rectangle([x0, y0, x1, y1], outline=colour, width=2)
        name = class_names[int(label)] if int(label) < len(class_names) else str(int(label))
        draw.text((x0 + 2, max(y0 - 11, 0)), f"{name} {score:.2f}", fill=colour)
    return np.asarray(picture)


def detection_report(scores: dict, samples: list[dict], loss_history: list, class_names: list[str],
                     title: str = "fullres detection report") -> str:
    """The HTML report of a detection evaluation (see the module docstring)."""
    rows = [f"<tr><td><span class=\"swatch\" style=\"background:rgb{PALETTE[(i + 1) % len(PALETTE)]}\"></span>"
            f"{html.escape(name)}</td><td class=\"number\">{_score(scores['per_class_AP'].get(name))}</td></tr>"
            for i, name in enumerate(class_names)]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        *_notes(scores),
        f"<p>{scores.get('images', len(samples))} held-out images; COCO mAP <strong>{_score(scores['mAP'])}</strong>, "
        f"mAP@0.5 <strong>{_score(scores['mAP@0.5'])}</strong>.</p>",
        "<h2>AP per class (IoU 0.50:0.95)</h2>",
        "<table><thead><tr><th>class</th><th>AP</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>",
        "<h2>Training loss</h2>", loss_curve_svg(loss_history),
        "<h2>Held-out images</h2>",
        "<p>True boxes in green; detections with score ≥ 0.3 in their class colour.</p><div class=\"cases\">",
    ]
    for sample in samples:
        picture = draw_boxes(sample["image"], sample["truth"], sample["detections"], class_names)
        body.append(f'<figure><img src="{png_data_uri(picture)}" alt="{html.escape(sample["source_id"])} with boxes" '
                    f'width="{picture.shape[1]}" height="{picture.shape[0]}">'
                    f"<figcaption>{html.escape(sample['source_id'])}</figcaption></figure>")
    body.append("</div>")
    return _page(title, body)
