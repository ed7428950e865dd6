"""Images with boxes (COCO, VOC) to TF Object Detection API records; bad input set aside."""

import glob
import json
import os

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from preprocessing import annotations, conversion, demo_images, images_pipeline, tfrecord_schema

IN_PROCESS = [f"--runner={conversion.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
QUIET = dict(pipeline_args=IN_PROCESS, log=lambda line: None)


def _records(output):
    files = sorted(glob.glob(os.path.join(output, "data-*.tfrecord")))
    parsed = [tfrecord_schema.parse_detection_example(raw) for raw in tf.data.TFRecordDataset(files)]
    return {p["source_id"].numpy().decode(): p for p in parsed}


def test_coco_round_trip_keeps_every_box(tmp_path):
    written = demo_images.write_demo_coco(str(tmp_path / "demo"), num_images=5, size=(96, 128), seed=2)
    summary = images_pipeline.run(written["annotations"], written["images"], str(tmp_path / "out"), **QUIET)
    assert summary == {**summary, "ok": 5, "failed": 0}
    coco = json.loads(open(written["annotations"]).read())
    records = _records(str(tmp_path / "out"))
    assert sorted(records) == [str(i) for i in range(1, 6)]
    for image in coco["images"]:
        record = records[str(image["id"])]
        boxes = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
        expected = np.array([[y / 96, x / 128, (y + h) / 96, (x + w) / 128] for x, y, w, h in (a["bbox"] for a in boxes)])
        np.testing.assert_allclose(record["boxes"].numpy(), expected, rtol=1e-6)
        assert list(record["labels"].numpy()) == [a["category_id"] for a in boxes]
        names = {c["id"]: c["name"] for c in coco["categories"]}
        assert [t.decode() for t in record["texts"].numpy()] == [names[a["category_id"]] for a in boxes]
        original = np.asarray(Image.open(os.path.join(written["images"], image["file_name"])).convert("RGB"))
        np.testing.assert_array_equal(record["image"].numpy(), original)  # PNG stored as is, lossless
    assert json.loads((tmp_path / "out" / "label_map.json").read_text()) == {"circle": 1, "square": 2, "triangle": 3}


@pytest.fixture
def bad_coco(tmp_path):
    """Two good images and one of every bad kind, in one COCO file."""
    image_dir = tmp_path / "images"
    image_dir.mkdir()
    for name in ("good1.png", "good2.jpg", "boxes.png", "wrong_size.png"):
        Image.fromarray(np.full((40, 60, 3), 128, np.uint8)).save(image_dir / name)
    (image_dir / "corrupt.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "secret.png").write_bytes(b"outside the image directory")
    entries = [("good1.png", 40, 60), ("good2.jpg", 40, 60), ("boxes.png", 40, 60), ("wrong_size.png", 50, 60),
               ("corrupt.png", 40, 60), ("missing.png", 40, 60), ("../secret.png", 40, 60), ("/etc/passwd", 40, 60)]
    coco = {
        "images": [{"id": i + 1, "file_name": f, "height": h, "width": w} for i, (f, h, w) in enumerate(entries)],
        "categories": [{"id": 1, "name": "thing"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 10, 10]},
            {"id": 2, "image_id": 3, "category_id": 1, "bbox": [50, 30, 20, 20]},  # crosses the border: clipped
            {"id": 3, "image_id": 3, "category_id": 1, "bbox": [70, 5, 10, 10]},  # outside
            {"id": 4, "image_id": 3, "category_id": 1, "bbox": [5, 5, 0, 10]},  # zero width
            {"id": 5, "image_id": 3, "category_id": 1, "bbox": [5, 5, 10, -3]},  # negative height
            {"id": 6, "image_id": 3, "category_id": 7, "bbox": [5, 5, 10, 10]},  # unknown category
            {"id": 7, "image_id": 99, "category_id": 1, "bbox": [5, 5, 10, 10]},  # unknown image
        ],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    return tmp_path


EXPECTED = {
    "annotation3": "box_outside_image",
    "annotation4": "box_non_positive_size",
    "annotation5": "box_non_positive_size",
    "annotation6": "unknown_category",
    "annotation7": "unknown_image",
    "image7": "unsafe_path",
    "image8": "unsafe_path",
    "wrong_size.png": "size_mismatch",
    "corrupt.png": "unreadable",
    "missing.png": "missing_image",
}


def test_bad_inputs_are_dead_letters_and_good_images_survive(bad_coco):
    output = bad_coco / "out"
    with pytest.raises(conversion.PreprocessingFailed, match=r"10 of 13 inputs failed"):
        images_pipeline.run(str(bad_coco / "coco.json"), str(bad_coco / "images"), str(output), **QUIET)
    letters = [json.loads(line) for line in (output / "dead_letter.jsonl").read_text().splitlines()]
    found = {letter["source"].rsplit("#", 1)[-1] if "#" in letter["source"] else os.path.basename(letter["source"]):
             letter["reason"] for letter in letters}
    assert found == EXPECTED
    records = _records(str(output))
    assert sorted(records) == ["1", "2", "3"]  # image 3 kept with its one good (clipped) box
    np.testing.assert_allclose(records["3"]["boxes"].numpy(), [[30 / 40, 50 / 60, 1.0, 1.0]], rtol=1e-6)
    assert records["2"]["image"].shape == (40, 60, 3)  # JPEG kept as JPEG and readable


def test_voc_directory(tmp_path):
    image_dir, xml_dir = tmp_path / "JPEGImages", tmp_path / "Annotations"
    image_dir.mkdir(), xml_dir.mkdir()
    Image.fromarray(np.zeros((50, 80, 3), np.uint8)).save(image_dir / "a.jpg")
    (xml_dir / "a.xml").write_text(
        "<annotation><filename>a.jpg</filename><size><width>80</width><height>50</height></size>"
        "<object><name>dog</name><bndbox><xmin>8</xmin><ymin>5</ymin><xmax>40</xmax><ymax>25</ymax></bndbox></object>"
        "<object><name>cat</name><bndbox><xmin>0</xmin><ymin>0</ymin><xmax>80</xmax><ymax>50</ymax></bndbox></object>"
        "</annotation>")
    (xml_dir / "broken.xml").write_text("<annotation><filename>")
    with pytest.raises(conversion.PreprocessingFailed, match=r"1 of 2 inputs failed"):
        images_pipeline.run(str(xml_dir), str(image_dir), str(tmp_path / "out"), **QUIET)
    record = _records(str(tmp_path / "out"))["a"]
    np.testing.assert_allclose(record["boxes"].numpy(), [[0.1, 0.1, 0.5, 0.5], [0, 0, 1, 1]], rtol=1e-6)
    assert list(record["labels"].numpy()) == [2, 1]  # ids in sorted name order: cat 1, dog 2
    letters = (tmp_path / "out" / "dead_letter.jsonl").read_text()
    assert "broken.xml" in letters and "unreadable_annotation" in letters


def test_not_coco_names_the_missing_field(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match=r"a.json has no 'annotations' list; a COCO detection file needs"):
        annotations.read_coco(str(tmp_path / "a.json"), str(tmp_path))


def test_convert_fn_in_test_pipeline(bad_coco):
    items, _, _ = annotations.read_coco(str(bad_coco / "coco.json"), str(bad_coco / "images"))
    chosen = [item for item in items if item.source_id in ("1", "5")]  # good1.png, corrupt.png
    with TestPipeline(argv=IN_PROCESS) as pipeline:
        outputs = (pipeline | beam.Create(chosen)
                   | beam.ParDo(images_pipeline.ConvertImageFn()).with_outputs(conversion.DEAD_LETTER, main="records"))
        ids = outputs.records | beam.Map(lambda raw: tfrecord_schema.parse_detection_example(raw)["source_id"].numpy())
        assert_that(ids, equal_to([b"1"]), label="records")
        assert_that(outputs[conversion.DEAD_LETTER] | beam.Map(lambda d: d["reason"]), equal_to(["unreadable"]),
                    label="dead_letters")


@pytest.mark.parametrize("name, safe", [("a.png", True), ("sub/a.png", True), ("../a.png", False),
                                        ("sub/../../a.png", False), ("/abs/a.png", False)])
def test_safe_image_path(tmp_path, name, safe):
    assert (annotations.safe_image_path(str(tmp_path), name) is not None) == safe


def test_valid_boxes_as_a_plain_function():
    image = annotations.ImageAnnotations("1", "a.png", 100, 50, (
        annotations.Box(10, 5, 30, 25, 1, "a", "s#1"),  # kept
        annotations.Box(-10, 40, 20, 60, 2, "b", "s#2"),  # crosses two borders: clipped
        annotations.Box(100, 0, 120, 10, 1, "a", "s#3"),  # touches the right border from outside
        annotations.Box(5, 5, 5, 9, 1, "a", "s#4"),  # zero width
    ))
    boxes, labels, texts, dead = images_pipeline.valid_boxes(image, width=100, height=50)
    np.testing.assert_allclose(boxes, [[0.1, 0.1, 0.5, 0.3], [0.8, 0.0, 1.0, 0.2]], rtol=1e-6)
    assert labels == (1, 2) and texts == ("a", "b")
    assert [(d["source"], d["reason"]) for d in dead] == [("s#3", "box_outside_image"), ("s#4", "box_non_positive_size")]
