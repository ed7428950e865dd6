"""Detection input: boxes stay on their objects through scaling, cropping, padding and flips."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from preprocessing import conversion, demo_images, images_pipeline
from trainer import detection_input

IN_PROCESS = [f"--runner={conversion.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


@pytest.fixture(scope="module")
def detection_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("detection")
    written = demo_images.write_demo_coco(str(root / "demo"), num_images=6, size=(96, 128), seed=4)
    images_pipeline.run(written["annotations"], written["images"], str(root / "records"), num_shards=1,
                        pipeline_args=IN_PROCESS, log=lambda line: None)
    coco = json.loads(open(written["annotations"]).read())
    originals = {str(image["id"]): np.asarray(Image.open(os.path.join(written["images"], image["file_name"])),
                                              np.float32) / 255 for image in coco["images"]}
    boxes = {str(image["id"]): [a["bbox"] for a in coco["annotations"] if a["image_id"] == image["id"]]
             for image in coco["images"]}
    return str(root / "records" / "data-*.tfrecord"), originals, boxes


def test_without_augmentation_boxes_scale_with_the_image(detection_records):
    pattern, originals, coco_boxes = detection_records
    batch = next(detection_input.detection_dataset(pattern, 6, (192, 192), max_boxes=8).as_numpy_iterator())
    assert batch["image"].shape == (6, 192, 192, 3) and batch["boxes"].shape == (6, 8, 4)
    scale = min(192 / 96, 192 / 128)  # 1.5: the width fills the canvas
    for i, source_id in enumerate(batch["source_id"]):
        expected = [[y * scale, x * scale, (y + h) * scale, (x + w) * scale] for x, y, w, h in coco_boxes[source_id.decode()]]
        count = len(expected)
        np.testing.assert_allclose(batch["boxes"][i, :count], expected, atol=1e-3)
        assert (batch["classes"][i, count:] == -1).all() and (batch["classes"][i, :count] >= 0).all()
        assert np.abs(batch["image"][i, 144:]).max() == 0  # padding below the 144-pixel-high image


def test_augmented_boxes_still_frame_their_objects(detection_records):
    pattern, originals, coco_boxes = detection_records
    checked = 0
    dataset = detection_input.detection_dataset(pattern, 1, (128, 128), max_boxes=8, augment=True, repeat=True, seed=3)
    for batch in dataset.take(24).as_numpy_iterator():
        original = originals[batch["source_id"][0].decode()]
        for box, label in zip(batch["boxes"][0], batch["classes"][0]):
            if label < 0:
                continue
            y0, x0, y1, x1 = box
            if min(y0, x0) <= 0.5 or y1 >= 127.5 or x1 >= 127.5 or (y1 - y0) < 6 or (x1 - x0) < 6:
                continue  # clipped by the canvas: its pixels are no longer all there
            inside = batch["image"][0, int(y0) + 2:int(y1) - 2, int(x0) + 2:int(x1) - 2].mean(axis=(0, 1))
            # The same object's colours in the original: its COCO box with the closest mean colour.
            means = [original[int(y) + 2:int(y + h) - 2, int(x) + 2:int(x + w) - 2].mean(axis=(0, 1))
                     for x, y, w, h in coco_boxes[batch["source_id"][0].decode()] if w > 6 and h > 6]
            assert min(np.abs(m - inside).max() for m in means) < 0.08
            checked += 1
    assert checked >= 20
