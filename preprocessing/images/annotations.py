"""Box annotations from COCO JSON (here) or Pascal VOC XML (`voc_annotations`), in one form, with bad entries set aside.

Both formats become a list of `ImageAnnotations` (one per image, boxes in
pixels, corner form) plus dead letters for what cannot be used: annotations of
unknown images or categories, entries missing a field (`file_name`, `bbox`),
fields that are not numbers, file names that escape the image directory,
unreadable XML files. Numbers written as strings ("640", ["10", "20", "30",
"40"]) are accepted when they parse as numbers. A file that is not COCO at all
is refused whole, with the field that is missing.

Class ids (`label_map.json`, name -> id) are what the records store: whole
numbers from 1, as the TF Object Detection API counts them; the trainer's class
index is id - 1. COCO category ids are kept, except that a category set
counting from 0 is shifted by one (0 -> 1), so category 0 is a class like any
other. VOC ids are 1.. in sorted name order. Given a label map written by a
previous conversion (`label_map=`), every class takes its id from it, so the
splits of one data set agree; a class the map lacks is refused, or given the
next free id with `extend_label_map=True`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable

from common import dead_letters
from preprocessing.records import dataset_files


@dataclasses.dataclass(frozen=True)
class Box:
    """One box in pixels: corners (x_min, y_min) to (x_max, y_max), exclusive of nothing."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float
    label: int
    text: str
    source: str  # where it came from, for dead letters: "file#annotation"
    crowd: bool = False  # COCO `iscrowd` 1: a region of many objects, not one
    difficult: bool = False  # Pascal VOC `<difficult>1</difficult>`


@dataclasses.dataclass(frozen=True)
class ImageAnnotations:
    """An image file and its boxes."""

    source_id: str
    path: str
    width: int | None  # as the annotations claim; checked against the file (None: not given)
    height: int | None
    boxes: tuple[Box, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Object:
    """A box before its class has an id: corners in pixels and the class name."""

    corners: tuple[float, float, float, float]
    name: str
    source: str
    crowd: bool = False
    difficult: bool = False


def safe_image_path(image_dir: str, file_name: str) -> str | None:
    """`image_dir/file_name`, or None if the name escapes `image_dir` (absolute, `..`, links out)."""
    if os.path.isabs(file_name) or "\0" in file_name:
        return None
    root = os.path.realpath(image_dir)
    path = os.path.realpath(os.path.join(root, file_name))
    return path if os.path.commonpath([root, path]) == root else None


def parse_number(value) -> float | None:
    """A finite number from a JSON number or a string that parses as one ("640", " 12.5"); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_whole_number(value) -> int | None:
    """`parse_number`, when it is a whole number (640, 640.0, "640"); None otherwise."""
    number = parse_number(value)
    return int(number) if number is not None and number.is_integer() else None


def _size_field(entry: dict, field: str, source: str) -> tuple[int | None, dict | None]:
    """(the image size field as a positive whole number or None when absent, or a dead letter)."""
    if entry.get(field) is None:
        return None, None
    number = parse_whole_number(entry[field])
    if number is None or number < 1:
        return None, dead_letters.dead_letter(source, "annotations", "bad_size",
                                 f"'{field}' is {entry[field]!r}, not a positive whole number; correct it or remove it "
                                 "(the image file's own size is used then)")
    return number, None


def resolve_label_map(
    names: list[str],
    default: dict[str, int],
    source: str,
    label_map_path: str | None,
    extend: bool,
    log: Callable[[str], None],
) -> dict[str, int]:
    """The label map a conversion writes: `default`, or the given one (extended with `extend`).

    Args:
        names: the classes the boxes use, in the order new ids are handed out.
        default: the map without `label_map_path` (from the annotations alone).
        source: the annotations, for the refusal.
        label_map_path: a `label_map.json` of a previous conversion, or None.
        extend: give a class the map lacks the next free id instead of refusing it.

    Raises:
        ValueError: a class is not in the given map and `extend` is off.
    """
    if label_map_path is None:
        return default
    label_map = dict(dataset_files.read_label_map_file(label_map_path))
    missing = [name for name in dict.fromkeys(names) if name not in label_map]
    if missing and not extend:
        listed = ", ".join(repr(name) for name in missing)
        raise ValueError(f"{'classes' if len(missing) > 1 else 'class'} {listed} in {source} "
                         f"{'are' if len(missing) > 1 else 'is'} not in the label map {label_map_path}; add "
                         f"{'them' if len(missing) > 1 else 'it'} there, or pass --extend-label-map to give "
                         f"{'each' if len(missing) > 1 else 'it'} the next free id.")
    for name in missing:
        label_map[name] = max(label_map.values()) + 1
    if missing:
        log(f"label map {label_map_path} extended with " + ", ".join(f"{name!r} = {label_map[name]}" for name in missing)
            + "; label_map.json in the output holds the whole map")
    return label_map


def _coco_categories(path: str, categories: list) -> dict[int, str]:
    """{category id: name}, every id a whole number >= 0 and every name a string used once."""
    by_id: dict[int, str] = {}
    for index, category in enumerate(categories):
        number = parse_whole_number(category.get("id")) if isinstance(category, dict) else None
        name = category.get("name") if isinstance(category, dict) else None
        if number is None or number < 0 or not isinstance(name, str) or not name:
            raise ValueError(f"{path}: categories[{index}] is {category!r}; each category needs an 'id' (a whole "
                             "number from 0) and a 'name', so correct that entry.")
        if name in by_id.values():
            other = next(key for key, value in by_id.items() if value == name)
            raise ValueError(f"{path}: categories {other} and {number} are both named {name!r}; give each category its "
                             "own name.")
        by_id[number] = name
    return by_id


def _coco_bbox(annotation: dict, source: str) -> tuple[tuple[float, float, float, float] | None, dict | None]:
    """(x_min, y_min, x_max, y_max) from the annotation's [x, y, width, height], or a dead letter."""
    if annotation.get("bbox") is None:
        return None, dead_letters.dead_letter(source, "annotations", "missing_bbox",
                                 "the annotation has no 'bbox'; give it [x, y, width, height] in pixels or remove it")
    value = annotation["bbox"]
    numbers = [parse_number(v) for v in value] if isinstance(value, (list, tuple)) and len(value) == 4 else [None]
    if None in numbers:
        return None, dead_letters.dead_letter(source, "annotations", "bad_bbox",
                                 f"'bbox' is {value!r}, not four numbers [x, y, width, height] in pixels; correct it")
    x, y, width, height = numbers
    return (x, y, x + width, y + height), None


def read_coco(path: str, image_dir: str, label_map: str | None = None, extend_label_map: bool = False,
              log: Callable[[str], None] = print) -> tuple[list[ImageAnnotations], list[dict], dict[str, int]]:
    """Reads a COCO detection JSON file.

    Args:
        path: the COCO JSON file.
        image_dir: the directory its file names are relative to.
        label_map: a `label_map.json` of a previous conversion to take the class ids from.
        extend_label_map: give a category that map lacks the next free id instead of refusing it.

    Returns:
        (images, dead letters, label map name -> id).

    Raises:
        ValueError: the file is not COCO detection JSON (names the missing field),
            or a category is not in `label_map`.
    """
    try:
        with open(path) as file:
            coco = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); pass a COCO annotation file or a directory of VOC XML.") from None
    for field in ("images", "annotations", "categories"):
        if not isinstance(coco, dict) or not isinstance(coco.get(field), list):
            raise ValueError(f"{path} has no '{field}' list; a COCO detection file needs images, annotations and categories.")
    categories = _coco_categories(path, coco["categories"])
    dead: list[dict] = []
    images: dict[str, dict] = {}
    listed: set[str] = set()  # every image id, rejected ones included
    for index, entry in enumerate(coco["images"]):
        image_id = entry.get("id") if isinstance(entry, dict) else None
        if image_id is None or isinstance(image_id, (dict, list)):
            dead.append(dead_letters.dead_letter(f"{path}#images[{index}]", "annotations", "missing_id",
                                    f"image entry {index} has no 'id'; give every image a unique id"))
            continue
        key, source = str(image_id), f"{path}#image{image_id}"  # "7" and 7 name one image
        if key in listed:
            dead.append(dead_letters.dead_letter(source, "annotations", "duplicate_image_id",
                                    f"image id {image_id!r} is listed twice; give every image a unique id"))
            continue
        listed.add(key)
        file_name = entry.get("file_name")
        if not isinstance(file_name, str) or not file_name:
            dead.append(dead_letters.dead_letter(source, "annotations", "missing_file_name",
                                    f"the image has no 'file_name' (found {file_name!r}); give it the image's path "
                                    f"relative to {image_dir}"))
            continue
        image_path = safe_image_path(image_dir, file_name)
        if image_path is None:
            dead.append(dead_letters.dead_letter(source, "annotations", "unsafe_path",
                                    f"file name {file_name!r} escapes the image directory {image_dir}"))
            continue
        width, bad_width = _size_field(entry, "width", source)
        height, bad_height = _size_field(entry, "height", source)
        if bad_width or bad_height:
            dead.append(bad_width or bad_height)
            continue
        images[key] = {"id": image_id, "path": image_path, "width": width, "height": height, "objects": []}
    for index, annotation in enumerate(coco["annotations"]):
        if not isinstance(annotation, dict):
            dead.append(dead_letters.dead_letter(f"{path}#annotations[{index}]", "annotations", "bad_entry",
                                    f"annotation {index} is {annotation!r}, not an object; remove it"))
            continue
        source = f"{path}#annotation{annotation.get('id', f'[{index}]')}"
        image = images.get(str(annotation.get("image_id")))
        if image is None:
            if str(annotation.get("image_id")) not in listed:
                dead.append(dead_letters.dead_letter(source, "annotations", "unknown_image",
                                        f"image_id {annotation.get('image_id')} is not in 'images'"))
            continue  # its image was already rejected
        category = parse_whole_number(annotation.get("category_id"))
        if category not in categories:
            dead.append(dead_letters.dead_letter(source, "annotations", "unknown_category",
                                    f"category_id {annotation.get('category_id')} is not in 'categories'"))
            continue
        corners, bad_box = _coco_bbox(annotation, source)
        if bad_box:
            dead.append(bad_box)
            continue
        crowd = parse_whole_number(annotation.get("iscrowd")) == 1
        image["objects"].append(_Object(corners, categories[category], source, crowd=crowd))
    # Ids as the file gives them (TF OD API: from 1); a set counting from 0 moves up by one, so 0 is a class too.
    shift = 1 if 0 in categories else 0
    if shift:
        log(f"{path}: category ids start at 0; stored as id + 1 (the TF Object Detection API keeps 0 for the "
            "background), see label_map.json")
    default = {name: category + shift for category, name in sorted(categories.items())}
    in_use = {o.name for image in images.values() for o in image["objects"]}
    used = [name for _, name in sorted(categories.items()) if name in in_use]
    label_ids = resolve_label_map(used, default, path, label_map, extend_label_map, log)
    result = [
        ImageAnnotations(str(image["id"]), image["path"], image["width"], image["height"],
                         tuple(Box(*o.corners, label_ids[o.name], o.name, o.source, crowd=o.crowd)
                               for o in image["objects"]))
        for image in sorted(images.values(), key=lambda image: _sort_key(image["id"]))
    ]
    return result, dead, label_ids


def _sort_key(image_id) -> tuple:
    """Numbers in numeric order, then strings: COCO ids are usually numbers, sometimes strings."""
    number = parse_number(image_id)
    return (0, number, "") if number is not None else (1, 0.0, str(image_id))
