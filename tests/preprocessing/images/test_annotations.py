"""COCO and VOC annotations: every bad entry is a dead letter with its reason, and class ids agree across splits."""

import json
import os

import pytest

from preprocessing.images import annotations, voc_annotations
from preprocessing.records import dataset_files


def _coco(tmp_path, images, annotation_list, categories=({"id": 1, "name": "thing"},), name="coco.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"images": list(images), "annotations": list(annotation_list),
                                "categories": list(categories)}))
    return str(path)


def _letters(dead):
    return {letter["source"].rsplit("#", 1)[-1]: (letter["reason"], letter["detail"]) for letter in dead}


def test_entries_missing_a_field_are_dead_letters_not_key_errors(tmp_path):
    path = _coco(tmp_path, [
        {"id": 1, "file_name": "a.png", "width": 60, "height": 40},
        {"id": 2, "width": 60, "height": 40},  # no file_name
        {"file_name": "c.png"},  # no id
        {"id": 1, "file_name": "d.png"},  # id again
    ], [
        {"id": 10, "image_id": 1, "category_id": 1},  # no bbox
        {"id": 11, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3]},
        {"id": 12, "image_id": 1, "category_id": 1, "bbox": ["ten", 2, 3, 4]},
        {"id": 13, "image_id": 1, "category_id": 1, "bbox": [float("nan"), 2, 3, 4]},
        {"id": 14, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]},  # good
        "not an annotation",
    ])
    items, dead, _ = annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert [(item.source_id, len(item.boxes)) for item in items] == [("1", 1)]
    assert _letters(dead) == {
        "image2": ("missing_file_name", f"the image has no 'file_name' (found None); give it the image's path "
                                        f"relative to {tmp_path}"),
        "images[2]": ("missing_id", "image entry 2 has no 'id'; give every image a unique id"),
        "image1": ("duplicate_image_id", "image id 1 is listed twice; give every image a unique id"),
        "annotation10": ("missing_bbox", "the annotation has no 'bbox'; give it [x, y, width, height] in pixels or "
                                         "remove it"),
        "annotation11": ("bad_bbox", "'bbox' is [1, 2, 3], not four numbers [x, y, width, height] in pixels; correct it"),
        "annotation12": ("bad_bbox", "'bbox' is ['ten', 2, 3, 4], not four numbers [x, y, width, height] in pixels; "
                                     "correct it"),
        "annotation13": ("bad_bbox", "'bbox' is [nan, 2, 3, 4], not four numbers [x, y, width, height] in pixels; "
                                     "correct it"),
        "annotations[5]": ("bad_entry", "annotation 5 is 'not an annotation', not an object; remove it"),
    }


def test_numbers_written_as_strings_are_accepted(tmp_path):
    path = _coco(tmp_path, [{"id": "7", "file_name": "a.png", "width": "640", "height": "480.0"}],
                 [{"id": 1, "image_id": 7, "category_id": "1", "bbox": ["10", "20", "30", "40.5"]}])
    items, dead, _ = annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert dead == []
    (item,) = items
    assert (item.source_id, item.width, item.height) == ("7", 640, 480)
    assert [(b.x_min, b.y_min, b.x_max, b.y_max, b.label) for b in item.boxes] == [(10.0, 20.0, 40.0, 60.5, 1)]


@pytest.mark.parametrize("value", ["wide", -5, 640.5, [640]])
def test_a_size_that_is_not_a_whole_number_is_a_dead_letter(tmp_path, value):
    path = _coco(tmp_path, [{"id": 1, "file_name": "a.png", "width": value, "height": 40}], [])
    items, dead, _ = annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert items == []
    assert _letters(dead) == {"image1": ("bad_size", f"'width' is {value!r}, not a positive whole number; correct it "
                                                     "or remove it (the image file's own size is used then)")}


def test_missing_size_fields_are_left_to_the_file(tmp_path):
    path = _coco(tmp_path, [{"id": 1, "file_name": "a.png", "height": 40}], [])
    (item,), dead, _ = annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert dead == [] and (item.width, item.height) == (None, 40)


def test_category_zero_is_a_class_like_any_other(tmp_path):
    path = _coco(tmp_path, [{"id": 1, "file_name": "a.png"}], [
        {"id": 1, "image_id": 1, "category_id": 0, "bbox": [1, 1, 5, 5]},
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [1, 1, 5, 5]},
    ], categories=[{"id": 0, "name": "person"}, {"id": 1, "name": "car"}, {"id": 2, "name": "dog"}])
    lines = []
    (item,), dead, label_map = annotations.read_coco(path, str(tmp_path), log=lines.append)
    assert dead == []
    assert [(b.text, b.label) for b in item.boxes] == [("person", 1), ("dog", 3)]
    assert label_map == {"person": 1, "car": 2, "dog": 3}
    assert lines == [f"{path}: category ids start at 0; stored as id + 1 (the TF Object Detection API keeps 0 for "
                     "the background), see label_map.json"]


def test_category_ids_counting_from_one_are_kept(tmp_path):
    path = _coco(tmp_path, [{"id": 1, "file_name": "a.png"}], [
        {"id": 1, "image_id": 1, "category_id": 5, "bbox": [1, 1, 5, 5]}],
        categories=[{"id": 5, "name": "dog"}, {"id": 2, "name": "car"}])
    (item,), _, label_map = annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert [b.label for b in item.boxes] == [5] and label_map == {"car": 2, "dog": 5}


@pytest.mark.parametrize("categories, message", [
    ([{"id": 1}], "categories[0] is {'id': 1}; each category needs an 'id' (a whole number from 0) and a 'name', so "
                  "correct that entry."),
    ([{"id": -1, "name": "x"}], "categories[0] is {'id': -1, 'name': 'x'}; each category needs an 'id'"),
    ([{"id": 1, "name": "x"}, {"id": 2, "name": "x"}], "categories 1 and 2 are both named 'x'; give each category its "
                                                       "own name."),
])
def test_a_broken_category_list_is_refused_in_one_sentence(tmp_path, categories, message):
    path = _coco(tmp_path, [], [], categories=categories)
    with pytest.raises(ValueError) as error:
        annotations.read_coco(path, str(tmp_path), log=lambda line: None)
    assert str(error.value).startswith(f"{path}: {message}")


def _voc(directory, name, *classes, size=("80", "50")):
    directory.mkdir(exist_ok=True)
    objects = "".join(f"<object><name>{c}</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax>"
                      "</bndbox></object>" for c in classes)
    (directory / f"{name}.xml").write_text(
        f"<annotation><filename>{name}.jpg</filename><size><width>{size[0]}</width><height>{size[1]}</height></size>"
        f"{objects}</annotation>")


@pytest.fixture
def voc_splits(tmp_path):
    """A training split with car, dog and person; an eval split with person only (ids differ without a map)."""
    _voc(tmp_path / "train", "t1", "person", "car")
    _voc(tmp_path / "train", "t2", "dog")
    _voc(tmp_path / "eval", "e1", "person")
    _, _, train_map = voc_annotations.read_voc(str(tmp_path / "train"), str(tmp_path), log=lambda line: None)
    (tmp_path / "label_map.json").write_text(json.dumps(train_map))
    return tmp_path


def test_voc_eval_split_takes_the_training_ids_from_the_label_map(voc_splits):
    train_map = json.loads((voc_splits / "label_map.json").read_text())
    assert train_map == {"car": 1, "dog": 2, "person": 3}
    _, _, alone = voc_annotations.read_voc(str(voc_splits / "eval"), str(voc_splits), log=lambda line: None)
    assert alone == {"person": 1}  # without the map: ids depend on the split, as before
    (item,), dead, label_map = voc_annotations.read_voc(str(voc_splits / "eval"), str(voc_splits),
                                                    label_map=str(voc_splits / "label_map.json"), log=lambda line: None)
    assert dead == [] and label_map == train_map
    assert [(b.text, b.label) for b in item.boxes] == [("person", 3)]


def test_a_class_the_label_map_lacks_is_refused(voc_splits):
    _voc(voc_splits / "eval", "e2", "bus", "cat")
    with pytest.raises(ValueError) as error:
        voc_annotations.read_voc(str(voc_splits / "eval"), str(voc_splits), label_map=str(voc_splits / "label_map.json"),
                             log=lambda line: None)
    assert str(error.value) == (
        f"classes 'bus', 'cat' in {voc_splits / 'eval'} are not in the label map {voc_splits / 'label_map.json'}; add "
        "them there, or pass --extend-label-map to give each the next free id.")


def test_extend_label_map_gives_new_classes_the_next_free_ids(voc_splits):
    _voc(voc_splits / "eval", "e2", "bus")
    lines = []
    items, _, label_map = voc_annotations.read_voc(str(voc_splits / "eval"), str(voc_splits),
                                               label_map=str(voc_splits / "label_map.json"), extend_label_map=True,
                                               log=lines.append)
    assert label_map == {"car": 1, "dog": 2, "person": 3, "bus": 4}
    assert {b.text: b.label for item in items for b in item.boxes} == {"person": 3, "bus": 4}
    assert lines == [f"label map {voc_splits / 'label_map.json'} extended with 'bus' = 4; label_map.json in the "
                     "output holds the whole map"]


def test_coco_takes_ids_from_the_label_map_by_name(tmp_path):
    (tmp_path / "label_map.json").write_text(json.dumps({"car": 1, "dog": 2, "person": 3}))
    path = _coco(tmp_path, [{"id": 1, "file_name": "a.png"}], [
        {"id": 1, "image_id": 1, "category_id": 0, "bbox": [1, 1, 5, 5]}],
        categories=[{"id": 0, "name": "person"}, {"id": 1, "name": "zebra"}])  # zebra unused: not refused
    (item,), _, label_map = annotations.read_coco(path, str(tmp_path), label_map=str(tmp_path / "label_map.json"),
                                                  log=lambda line: None)
    assert [(b.text, b.label) for b in item.boxes] == [("person", 3)]
    assert label_map == {"car": 1, "dog": 2, "person": 3}


@pytest.mark.parametrize("content, message", [
    ('{"car": 0}', "maps 'car' to 0; class ids are whole numbers from 1 (the TF Object Detection API keeps 0 for the "
                   "background), so correct that entry."),
    ('{"car": 1, "bus": 1}', "gives id 1 to both 'car' and 'bus'; give each class its own id."),
    ('["car"]', "is not a JSON object of class name -> id; pass the label_map.json a previous conversion wrote."),
])
def test_a_bad_label_map_file_is_refused(tmp_path, content, message):
    (tmp_path / "map.json").write_text(content)
    with pytest.raises(ValueError) as error:
        dataset_files.read_label_map_file(str(tmp_path / "map.json"))
    assert str(error.value) == f"--label-map {tmp_path / 'map.json'} {message}"


def test_a_missing_label_map_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        dataset_files.read_label_map_file(str(tmp_path / "nope.json"))
    assert str(error.value) == (f"--label-map {tmp_path / 'nope.json'} does not exist; pass the label_map.json a "
                                "previous conversion wrote (e.g. the training split's).")


def test_voc_quirks(tmp_path):
    _voc(tmp_path / "xml", "zero_size", "dog", size=("0", "0"))  # unknown size, as many exports write it
    _voc(tmp_path / "xml", "float_size", "dog", size=("80.0", " 50 "))
    (tmp_path / "xml" / "no_name.xml").write_text(
        "<annotation><filename>n.jpg</filename><object><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax>"
        "<ymax>9</ymax></bndbox></object></annotation>")
    (tmp_path / "xml" / "no_box.xml").write_text(
        "<annotation><filename>b.jpg</filename><object><name>dog</name></object></annotation>")
    items, dead, _ = voc_annotations.read_voc(str(tmp_path / "xml"), str(tmp_path), log=lambda line: None)
    assert {item.source_id: (item.width, item.height) for item in items} == {"zero_size": (None, None),
                                                                             "float_size": (80, 50)}
    assert {os.path.basename(d["source"]): (d["reason"], d["detail"]) for d in dead} == {
        "no_name.xml": ("unreadable_annotation", "not a readable VOC file (an <object> without <name>)"),
        "no_box.xml": ("unreadable_annotation", "not a readable VOC file (an <object> without <bndbox>)"),
    }
