"""Synthetic detection images: coloured shapes on textured backgrounds, with COCO boxes.

Three classes — circle, square, triangle — of random size, colour and position
on a smooth random texture. Written as PNG files with a COCO JSON file, so the
same converter that reads users' data reads the demo. Nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from PIL import Image
from scipy import ndimage

from preprocessing.records import dataset_files, detection_schema

CATEGORIES = ({"id": 1, "name": "circle"}, {"id": 2, "name": "square"}, {"id": 3, "name": "triangle"})


def _shape_mask(kind: int, height: int, width: int, center, radius: float, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cy, cx = center
    if kind == 1:
        return (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
    if kind == 2:
        half_h, half_w = radius * rng.uniform(0.7, 1.0), radius * rng.uniform(0.7, 1.0)
        return (np.abs(y - cy) <= half_h) & (np.abs(x - cx) <= half_w)
    angles = rng.uniform(0, 2 * np.pi) + np.array([0, 2 * np.pi / 3, 4 * np.pi / 3])
    corners = np.stack([cy + radius * np.sin(angles), cx + radius * np.cos(angles)], axis=1)  # (3, [y, x])
    inside = np.ones((height, width), bool)
    for i in range(3):
        (y0, x0), (y1, x1), (y2, x2) = corners[i], corners[(i + 1) % 3], corners[(i + 2) % 3]
        edge = (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0)
        reference = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0)
        inside &= edge * np.sign(reference) >= 0
    return inside


def synthetic_image(rng: np.random.Generator, size: tuple[int, int] = (256, 256), max_objects: int = 4,
                    min_radius: float = 10.0, max_radius: float = 28.0, objects=None):
    """One image with 1..`max_objects` shapes at random places, or with the given `objects`.

    Args:
        objects: optional `[(category id, (center y, center x), radius), ...]` to
            place shapes exactly (e.g. across partition borders).

    Returns:
        (image, boxes, category_ids): (H, W, 3) uint8, a list of COCO boxes
        [x, y, width, height] in pixels, and the category id of each box.
    """
    height, width = size
    # Mostly a luminance texture, with a faint colour one: textured, but without shape-like colour blobs.
    luminance = ndimage.gaussian_filter(rng.normal(0, 1, (height, width)), sigma=5)[..., None]  # (H, W, 1)
    colour_texture = ndimage.gaussian_filter(rng.normal(0, 1, (height, width, 3)), sigma=(12, 12, 0))  # (H, W, 3)
    base = rng.uniform(60, 160, 3)
    image = base + 22 * luminance / (luminance.std() + 1e-6) + 6 * colour_texture / (colour_texture.std() + 1e-6)
    image = np.clip(image, 0, 255)
    if objects is None:
        objects = []
        for _ in range(rng.integers(1, max_objects + 1)):
            radius = rng.uniform(min_radius, max_radius)
            objects.append((int(rng.integers(1, 4)), (rng.uniform(radius, height - radius),
                                                      rng.uniform(radius, width - radius)), radius))
    boxes, categories = [], []
    for kind, center, radius in objects:
        mask = _shape_mask(kind, height, width, center, radius, rng)
        if not mask.any():
            continue
        colour = rng.uniform(0, 255, 3)
        while np.abs(colour - base).sum() < 120:  # keep shapes visible against the background
            colour = rng.uniform(0, 255, 3)
        image[mask] = colour
        rows, columns = np.nonzero(mask)
        boxes.append([float(columns.min()), float(rows.min()),
                      float(columns.max() - columns.min() + 1), float(rows.max() - rows.min() + 1)])
        categories.append(kind)
    image = np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)
    return image, boxes, categories


def demo_coco_files(num_images: int) -> list[str]:
    """The files `write_demo_coco` writes, relative to its `output_dir` (what `fullres demo-data images` claims)."""
    return sorted([*(f"images/shapes_{index:05d}.png" for index in range(num_images)), "annotations.json"])


def write_demo_coco(output_dir: str, num_images: int = 64, size: tuple[int, int] = (256, 256), seed: int = 0) -> dict:
    """Writes `output_dir/images/*.png` and `output_dir/annotations.json` (COCO).

    Returns:
        `{"images": directory, "annotations": json path}`.
    """
    image_dir = os.path.join(output_dir, "images")
    os.makedirs(image_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {"images": [], "annotations": [], "categories": [dict(c) for c in CATEGORIES]}
    for index in range(num_images):
        image, boxes, categories = synthetic_image(rng, size)
        file_name = f"shapes_{index:05d}.png"
        Image.fromarray(image).save(os.path.join(image_dir, file_name))
        coco["images"].append({"id": index + 1, "file_name": file_name, "height": size[0], "width": size[1]})
        for box, category in zip(boxes, categories):
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1, "image_id": index + 1, "category_id": category,
                "bbox": box, "area": box[2] * box[3], "iscrowd": 0,
            })
    path = os.path.join(output_dir, "annotations.json")
    with open(path, "w") as file:
        json.dump(coco, file)
    return {"images": image_dir, "annotations": path}


def detection_record(image: np.ndarray, boxes, categories, source_id: str) -> bytes:
    """One synthetic image with COCO boxes [x, y, w, h] as a serialized TF OD API record (PNG inside)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    height, width = image.shape[:2]
    corners = [[y / height, x / width, (y + h) / height, (x + w) / width] for x, y, w, h in boxes]
    names = {c["id"]: c["name"] for c in CATEGORIES}
    return detection_schema.encode_detection_example(detection_schema.DetectionRecord(
        source_id=source_id, filename=f"{source_id}.png", encoded=buffer.getvalue(), image_format="png",
        height=height, width=width, boxes=np.asarray(corners, np.float32).reshape(-1, 4), labels=tuple(categories),
        texts=tuple(names[c] for c in categories),
    ))


def write_demo_tfrecords(output_dir: str, num_train: int = 256, num_eval: int = 64, size: tuple[int, int] = (256, 256),
                         seed: int = 0) -> dict:
    """Writes synthetic images straight into detection TFRecords, `train/` and `eval/`, each with `label_map.json`
    and the `summary.json` a conversion writes (its shards).

    The same records `fullres preprocess images` makes of `write_demo_coco`'s
    output, without a Beam run (for tests and quick experiments).

    Returns:
        `{"train": pattern, "eval": pattern, "class_names": [...]}`.
    """
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    patterns = {}
    for split, count in (("train", num_train), ("eval", num_eval)):
        directory = os.path.join(output_dir, split)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "data-00000-of-00001.tfrecord")
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for index in range(count):
                image, boxes, categories = synthetic_image(rng, size)
                writer.write(detection_record(image, boxes, categories, f"shapes-{split}-{index:05d}"))
        os.replace(path + ".tmp", path)
        dataset_files.write_label_map(directory, {c["name"]: c["id"] for c in CATEGORIES})
        dataset_files.write_summary(directory, {"ok": count, "failed": 0, "reasons": {},
                                                "shards": [os.path.basename(path)]})
        patterns[split] = os.path.join(directory, "data-*.tfrecord")
    return {**patterns, "class_names": [c["name"] for c in CATEGORIES]}
