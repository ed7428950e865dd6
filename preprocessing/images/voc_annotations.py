"""Box annotations from a Pascal VOC folder: one XML file per image, in the form of `annotations`.

Hidden files (macOS's `._a.xml` copies beside `a.xml`, `.DS_Store`; `common.hidden_files`) are not annotations:
they are left out and counted, never read as broken XML.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable

from common import dead_letters, hidden_files
from preprocessing.images import annotations


def read_voc(directory: str, image_dir: str, label_map: str | None = None, extend_label_map: bool = False,
             log: Callable[[str], None] = print
             ) -> tuple[list[annotations.ImageAnnotations], list[dict], dict[str, int]]:
    """Reads every Pascal VOC XML file in `directory`, hidden ones left out.

    Class ids are 1.. in sorted name order, or taken from `label_map` (see `annotations.read_coco`).

    Returns:
        (images, dead letters, label map name -> id).
    """
    return read_folder(directory, image_dir, label_map, extend_label_map, log)[:3]


def read_folder(directory: str, image_dir: str, label_map: str | None = None, extend_label_map: bool = False,
                log: Callable[[str], None] = print
                ) -> tuple[list[annotations.ImageAnnotations], list[dict], dict[str, int], int]:
    """`read_voc`, and how many hidden files it left out of `directory`."""
    names, hidden = hidden_files.list_folder(directory)
    parsed, dead = [], []
    for name in sorted(names):
        if not name.lower().endswith(".xml"):
            continue
        xml_path = os.path.join(directory, name)
        try:
            root = ElementTree.parse(xml_path).getroot()
            file_name = root.findtext("filename")
            if not file_name:
                raise ValueError("no <filename>")
            size = root.find("size")
            width, height = (_voc_number(size, key, whole=True) if size is not None else None
                             for key in ("width", "height"))
            objects = []
            for obj in root.iter("object"):
                text = (obj.findtext("name") or "").strip()
                if not text:
                    raise ValueError("an <object> without <name>")
                corners = tuple(_voc_number(obj.find("bndbox"), k) for k in ("xmin", "ymin", "xmax", "ymax"))
                objects.append((text, corners, (obj.findtext("difficult") or "0").strip() == "1"))
        except (ElementTree.ParseError, ValueError, AttributeError, TypeError, OSError) as error:
            dead.append(dead_letters.dead_letter(xml_path, "annotations", "unreadable_annotation", f"not a readable VOC file ({error})"))
            continue
        image_path = annotations.safe_image_path(image_dir, file_name)
        if image_path is None:
            dead.append(dead_letters.dead_letter(xml_path, "annotations", "unsafe_path",
                                    f"file name {file_name!r} escapes the image directory {image_dir}"))
            continue
        parsed.append((xml_path, file_name, image_path, width, height, objects))
    classes = sorted({n for *_, objects in parsed for n, _, _ in objects})
    label_ids = annotations.resolve_label_map(classes, {name: i + 1 for i, name in enumerate(classes)}, directory, label_map,
                                  extend_label_map, log)
    images = [
        annotations.ImageAnnotations(
            os.path.splitext(file_name)[0], image_path, width, height,
            tuple(annotations.Box(*corners, label_ids[text], text, f"{xml_path}#object{i}", difficult=difficult)
                  for i, (text, corners, difficult) in enumerate(objects)),
        )
        for xml_path, file_name, image_path, width, height, objects in parsed
    ]
    return images, dead, label_ids, hidden


def _voc_number(element, key: str, whole: bool = False):
    """`<key>` under `element` as a number; with `whole` (the image size), a whole one or None when not given.

    VOC exports often write an unknown size as 0: that, too, is "not given", and the file's own size is used.
    """
    if element is None:
        raise ValueError("an <object> without <bndbox>")
    text = element.findtext(key)
    if text is None and whole:
        return None
    number = annotations.parse_whole_number(text) if whole else annotations.parse_number(text)
    if number is None:
        raise ValueError(f"<{key}> is {text!r}, not a {'whole ' if whole else ''}number")
    return number if not whole or number > 0 else None
