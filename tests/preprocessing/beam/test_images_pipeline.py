"""Images with boxes (COCO, VOC) to TF Object Detection API records; bad input set aside."""

import glob
import json
import os
import struct
import subprocess
import sys
import warnings
import zlib

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from preprocessing.beam import conversion, counting, images_pipeline, local_workers
from preprocessing.images import annotations, demo_images
from preprocessing.records import detection_schema

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
QUIET = dict(pipeline_args=IN_PROCESS, log=lambda line: None)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _records(output):
    files = sorted(glob.glob(os.path.join(output, "data-*.tfrecord")))
    parsed = [detection_schema.parse_detection_example(raw) for raw in tf.data.TFRecordDataset(files)]
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
                   | beam.ParDo(images_pipeline.ConvertImageFn()).with_outputs(counting.DEAD_LETTER, main="records"))
        ids = outputs.records | beam.Map(lambda raw: detection_schema.parse_detection_example(raw)["source_id"].numpy())
        assert_that(ids, equal_to([b"1"]), label="records")
        assert_that(outputs[counting.DEAD_LETTER] | beam.Map(lambda d: d["reason"]), equal_to(["unreadable"]),
                    label="dead_letters")


@pytest.mark.parametrize("name, safe", [("a.png", True), ("sub/a.png", True), ("../a.png", False),
                                        ("sub/../../a.png", False), ("/abs/a.png", False), ("a\0.png", False)])
def test_safe_image_path(tmp_path, name, safe):
    assert (annotations.safe_image_path(str(tmp_path), name) is not None) == safe


def test_valid_boxes_as_a_plain_function():
    image = annotations.ImageAnnotations("1", "a.png", 100, 50, (
        annotations.Box(10, 5, 30, 25, 1, "a", "s#1"),  # kept
        annotations.Box(-10, 40, 20, 60, 2, "b", "s#2"),  # crosses two borders: clipped
        annotations.Box(100, 0, 120, 10, 1, "a", "s#3"),  # touches the right border from outside
        annotations.Box(5, 5, 5, 9, 1, "a", "s#4"),  # zero width
    ))
    boxes, labels, texts, dead, _ = images_pipeline.valid_boxes(image, width=100, height=50)
    np.testing.assert_allclose(boxes, [[0.1, 0.1, 0.5, 0.3], [0.8, 0.0, 1.0, 0.2]], rtol=1e-6)
    assert labels == (1, 2) and texts == ("a", "b")
    assert [(d["source"], d["reason"]) for d in dead] == [("s#3", "box_outside_image"), ("s#4", "box_non_positive_size")]


def _bomb_png(path, width, height):
    """A few hundred bytes of valid PNG whose header claims `width`×`height` (its pixel data stops after 8 rows)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = zlib.compress(b"\x00" * (8 * (1 + 3 * width)), 9)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def _convert(item, **options):
    """`ConvertImageFn` as a plain function: (records, dead letters)."""
    convert = images_pipeline.ConvertImageFn(**options)
    convert.setup()
    outputs = list(convert.process(item))
    return ([o for o in outputs if isinstance(o, bytes)],
            [o.value for o in outputs if isinstance(o, beam.pvalue.TaggedOutput)])


@pytest.mark.parametrize("side, detail", [
    # PIL itself refuses this one (over twice its own limit) before the header's size can be read: caught.
    (20000, "the image claims 400,000,000 pixels, over the --max-pixels budget of 100,000,000"),
    # PIL only warns about this one: our budget refuses it, from the header, before decoding.
    (12000, "the image is 12000×12000 = 144,000,000 pixels, over the --max-pixels budget of 100,000,000"),
])
def test_a_decompression_bomb_is_a_dead_letter(tmp_path, side, detail):
    _bomb_png(tmp_path / "bomb.png", side, side)
    assert (tmp_path / "bomb.png").stat().st_size < 2000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor does PIL's DecompressionBombWarning escape
        records, dead = _convert(annotations.ImageAnnotations("1", str(tmp_path / "bomb.png"), None, None))
    assert records == []
    assert dead == [{"source": str(tmp_path / "bomb.png"), "stage": "read", "reason": "image_too_large",
                     "detail": f"{detail} (a decompression bomb, or a genuinely huge image: raise --max-pixels to "
                               "convert it)"}]


def test_the_pixel_budget_is_the_users(tmp_path, monkeypatch):
    Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(tmp_path / "small.png")
    item = annotations.ImageAnnotations("1", str(tmp_path / "small.png"), 60, 40)
    assert [d["reason"] for d in _convert(item, max_pixels=2399)[1]] == ["image_too_large"]
    assert len(_convert(item, max_pixels=2400)[0]) == 1
    # A budget above PIL's own ceiling (twice its limit, lowered here to keep the test small) is honoured.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # restored after the test
    assert [d["reason"] for d in _convert(item, max_pixels=2000)[1]] == ["image_too_large"]
    assert len(_convert(item, max_pixels=2400)[0]) == 1


def _rgb16_png(path, width, height):
    """A 16-bit RGB PNG (PIL reads it as 8-bit RGB, TensorFlow as uint16): every sample 3000."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = zlib.compress((b"\x00" + struct.pack(">H", 3000) * 3 * width) * height)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
                     + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def test_an_image_deeper_than_8_bits_is_a_dead_letter_not_a_blank_record(tmp_path):
    """A 16-bit X-ray TIFF became all white and a float TIFF all black (clipped by the conversion to RGB); a 16-bit
    PNG reached the model at 1/257 of its values. Each is refused, saying what it holds; 8-bit grey still converts."""
    grey = np.full((24, 32), 300, np.uint16)
    grey[5:15, 10:25] = 2000
    Image.fromarray(grey).save(tmp_path / "xray.tif")
    Image.fromarray(grey.astype(np.float32) / 4000).save(tmp_path / "float.tif")
    Image.fromarray(grey).save(tmp_path / "xray.png")
    _rgb16_png(tmp_path / "rgb16.png", 8, 6)
    Image.fromarray((grey // 8).astype(np.uint8)).save(tmp_path / "eight.tif")
    said = {}
    for name in ("xray.tif", "float.tif", "xray.png", "rgb16.png"):
        records, dead = _convert(annotations.ImageAnnotations("1", str(tmp_path / name), None, None))
        assert records == [] and [d["reason"] for d in dead] == ["not_8_bit"]
        said[name] = dead[0]["detail"].split("; fullres")[0]
    assert said == {"xray.tif": "the image holds 16-bit samples (TIFF mode I;16, values 300 to 2000)",
                    "float.tif": "the image holds floating-point samples (TIFF mode F, values 0.075 to 0.5)",
                    "xray.png": "the image holds 16-bit samples (PNG mode I;16, values 300 to 2000)",
                    "rgb16.png": "the image holds 16-bit samples (PNG mode RGB)"}
    assert "convert it to 8 bits with the window you read it at" in dead[0]["detail"]
    assert len(_convert(annotations.ImageAnnotations("1", str(tmp_path / "eight.tif"), None, None))[0]) == 1


def test_an_empty_image_file_is_named_as_such(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")  # it was "cannot identify image file <_io.BytesIO object at 0x...>"
    records, dead = _convert(annotations.ImageAnnotations("1", str(tmp_path / "empty.png"), None, None))
    assert records == [] and dead == [{
        "source": str(tmp_path / "empty.png"), "stage": "read", "reason": "empty_file",
        "detail": "the image file is empty (0 bytes): a copy or download that never wrote it; copy it again"}]


def test_a_file_name_that_is_a_folder_is_a_dead_letter(tmp_path):
    (tmp_path / "folder.png").mkdir()
    records, dead = _convert(annotations.ImageAnnotations("1", str(tmp_path / "folder.png"), None, None))
    assert records == [] and dead == [{
        "source": str(tmp_path / "folder.png"), "stage": "read", "reason": "not_a_file",
        "detail": "the file name points to a folder, not an image file; point it at the image"}]


def test_a_size_the_annotations_leave_out_is_taken_from_the_file(tmp_path):
    Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(tmp_path / "a.png")
    assert len(_convert(annotations.ImageAnnotations("1", str(tmp_path / "a.png"), None, 40))[0]) == 1
    _, dead = _convert(annotations.ImageAnnotations("1", str(tmp_path / "a.png"), None, 50))
    assert [d["detail"] for d in dead] == ["annotations say ?×50, the file is 60×40"]


@pytest.fixture
def every_bad_kind(tmp_path):
    """Good images beside one of every kind of bad input, in one COCO file."""
    image_dir = tmp_path / "images"
    image_dir.mkdir()
    for name in ("good.png", "strings.png", "no_size.png", "zero.png"):
        Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(image_dir / name)
    _bomb_png(image_dir / "bomb.png", 20000, 20000)
    (image_dir / "folder.png").mkdir()
    images = [
        {"id": 1, "file_name": "good.png", "width": 60, "height": 40},
        {"id": 2, "file_name": "strings.png", "width": "60", "height": "40"},  # numbers as strings: accepted
        {"id": 3, "file_name": "no_size.png"},  # no width/height: the file's size is used
        {"id": 4, "file_name": "zero.png", "width": 60, "height": 40},  # holds a category-0 object
        {"id": 5, "file_name": "bomb.png", "width": 20000, "height": 20000},
        {"id": 6, "file_name": "folder.png", "width": 60, "height": 40},
        {"id": 7, "width": 60, "height": 40},  # no file_name
        {"id": 8, "file_name": "good.png", "width": "sixty", "height": 40},
    ]
    coco = {
        "images": images,
        "categories": [{"id": 0, "name": "zero"}, {"id": 1, "name": "one"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 10, 10]},
            {"id": 2, "image_id": 2, "category_id": "1", "bbox": ["10", "20", "30", "15"]},
            {"id": 3, "image_id": 3, "category_id": 1, "bbox": [1, 1, 8, 8]},
            {"id": 4, "image_id": 4, "category_id": 0, "bbox": [2, 3, 20, 10]},
            {"id": 5, "image_id": 1, "category_id": 1},  # no bbox
            {"id": 6, "image_id": 1, "category_id": 1, "bbox": ["a", "b", "c", "d"]},
        ],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    return tmp_path


@pytest.mark.slow
def test_every_bad_kind_is_a_dead_letter_in_one_cli_run(every_bad_kind):
    root, output = every_bad_kind, every_bad_kind / "out"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "preprocess", "images", "--annotations", str(root / "coco.json"),
         "--images", str(root / "images"), "--output", str(output), "--max-failed-fraction", "1",
         "--workers", "1", "--direct_running_mode=in_memory"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=300,
    )
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert "wrote 4 records in" in result.stdout and "6 dead letters" in result.stdout
    letters = {os.path.basename(d["source"]): (d["reason"], d["detail"])
               for d in map(json.loads, (output / "dead_letter.jsonl").read_text().splitlines())}
    assert letters == {
        "bomb.png": ("image_too_large", "the image claims 400,000,000 pixels, over the --max-pixels budget of "
                                        "100,000,000 (a decompression bomb, or a genuinely huge image: raise "
                                        "--max-pixels to convert it)"),
        "folder.png": ("not_a_file", "the file name points to a folder, not an image file; point it at the image"),
        "coco.json#image7": ("missing_file_name", f"the image has no 'file_name' (found None); give it the image's "
                                                  f"path relative to {root / 'images'}"),
        "coco.json#image8": ("bad_size", "'width' is 'sixty', not a positive whole number; correct it or remove it "
                                         "(the image file's own size is used then)"),
        "coco.json#annotation5": ("missing_bbox", "the annotation has no 'bbox'; give it [x, y, width, height] in "
                                                  "pixels or remove it"),
        "coco.json#annotation6": ("bad_bbox", "'bbox' is ['a', 'b', 'c', 'd'], not four numbers [x, y, width, height] "
                                              "in pixels; correct it"),
    }
    records = _records(str(output))
    assert sorted(records) == ["1", "2", "3", "4"]
    np.testing.assert_allclose(records["2"]["boxes"].numpy(), [[20 / 40, 10 / 60, 35 / 40, 40 / 60]], rtol=1e-6)
    assert list(records["4"]["labels"].numpy()) == [1]  # category 0 is stored as 1, not dropped
    assert json.loads((output / "label_map.json").read_text()) == {"zero": 1, "one": 2}


@pytest.mark.slow
@pytest.mark.parametrize("extra, message", [
    (["--extend-label-map"], "--extend-label-map extends the map given with --label-map; pass --label-map too, or "
                             "drop the flag."),
    (["--label-map", "{root}/nope.json"], "--label-map '{root}/nope.json' does not exist."),
    (["--label-map", "{root}/label_map.json"], "class 'thing' in {root}/coco.json is not in the label map "
                                               "{root}/label_map.json; add it there, or pass --extend-label-map to "
                                               "give it the next free id."),
])
def test_label_map_refusals_on_the_command_line(bad_coco, extra, message):
    (bad_coco / "label_map.json").write_text(json.dumps({"other": 1}))
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "preprocess", "images", "--annotations", str(bad_coco / "coco.json"),
         "--images", str(bad_coco / "images"), "--output", str(bad_coco / "out"),
         *[part.format(root=bad_coco) for part in extra]],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=300,
    )
    assert result.returncode == 2 and result.stderr.strip() == f"fullres: error: {message.format(root=bad_coco)}"
    assert not (bad_coco / "out").exists()
