"""Detection input: boxes stay on their objects through scaling, cropping, padding and flips."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from preprocessing.beam import images_pipeline, local_workers
from preprocessing.images import demo_images
from trainer import presets
from preprocessing.records import dataset_files
from trainer.tasks import detection
from trainer.data import detection_input
from trainer.models import retinanet
from trainer.tasks import detection_eval

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


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


def test_boxes_beyond_max_boxes_are_counted(detection_records):
    pattern, _, coco_boxes = detection_records
    batch = next(detection_input.detection_dataset(pattern, 6, (192, 192), max_boxes=1).as_numpy_iterator())
    dropped = {source_id.decode(): int(count) for source_id, count in zip(batch["source_id"], batch["boxes_dropped"])}
    assert dropped == {source_id: len(boxes) - 1 for source_id, boxes in coco_boxes.items()}
    assert sum(dropped.values()) > 0 and (batch["classes"][:, 1:] == -1).all()


def _records_with_three_boxes(directory, count=4, size=128):
    """`count` images of `size`² with three well-separated boxes each, as detection TFRecords with a label map."""
    os.makedirs(directory)
    image = np.full((size, size, 3), 100, np.uint8)
    boxes = [[8, 8, 30, 30], [60, 10, 30, 30], [30, 70, 40, 40]]  # COCO [x, y, w, h]
    with tf.io.TFRecordWriter(os.path.join(directory, "data-00000-of-00001.tfrecord")) as writer:
        for index in range(count):
            writer.write(demo_images.detection_record(image, boxes, [1, 2, 3], str(index)))
    with open(os.path.join(directory, "label_map.json"), "w") as file:
        json.dump({"circle": 1, "square": 2, "triangle": 3}, file)
    return os.path.join(directory, "data-*.tfrecord")


@pytest.mark.slow
@pytest.mark.slow
def test_training_logs_and_counts_boxes_beyond_max_boxes(tmp_path):
    pattern = _records_with_three_boxes(str(tmp_path / "records"))
    config = presets.detection_demo(train_data=pattern, output_dir=str(tmp_path / "run"), image_size=(128, 128),
                                       batch_size=2, max_boxes=1, log_every=2, augment=False)
    task = detection.DetectionTask(config)
    lines = []
    batches = task.batches(0, log=lines.append)
    for _ in range(3):
        next(batches)
    assert lines == [  # the first step that drops boxes, then once per log_every steps
        "step 1: 4 boxes beyond max_boxes 1 left out of 2 training images (4 in this run so far); raise max_boxes "
        "to train on them",
        "step 2: 4 boxes beyond max_boxes 1 left out of 2 training images (8 in this run so far); raise max_boxes "
        "to train on them",
    ]
    assert task.input_counts() == {"boxes_dropped_max_boxes": 12}  # what metrics.json reports


@pytest.fixture
def category_zero_records(tmp_path):
    """A COCO file whose categories count from 0, converted by `preprocess images`."""
    (tmp_path / "images").mkdir()
    Image.fromarray(np.full((128, 128, 3), 70, np.uint8)).save(tmp_path / "images" / "a.png")
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 128, "height": 128}],
            "categories": [{"id": 0, "name": "zero"}, {"id": 1, "name": "one"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 0, "bbox": [10, 10, 40, 40]},
                            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [70, 70, 40, 40]}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    images_pipeline.run(str(tmp_path / "coco.json"), str(tmp_path / "images"), str(tmp_path / "records"),
                        num_shards=1, pipeline_args=IN_PROCESS, log=lambda line: None)
    return str(tmp_path / "records" / "data-*.tfrecord")


@pytest.mark.slow
@pytest.mark.slow
def test_category_zero_is_trained_and_evaluated_as_a_class(category_zero_records, tmp_path):
    label_map = dataset_files.read_label_map(category_zero_records)
    assert label_map == {"zero": 1, "one": 2}
    model = dataclasses.replace(presets.DETECTION_DEMO_MODEL, num_classes=max(label_map.values()))
    config = presets.detection_demo(train_data=category_zero_records, output_dir=str(tmp_path / "run"),
                                       image_size=(128, 128), model=model)
    assert detection.DetectionTask(config).class_names == ["zero", "one"]
    batch = next(detection_input.detection_dataset(category_zero_records, 1, (128, 128), max_boxes=4)
                 .as_numpy_iterator())
    assert list(batch["classes"][0]) == [0, 1, -1, -1]  # category 0 is class index 0, not padding
    # Training: anchors on the category-0 object are positives of class 0.
    targets = retinanet.encode_targets(batch["boxes"], batch["classes"], (128, 128), model)
    positives = np.concatenate([targets[f"classes/{level}"].ravel() for level in model.levels])
    assert (positives == 0).sum() > 0 and (positives == 1).sum() > 0
    # Evaluation: the category-0 object is scored under its own name.
    truth = {"boxes": batch["boxes"][0][:2], "classes": batch["classes"][0][:2]}
    found = {"boxes": truth["boxes"], "scores": np.ones(2), "classes": truth["classes"]}
    scores = detection_eval.coco_metrics([found], [truth], ["zero", "one"])
    assert scores["per_class_AP"] == pytest.approx({"zero": 1.0, "one": 1.0})


def _label_map_beside(directory, label_map):
    os.makedirs(directory)
    with open(os.path.join(directory, "label_map.json"), "w") as file:
        json.dump(label_map, file)
    return os.path.join(directory, "data-*.tfrecord")


def test_eval_data_with_other_class_ids_is_refused(tmp_path):
    train = _label_map_beside(str(tmp_path / "train"), {"car": 1, "dog": 2, "person": 3})
    held_out = _label_map_beside(str(tmp_path / "eval"), {"person": 1})  # converted alone: ids of its own
    config = presets.detection_demo(train_data=train, eval_data=held_out, output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError) as error:
        detection.DetectionTask(config)
    assert str(error.value) == (
        f"class 'person' has id 1 in {tmp_path / 'eval' / 'label_map.json'} but 3 in "
        f"{tmp_path / 'train' / 'label_map.json'}, so evaluation would score it as another class; convert the eval "
        f"data again with --label-map {tmp_path / 'train' / 'label_map.json'}.")
    agreeing = _label_map_beside(str(tmp_path / "eval2"), {"person": 3})
    detection.DetectionTask(dataclasses.replace(config, eval_data=agreeing))  # a subset with the same ids is fine


def test_a_label_map_with_id_zero_is_refused(tmp_path):
    pattern = _label_map_beside(str(tmp_path / "old"), {"zero": 0, "one": 1})  # written before category 0 was kept
    with pytest.raises(ValueError) as error:
        dataset_files.read_label_map(pattern)
    assert str(error.value) == (
        f"{tmp_path / 'old' / 'label_map.json'} maps 'zero' to 0, but class ids count from 1 (0 is the background in "
        "the TF Object Detection API); convert the data again with fullres preprocess images, which stores COCO "
        "category 0 as 1.")


@pytest.fixture
def crowd_and_difficult_records(tmp_path):
    """One image as COCO (a person, a crowd of people, a zebra) and as Pascal VOC (the crowd a difficult object)."""
    (tmp_path / "images").mkdir()
    Image.fromarray(np.full((128, 128, 3), 70, np.uint8)).save(tmp_path / "images" / "a.png")
    boxes = [[8, 8, 30, 30], [60, 10, 50, 40], [30, 80, 40, 40]]  # [x, y, w, h]: person, crowd, zebra
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 128, "height": 128}],
            "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "zebra"}],
            "annotations": [{"id": k + 1, "image_id": 1, "category_id": category, "bbox": box, "iscrowd": crowd}
                            for k, (box, category, crowd) in enumerate(zip(boxes, (1, 1, 2), (0, 1, 0)))]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    (tmp_path / "voc").mkdir()
    (tmp_path / "voc" / "a.xml").write_text("<annotation><filename>a.png</filename>" + "".join(
        f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x}</xmin><ymin>{y}</ymin>"
        f"<xmax>{x + w}</xmax><ymax>{y + h}</ymax></bndbox></object>"
        for (x, y, w, h), name, difficult in zip(boxes, ("person", "person", "zebra"), (0, 1, 0))) + "</annotation>")
    patterns = {}
    for kind, annotations_path in (("coco", tmp_path / "coco.json"), ("voc", tmp_path / "voc")):
        images_pipeline.run(str(annotations_path), str(tmp_path / "images"), str(tmp_path / f"{kind}-records"),
                            num_shards=1, pipeline_args=IN_PROCESS, log=lambda line: None)
        patterns[kind] = str(tmp_path / f"{kind}-records" / "data-*.tfrecord")
    return patterns


@pytest.mark.parametrize("kind", ["coco", "voc"])
def test_crowd_regions_and_difficult_objects_are_neither_trained_on_nor_counted_against(crowd_and_difficult_records,
                                                                                        kind, tmp_path):
    """They were plain boxes: trained on as one person, and a miss in the evaluation (COCO and VOC ignore them)."""
    pattern = crowd_and_difficult_records[kind]
    batch = next(detection_input.detection_dataset(pattern, 1, (128, 128), max_boxes=4).as_numpy_iterator())
    assert list(batch["ignore"][0]) == [0, 1, 0, 0] and list(batch["classes"][0]) == [0, 0, 1, -1]
    # Training: no anchor on the crowd is a person; the person and the zebra are still positives.
    config = presets.detection_demo(train_data=pattern, output_dir=str(tmp_path / "run"), image_size=(128, 128),
                                       batch_size=1, augment=False,
                                       model=dataclasses.replace(presets.DETECTION_DEMO_MODEL, num_classes=2))
    trained = next(detection.DetectionTask(config).batches(0, log=lambda line: None)).labels
    expected = retinanet.encode_targets(batch["boxes"], np.array([[0, -1, 1, -1]]), (128, 128), config.model)
    for key, value in expected.items():
        np.testing.assert_array_equal(trained[key], value)
    # Evaluation: the person found and the crowd not: person AP 1 (it was 0.5 with the crowd a box to find).
    keep = batch["classes"][0] >= 0
    truth = {"boxes": batch["boxes"][0][keep], "classes": batch["classes"][0][keep], "ignore": batch["ignore"][0][keep] > 0}
    found = {"boxes": truth["boxes"][[0, 2]], "scores": np.ones(2), "classes": truth["classes"][[0, 2]]}
    assert detection_eval.coco_metrics([found], [truth], ["person", "zebra"])["per_class_AP"] == pytest.approx(
        {"person": 1.0, "zebra": 1.0})
    plain = {key: value for key, value in truth.items() if key != "ignore"}
    assert detection_eval.coco_metrics([found], [plain], ["person", "zebra"])["per_class_AP"]["person"] < 0.6
