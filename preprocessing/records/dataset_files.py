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
  rule for every reader; `resolve` is it with every check training makes: each
  matched folder has its `summary.json`, and the data sets a pattern spans agree.

Paths may be local or `gs://` (TensorFlow's file system).
"""

from __future__ import annotations

import dataclasses
import json
import os

from preprocessing.records import tfrecord_schema

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
    import tensorflow as tf

    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        raise FileNotFoundError(f"{flag} {path} does not exist; pass the label_map.json a previous conversion "
                                "wrote (e.g. the training split's).")
    try:
        with tf.io.gfile.GFile(path) as file:
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
    import tensorflow as tf

    if "," not in value or tf.io.gfile.exists(value) or tf.io.gfile.glob(value):
        return [value]
    return [part.strip() for part in value.split(",") if part.strip()]


def folders(value: str) -> list[str]:
    """The data set folders `value` names, in order: itself when it is a folder; else the folders of the files
    (or the folders themselves) its pattern matches; when it matches nothing, the folder its pattern names.
    Several, separated by commas: the folders of each, in order.

    A wildcard in the folder part (`out/ts4[1]/data-*`, `out/*/data-*`) finds the folders it matches, not a
    folder of that literal name.
    """
    import tensorflow as tf

    found: list[str] = []
    for part in _parts(value):
        if tf.io.gfile.isdir(part):
            matches = [part]
        else:
            matches = [m if tf.io.gfile.isdir(m) else os.path.dirname(m) for m in sorted(tf.io.gfile.glob(part))]
        for folder in matches or [os.path.dirname(part)]:
            if folder not in found:
                found.append(folder)
    return found


def _shards(folder: str) -> list[str]:
    """The record files of the data set in `folder`: the shards its summary.json lists (a conversion's), or
    the `data-*` files in it when it has no summary."""
    import tensorflow as tf

    summary = _read_json(os.path.join(folder, SUMMARY))
    if summary and summary.get("shards"):
        return [os.path.join(folder, name) for name in summary["shards"]]
    return sorted(match for match in tf.io.gfile.glob(os.path.join(folder, "data-*")) if not tf.io.gfile.isdir(match))


def record_files(value: str) -> list[str]:
    """The record files `value` names: a data set folder's shards, or the files its pattern matches (a matched
    folder stands for its shards); several, separated by commas: each one's, in order, each file once; [] when
    it names none."""
    import tensorflow as tf

    files: list[str] = []
    for part in _parts(value):
        if tf.io.gfile.isdir(part):
            found = _shards(part)
        else:
            found = []
            for match in sorted(tf.io.gfile.glob(part)):
                found.extend(_shards(match) if tf.io.gfile.isdir(match) else [match])
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
    import tensorflow as tf

    path = label_map_path(pattern)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as file:
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


def _read_json(path: str):
    """The JSON in `path`; None when there is no such file."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as file:
        return json.load(file)


def read_summary(pattern: str) -> dict | None:
    """The conversion's `summary.json` beside the records; None when there is none."""
    return _read_json(beside(pattern, SUMMARY))


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


@dataclasses.dataclass(frozen=True)
class DataSet:
    """What a `--train` or `--eval` value names, checked by `resolve`: one data set, or several that agree.

    Attributes:
        value, flag: as given (`--train 'out/*/data-*'`), for messages.
        files: the record files, in order.
        folders: the data set folder of each group of files, in order.
        kind: `tfrecord_schema.CT_RECORDS` or `tfrecord_schema.DETECTION_RECORDS`.
        summaries: each folder's summary.json.
        label_map: the (shared) label_map.json, or None where the data sets have none.
    """

    value: str
    flag: str
    files: tuple[str, ...]
    folders: tuple[str, ...]
    kind: str
    summaries: tuple[dict, ...]
    label_map: dict[str, int] | None

    @property
    def preprocessing(self) -> dict | None:
        """The (shared) `preprocessing` of the summaries; None where a conversion recorded none."""
        return self.summaries[0].get("preprocessing")

    @property
    def label_values(self) -> list[int]:
        """Every class id any of the data sets' summaries lists."""
        return sorted({int(value) for summary in self.summaries for value in summary.get("label_values", {})})

    @property
    def summary_path(self) -> str:
        return os.path.join(self.folders[0], SUMMARY)


def _first_record_kind(files: list[str]) -> str | None:
    """The kind of the first record in `files` (`tfrecord_schema.record_kind`); None when they hold no record."""
    import tensorflow as tf
    from google.protobuf import message

    for path in files:
        try:
            for serialized in tf.data.TFRecordDataset(path, compression_type=compression([path])).take(1):
                keys = tf.train.Example.FromString(serialized.numpy()).features.feature.keys()
                return tfrecord_schema.record_kind(keys) or "unknown"
        except (tf.errors.DataLossError, message.DecodeError):  # not TFRecords of Examples (other errors say their own)
            raise ValueError(f"{path} is not a TFRecord file; name only the records a fullres conversion "
                             "wrote (its data-* files).") from None
    return None


def _difference(first: dict | None, other: dict | None) -> str:
    """The keys in which two preprocessing records differ, as `shape` or `spacing, window`."""
    first, other = first or {}, other or {}
    return ", ".join(key for key in sorted(set(first) | set(other)) if first.get(key) != other.get(key))


def resolve(value: str, flag: str = "--train") -> DataSet:
    """The records `value` (a data set folder, or a pattern of records) names, refused unless they can be used.

    A folder stands for its data set's shards (what its summary.json lists); a
    pattern may match records of several data sets (`out/*/data-*`). Every
    matched folder must hold a finished conversion's summary.json, and the data
    sets must agree in kind of record, preprocessing (shape included) and
    label map.

    Raises:
        FileNotFoundError: nothing is matched, a folder has no summary.json, or lacks a shard it lists.
        ValueError: a matched file is not a record of its data set, or two data
            sets differ (the message names both).
    """
    import tensorflow as tf

    files = record_files(value)
    if not files:
        if tf.io.gfile.isdir(value) and _read_json(os.path.join(value, SUMMARY)) is not None:
            raise FileNotFoundError(f"{flag} {value} holds no records (its {SUMMARY} lists no shards: every case "
                                    "failed); see its dead_letter.jsonl, and convert the data again.")
        if tf.io.gfile.isdir(value):
            raise FileNotFoundError(f"{flag} {value} is a folder without records or {SUMMARY}; pass the --output "
                                    "folder of fullres preprocess (or a pattern of its data-* records).")
        raise FileNotFoundError(f"no TFRecord files match {flag} {value!r}; pass a data set folder (the --output of "
                                "fullres preprocess) or a pattern of its records, e.g. 'data/ct/data-*'.")
    groups: dict[str, list[str]] = {}
    for path in files:
        groups.setdefault(os.path.dirname(path), []).append(path)
    summaries, kinds, label_maps = [], [], []
    for folder, paths in groups.items():
        summary = _read_json(os.path.join(folder, SUMMARY))
        names = ", ".join(os.path.basename(p) for p in paths[:3]) + (", ..." if len(paths) > 3 else "")
        if summary is None:
            raise FileNotFoundError(
                f"{flag} {value} matches {len(paths)} file(s) in {folder} ({names}), but {folder} has no "
                f"{SUMMARY}, which a finished fullres conversion writes last; pass the --output folder of fullres "
                "preprocess ct or images, or convert the data again.")
        listed = set(summary.get("shards") or ())
        missing = sorted(listed - {name.rstrip("/") for name in tf.io.gfile.listdir(folder)})
        if missing:  # a copy cut short: training on the rest would be silently partial
            raise FileNotFoundError(
                f"{flag} {value}: {os.path.join(folder, SUMMARY)} lists {missing[0]}"
                f"{f' and {len(missing) - 1} more shard(s)' if len(missing) > 1 else ''}, which {folder} lacks; copy "
                "the data set whole (every shard its summary lists), or convert it again.")
        strays = [os.path.basename(p) for p in paths if listed and os.path.basename(p) not in listed]
        if strays:
            raise ValueError(
                f"{flag} {value} matches {strays[0]} in {folder}, which is not one of the records its {SUMMARY} "
                f"lists ({', '.join(sorted(listed)[:2])}{', ...' if len(listed) > 2 else ''}); pass the folder "
                f"{folder} itself, or narrow the pattern to its records, e.g. {os.path.join(folder, 'data-*')!r}.")
        kind = _first_record_kind(paths)
        if kind == "unknown":
            raise ValueError(f"{flag} {value} matches {paths[0]}, which holds neither CT volumes nor images with "
                             "boxes; pass records written by fullres preprocess ct or images.")
        summaries.append(summary)
        kinds.append(kind)
        label_maps.append(read_label_map(folder))
    folder_list = list(groups)
    for index in range(1, len(folder_list)):
        this, first = folder_list[index], folder_list[0]
        if kinds[index] != kinds[0] and None not in (kinds[index], kinds[0]):
            difference = ("kind of records", kinds[0], kinds[index])
        elif summaries[index].get("preprocessing") != summaries[0].get("preprocessing"):
            keys = _difference(summaries[0].get("preprocessing"), summaries[index].get("preprocessing"))
            before, after = summaries[0].get("preprocessing") or {}, summaries[index].get("preprocessing") or {}
            key = keys.split(", ")[0]
            difference = (f"preprocessing ({keys})", f"{key} {before.get(key)}", f"{key} {after.get(key)}")
        elif label_maps[index] != label_maps[0]:
            difference = (LABEL_MAP, json.dumps(label_maps[0]), json.dumps(label_maps[index]))
        else:
            continue
        what, mine, theirs = difference
        raise ValueError(
            f"{flag} {value} spans data sets that differ in {what}: {first} has {mine} but {this} has {theirs}; "
            "train on data sets converted with the same settings, or narrow the pattern to one of them.")
    kind = next((k for k in kinds if k is not None), None)
    if kind is None:
        raise ValueError(f"{flag} {value} names {len(files)} record file(s), all of them empty; convert data "
                         "with at least one case.")
    return DataSet(value, flag, tuple(files), tuple(folder_list), kind, tuple(summaries), label_maps[0])


def ct_shapes(data: DataSet, enough: int = 2) -> list[tuple[int, ...]]:
    """The (D, H, W) shapes of a CT data set's volumes, up to `enough` different ones.

    The recorded `--shape` answers without reading; otherwise the shape field of
    each record is read (the voxels are skipped), stopping at `enough` shapes.
    """
    import tensorflow as tf

    recorded = (data.preprocessing or {}).get("shape")
    if recorded:
        return [tuple(int(s) for s in recorded)]
    features = {tfrecord_schema.IMAGE_SHAPE: tf.io.FixedLenFeature([3], tf.int64)}
    records = tf.data.TFRecordDataset(list(data.files), compression_type=compression(list(data.files)))
    shapes: list[tuple[int, ...]] = []
    for shape in records.map(lambda s: tf.io.parse_single_example(s, features)[tfrecord_schema.IMAGE_SHAPE]):
        shape = tuple(int(s) for s in shape.numpy())
        if shape not in shapes:
            shapes.append(shape)
            if len(shapes) >= enough:
                break
    return shapes
