"""Box annotations from COCO JSON or Pascal VOC XML, in one form, with bad entries set aside.

Both formats become a list of `ImageAnnotations` (one per image, boxes in
pixels, corner form) plus dead letters for what cannot be used: annotations of
unknown images or categories, file names that escape the image directory,
unreadable XML files. A file that is not COCO at all is refused whole, with the
field that is missing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import xml.etree.ElementTree as ElementTree

from preprocessing.conversion import dead_letter


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


@dataclasses.dataclass(frozen=True)
class ImageAnnotations:
    """An image file and its boxes."""

    source_id: str
    path: str
    width: int | None  # as the annotations claim; checked against the file
    height: int | None
    boxes: tuple[Box, ...] = ()


def safe_image_path(image_dir: str, file_name: str) -> str | None:
    """`image_dir/file_name`, or None if the name escapes `image_dir` (absolute, `..`, links out)."""
    if os.path.isabs(file_name):
        return None
    root = os.path.realpath(image_dir)
    path = os.path.realpath(os.path.join(root, file_name))
    return path if os.path.commonpath([root, path]) == root else None


def read_coco(path: str, image_dir: str) -> tuple[list[ImageAnnotations], list[dict], dict[str, int]]:
    """Reads a COCO detection JSON file.

    Returns:
        (images, dead letters, label map name -> category id).

    Raises:
        ValueError: the file is not COCO detection JSON (names the missing field).
    """
    try:
        with open(path) as file:
            coco = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); pass a COCO annotation file or a directory of VOC XML.") from None
    for field in ("images", "annotations", "categories"):
        if not isinstance(coco, dict) or not isinstance(coco.get(field), list):
            raise ValueError(f"{path} has no '{field}' list; a COCO detection file needs images, annotations and categories.")
    categories = {c["id"]: c["name"] for c in coco["categories"]}
    dead: list[dict] = []
    images: dict[int, dict] = {}
    for entry in coco["images"]:
        image_path = safe_image_path(image_dir, entry["file_name"])
        if image_path is None:
            dead.append(dead_letter(f"{path}#image{entry['id']}", "annotations", "unsafe_path",
                                    f"file name {entry['file_name']!r} escapes the image directory {image_dir}"))
            continue
        images[entry["id"]] = {"entry": entry, "path": image_path, "boxes": []}
    for annotation in coco["annotations"]:
        source = f"{path}#annotation{annotation.get('id')}"
        image = images.get(annotation.get("image_id"))
        if image is None:
            if annotation.get("image_id") not in {e["id"] for e in coco["images"]}:
                dead.append(dead_letter(source, "annotations", "unknown_image",
                                        f"image_id {annotation.get('image_id')} is not in 'images'"))
            continue  # its image was already rejected
        if annotation.get("category_id") not in categories:
            dead.append(dead_letter(source, "annotations", "unknown_category",
                                    f"category_id {annotation.get('category_id')} is not in 'categories'"))
            continue
        x, y, width, height = (float(v) for v in annotation["bbox"])
        category = annotation["category_id"]
        image["boxes"].append(Box(x, y, x + width, y + height, category, categories[category], source))
    result = [
        ImageAnnotations(str(image_id), image["path"], image["entry"].get("width"), image["entry"].get("height"),
                         tuple(image["boxes"]))
        for image_id, image in sorted(images.items())
    ]
    return result, dead, {name: category for category, name in sorted(categories.items())}


def read_voc(directory: str, image_dir: str) -> tuple[list[ImageAnnotations], list[dict], dict[str, int]]:
    """Reads every Pascal VOC XML file in `directory`; class ids are 1.. in sorted name order.

    Returns:
        (images, dead letters, label map name -> id).
    """
    parsed, dead = [], []
    for name in sorted(os.listdir(directory)):
        if not name.lower().endswith(".xml"):
            continue
        xml_path = os.path.join(directory, name)
        try:
            root = ElementTree.parse(xml_path).getroot()
            file_name = root.findtext("filename")
            if not file_name:
                raise ValueError("no <filename>")
            size = root.find("size")
            width = int(size.findtext("width")) if size is not None else None
            height = int(size.findtext("height")) if size is not None else None
            objects = [
                (obj.findtext("name"), [float(obj.find("bndbox").findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")])
                for obj in root.iter("object")
            ]
        except (ElementTree.ParseError, ValueError, AttributeError, TypeError) as error:
            dead.append(dead_letter(xml_path, "annotations", "unreadable_annotation", f"not a readable VOC file ({error})"))
            continue
        image_path = safe_image_path(image_dir, file_name)
        if image_path is None:
            dead.append(dead_letter(xml_path, "annotations", "unsafe_path",
                                    f"file name {file_name!r} escapes the image directory {image_dir}"))
            continue
        parsed.append((xml_path, file_name, image_path, width, height, objects))
    label_map = {name: i + 1 for i, name in enumerate(sorted({n for *_, objects in parsed for n, _ in objects}))}
    images = [
        ImageAnnotations(
            os.path.splitext(file_name)[0], image_path, width, height,
            tuple(Box(*corners, label_map[text], text, f"{xml_path}#object{i}") for i, (text, corners) in enumerate(objects)),
        )
        for xml_path, file_name, image_path, width, height, objects in parsed
    ]
    return images, dead, label_map


def read_annotations(annotations: str, image_dir: str):
    """COCO JSON file or VOC XML directory, by what `annotations` is."""
    if not os.path.exists(annotations):
        raise FileNotFoundError(f"annotations {annotations!r} do not exist; pass a COCO JSON file or a directory of VOC XML.")
    if os.path.isdir(annotations):
        return read_voc(annotations, image_dir)
    return read_coco(annotations, image_dir)
