"""The one owner of a data set's own files, beside its records: `summary.json` and `label_map.json`.

`fullres preprocess` writes them (through `beam.publishing.publish`, with the
contents built here); the trainer, `fullres predict` and the pipeline read them
here, with one rule each:

* `label_map.json` is a JSON object of class name -> id. Ids are whole numbers,
  each used once; 0 is the background and may be named only "background"
  (CT label maps record it, detection maps leave it out: the TF Object
  Detection API keeps 0 for it). `check_label_map` is that rule, and every
  reader and writer goes through it.
* `summary.json` is written last by a conversion (its presence means the data
  set is complete); its `label_values` and `preprocessing` are read here.
* A data set is named (`--train`, `--eval`, the pipeline's datasets) by its
  folder, or by a pattern of its records, whose folder part may hold wildcards
  too (`out/*/data-*`: several data sets), or by several of either separated
  by commas (`data/a,data/b`). `folders` and `record_files` are that
  rule for every reader; `data_set.resolve` is it with every check training
  makes: each matched folder has its `summary.json`, and the data sets a
  pattern spans agree.

Paths may be local or `gs://` (TensorFlow's file system).
"""

from __future__ import annotations

import json
import os

from preprocessing.records import file_system

SUMMARY = "summary.json"
LABEL_MAP = "label_map.json"
BACKGROUND = "background"


class LabelMapError(ValueError):
    """A label map breaks the rule; `entry` is what is wrong, as a clause, so each reader can add its own fix."""

    def __init__(self, entry: str, fix: str, name: str | None = None, number=None):
        super().__init__(f"{entry}; {fix}")
        self.entry, self.fix, self.name, self.number = entry, fix, name, number


def check_label_map(label_map) -> dict[str, int]:
    """The one rule for a label map: {name: id}, whole-number ids each once, 0 only for "background".

    Example:
        >>> check_label_map({"background": 0, "liver": 1, "kidney": 2})
        {'background': 0, 'liver': 1, 'kidney': 2}

    Raises:
        LabelMapError: the first entry that breaks the rule (the message says which and why).
    """
    if not isinstance(label_map, dict) or not label_map:
        raise LabelMapError("is not a JSON object of class name -> id",
                            "pass the label_map.json a previous conversion wrote.")
    seen: dict[int, str] = {}
    for name, number in label_map.items():
        if isinstance(number, bool) or not isinstance(number, int) or number < 0 or (number == 0 and name != BACKGROUND):
            raise LabelMapError(f"maps {name!r} to {number!r}",
                                "class ids are whole numbers from 1 (the TF Object Detection API keeps 0 for the "
                                "background), so correct that entry.", name, number)
        if number in seen:
            raise LabelMapError(f"gives id {number} to both {seen[number]!r} and {name!r}",
                                "give each class its own id.", name, number)
        seen[number] = name
    return label_map


def write_label_map(directory: str, label_map: dict[str, int]) -> str:
    """Writes `label_map.json` into `directory` (checked first); returns its path."""
    path = os.path.join(directory, LABEL_MAP)
    with open(path, "w") as file:
        json.dump(check_label_map(label_map), file)
    return path


def foreground(label_map: dict[str, int]) -> dict[str, int]:
    """The classes of a label map without the background (id 0)."""
    return {name: number for name, number in label_map.items() if number != 0}


def read_label_map_file(path: str, flag: str = "--label-map") -> dict[str, int]:
    """A `label_map.json` the user names on the command line (`flag`), checked by `check_label_map`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: it is not valid JSON or breaks the rule (the sentence names the flag, the file and the entry).
    """
    if not file_system.exists(path) or file_system.isdir(path):
        raise FileNotFoundError(f"{flag} {path} does not exist; pass the label_map.json a previous conversion "
                                "wrote (e.g. the training split's).")
    try:
        with file_system.open_text(path) as file:
            label_map = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{flag} {path} is not valid JSON ({error}); pass the label_map.json a previous "
                         "conversion wrote.") from None
    try:
        return check_label_map(label_map)
    except LabelMapError as error:
        raise ValueError(f"{flag} {path} {error}") from None


def _parts(value: str) -> list[str]:
    """`value` as the data sets it names one by one: split at commas, unless `value` itself exists (a path may
    hold a comma)."""
    if "," not in value or file_system.exists(value) or file_system.glob(value):
        return [value]
    return [part.strip() for part in value.split(",") if part.strip()]


def folders(value: str) -> list[str]:
    """The data set folders `value` names, in order: itself when it is a folder; else the folders of the files
    (or the folders themselves) its pattern matches; when it matches nothing, the folder its pattern names.
    Several, separated by commas: the folders of each, in order.

    A wildcard in the folder part (`out/ts4[1]/data-*`, `out/*/data-*`) finds the folders it matches, not a
    folder of that literal name.
    """
    found: list[str] = []
    for part in _parts(value):
        if file_system.isdir(part):
            matches = [part]
        else:
            matches = [m if file_system.isdir(m) else os.path.dirname(m) for m in sorted(file_system.glob(part))]
        for folder in matches or [os.path.dirname(part)]:
            if folder not in found:
                found.append(folder)
    return found


def _shards(folder: str) -> list[str]:
    """The record files of the data set in `folder`: the shards its summary.json lists (a conversion's), or
    the `data-*` files in it when it has no summary."""
    summary = read_json(os.path.join(folder, SUMMARY))
    if summary and summary.get("shards"):
        return [os.path.join(folder, name) for name in summary["shards"]]
    return sorted(match for match in file_system.glob(os.path.join(folder, "data-*")) if not file_system.isdir(match))


def record_files(value: str) -> list[str]:
    """The record files `value` names: a data set folder's shards, or the files its pattern matches (a matched
    folder stands for its shards); several, separated by commas: each one's, in order, each file once; [] when
    it names none."""
    files: list[str] = []
    for part in _parts(value):
        if file_system.isdir(part):
            found = _shards(part)
        else:
            found = []
            for match in sorted(file_system.glob(part)):
                found.extend(_shards(match) if file_system.isdir(match) else [match])
        files.extend(path for path in found if path not in files)
    return files


def compression(files: list[str]) -> str:
    """The TFRecord compression of `files` ("GZIP" for .gz, "" otherwise).

    Raises:
        ValueError: they mix .gz and uncompressed files.
    """
    gzipped = {f.endswith(".gz") for f in files}
    if len(gzipped) > 1:
        raise ValueError(f"the files {files[:3]}... mix .gz and uncompressed TFRecords; keep one kind per data set.")
    return "GZIP" if gzipped.pop() else ""


def beside(pattern: str, name: str) -> str:
    """Where a data set's file `name` lies: in the (first) folder `pattern` names (`folders`)."""
    return os.path.join(folders(pattern)[0], name)


def label_map_path(pattern: str) -> str:
    """Where a conversion writes `label_map.json`: beside the records."""
    return beside(pattern, LABEL_MAP)


def read_label_map(pattern: str) -> dict[str, int] | None:
    """`label_map.json` (name -> id) beside the records; None when there is none.

    Detection ids count from 1, as the records store them (TF Object Detection
    API); the class index the model predicts is id - 1, everywhere: input,
    loss, mAP, report.

    Raises:
        ValueError: the map breaks `check_label_map` (a map written before COCO
            category 0 was stored as 1 holds a 0 for a class).
    """
    path = label_map_path(pattern)
    if not file_system.exists(path):
        return None
    with file_system.open_text(path) as file:
        label_map = json.load(file)
    try:
        return check_label_map(label_map)
    except LabelMapError as error:
        if error.number == 0:
            raise ValueError(f"{path} maps {error.name!r} to 0, but class ids count from 1 (0 is the background in "
                             "the TF Object Detection API); convert the data again with fullres preprocess images, "
                             "which stores COCO category 0 as 1.") from None
        raise ValueError(f"{path} {error.entry}; convert the data again with fullres preprocess.") from None


def check_label_maps_agree(train_pattern: str, eval_pattern: str) -> None:
    """Refuses evaluation data whose class ids differ from the training data's: it would be scored silently wrong.

    Raises:
        ValueError: a class of the eval label map has another id (or none) in the training label map.
    """
    train_map, eval_map = read_label_map(train_pattern), read_label_map(eval_pattern)
    if not train_map or not eval_map:
        return
    for name, number in sorted(eval_map.items(), key=lambda item: item[1]):
        if train_map.get(name) != number:
            raise ValueError(
                f"class {name!r} has id {number} in {label_map_path(eval_pattern)} but "
                f"{train_map.get(name) or 'no id'} in {label_map_path(train_pattern)}, so evaluation would score it "
                f"as another class; convert the eval data again with --label-map {label_map_path(train_pattern)}."
            )


def class_names(label_map: dict[str, int] | None, num_classes: int) -> list[str]:
    """Names of the 0-based detection classes (id - 1); ids the label map skips are named `class_<id>`.

    >>> class_names({"circle": 1, "triangle": 3}, 3)
    ['circle', 'class_2', 'triangle']
    """
    by_id = {number: name for name, number in foreground(label_map or {}).items()}
    return [by_id.get(index + 1, f"class_{index + 1}") for index in range(num_classes)]


def segmentation_class_names(num_classes: int) -> list[str]:
    """Names of a segmentation model's classes when none are given or recorded: background first, then class_<id>.

    >>> segmentation_class_names(3)
    ['background', 'class_1', 'class_2']
    """
    return [BACKGROUND, *(f"class_{number}" for number in range(1, num_classes))]


def read_json(path: str):
    """The JSON in `path`; None when there is no such file."""
    if not file_system.exists(path):
        return None
    with file_system.open_text(path) as file:
        return json.load(file)


def read_summary(pattern: str) -> dict | None:
    """The conversion's `summary.json` beside the records; None when there is none."""
    return read_json(beside(pattern, SUMMARY))


def read_preprocessing(pattern: str) -> dict | None:
    """The spacing, orientation, window and modality `fullres preprocess ct` used (`summary.json` beside the records).

    None when the records carry no such summary (older conversions, synthetic demo records).
    """
    return (read_summary(pattern) or {}).get("preprocessing")


def read_data_modality(pattern: str) -> dict | None:
    """What the scans `fullres preprocess ct` converted turned out to be (`summary.json`'s `data_modality`):
    `{"modalities": {"CT": 12}, "intensity_range": [low, high]}`; None when not recorded (older conversions)."""
    return (read_summary(pattern) or {}).get("data_modality")


def ct_label_map(classes: tuple[str, ...]) -> dict[str, int]:
    """The label map a CT conversion writes for its named classes: background 0, then 1, 2, ... in order."""
    return check_label_map({BACKGROUND: 0, **{name: index + 1 for index, name in enumerate(classes)}})


def write_summary(directory: str, summary: dict) -> str:
    """Writes `summary.json` into `directory` (for record writers outside a Beam conversion); returns its path."""
    path = os.path.join(directory, SUMMARY)
    with open(path + ".tmp", "w") as file:
        json.dump(summary, file, indent=2)
    os.replace(path + ".tmp", path)
    return path
