"""What a `--train` or `--eval` value names, checked before a run writes anything: one data set, or several that agree.

`resolve` finds the records (`dataset_files.record_files`: a folder, a pattern,
or several separated by commas) and refuses, in one sentence, what training
could not use: no records, a folder without the `summary.json` a finished
conversion writes last, a shard it lists but lacks, files that are not its
records, and data sets that differ in kind, preprocessing or label map.
`ct_shapes` reads the volumes' shapes (the recorded `--shape`, else each
record's shape field). Paths may be local or `gs://`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator

from preprocessing.records import dataset_files, example_layout, file_system, tfrecord_files, tfrecord_schema


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
        return os.path.join(self.folders[0], dataset_files.SUMMARY)


def _first_record_kind(files: list[str]) -> str | None:
    """The kind of the first record in `files` (`tfrecord_schema.record_kind`); None when they hold no record."""
    for path in files:
        try:
            record = tfrecord_files.first_record(path)
            if record is None:
                continue
            keys = example_layout.layout(lambda offset, length, data=record: data[offset:offset + length], len(record))
        except (tfrecord_files.RecordFileDamaged, example_layout.ExampleDamaged):  # not TFRecords of Examples
            raise ValueError(f"{path} is not a TFRecord file; name only the records a fullres conversion "
                             "wrote (its data-* files).") from None
        return tfrecord_schema.record_kind(keys) or "unknown"
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
    files = dataset_files.record_files(value)
    if not files:
        if file_system.isdir(value) and dataset_files.read_json(os.path.join(value, dataset_files.SUMMARY)) is not None:
            raise FileNotFoundError(f"{flag} {value} holds no records (its {dataset_files.SUMMARY} lists no shards: "
                                    "every case failed); see its dead_letter.jsonl, and convert the data again.")
        if file_system.isdir(value):
            raise FileNotFoundError(f"{flag} {value} is a folder without records or {dataset_files.SUMMARY}; pass the "
                                    "--output folder of fullres preprocess (or a pattern of its data-* records).")
        raise FileNotFoundError(f"no TFRecord files match {flag} {value!r}; pass a data set folder (the --output of "
                                "fullres preprocess) or a pattern of its records, e.g. 'data/ct/data-*'.")
    groups: dict[str, list[str]] = {}
    for path in files:
        groups.setdefault(os.path.dirname(path), []).append(path)
    summaries, kinds, label_maps = [], [], []
    for folder, paths in groups.items():
        summary = dataset_files.read_json(os.path.join(folder, dataset_files.SUMMARY))
        names = ", ".join(os.path.basename(p) for p in paths[:3]) + (", ..." if len(paths) > 3 else "")
        if summary is None:
            raise FileNotFoundError(
                f"{flag} {value} matches {len(paths)} file(s) in {folder} ({names}), but {folder} has no "
                f"{dataset_files.SUMMARY}, which a finished fullres conversion writes last; pass the --output folder "
                "of fullres preprocess ct or images, or convert the data again.")
        listed = set(summary.get("shards") or ())
        missing = sorted(listed - {name.rstrip("/") for name in file_system.listdir(folder)})
        if missing:  # a copy cut short: training on the rest would be silently partial
            raise FileNotFoundError(
                f"{flag} {value}: {os.path.join(folder, dataset_files.SUMMARY)} lists {missing[0]}"
                f"{f' and {len(missing) - 1} more shard(s)' if len(missing) > 1 else ''}, which {folder} lacks; copy "
                "the data set whole (every shard its summary lists), or convert it again.")
        strays = [os.path.basename(p) for p in paths if listed and os.path.basename(p) not in listed]
        if strays:
            raise ValueError(
                f"{flag} {value} matches {strays[0]} in {folder}, which is not one of the records its "
                f"{dataset_files.SUMMARY} lists ({', '.join(sorted(listed)[:2])}{', ...' if len(listed) > 2 else ''}); "
                f"pass the folder {folder} itself, or narrow the pattern to its records, e.g. {os.path.join(folder, 'data-*')!r}.")
        kind = _first_record_kind(paths)
        if kind == "unknown":
            raise ValueError(f"{flag} {value} matches {paths[0]}, which holds neither CT volumes nor images with "
                             "boxes; pass records written by fullres preprocess ct or images.")
        summaries.append(summary)
        kinds.append(kind)
        label_maps.append(dataset_files.read_label_map(folder))
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
            difference = (dataset_files.LABEL_MAP, json.dumps(label_maps[0]), json.dumps(label_maps[index]))
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
    recorded = (data.preprocessing or {}).get("shape")
    if recorded:
        return [tuple(int(s) for s in recorded)]
    shapes: list[tuple[int, ...]] = []
    with contextlib.closing(_headers(data)) as headers:
        for features in headers:
            shape = tuple(int(s) for s in features[tfrecord_schema.IMAGE_SHAPE])
            if shape not in shapes:
                shapes.append(shape)
                if len(shapes) >= enough:
                    break
    return shapes


def _headers(data: DataSet) -> Iterator[dict]:
    """Each record's header fields (`example_layout.layout`: the voxels are skipped, not read), file by file."""
    for path in data.files:
        records = tfrecord_files.RecordFile(path)
        try:
            for number, length in enumerate(records.lengths):
                yield example_layout.layout(
                    lambda offset, size, number=number, records=records: records.read(number, offset, size), int(length))
        finally:
            records.close()


def examples(data: DataSet) -> str | None:
    """Which examples a CT or video data set holds, in a few words: their count, first and last case id (clips:
    `video@start`) and the SHA-256 of every case id in order. Two data sets of other scans or videos differ here
    even where they were converted with the same settings; the same data moved or converted again do not (Beam's
    sharding aside: ids are sorted). None for other kinds (detection records carry no case ids).

    Each record's header is read (its id; no voxel), as training's input reads it at its start.
    """
    import hashlib

    if data.kind not in (tfrecord_schema.CT_RECORDS, tfrecord_schema.VIDEO_RECORDS):
        return None
    ids = sorted(features[tfrecord_schema.CASE_ID][0].data.decode() for features in _headers(data))
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]
    return f"{len(ids)} ({ids[0]} ... {ids[-1]}, ids sha256 {digest})" if ids else "0"


def fingerprint(value: str) -> dict:
    """What the preprocessing of the data set `value` names recorded (`resolve`): its record kind, `summary.json`'s
    `preprocessing` (spacing, orientation, window, modality, shape) and `label_map.json` (None where it has none);
    and which examples it holds (`examples`: other scans or videos with the same settings are other data). A run
    keeps its training data's (`run_record`), and held-out data are compared with it (`run_data.check_eval`)."""
    data = resolve(value)
    found = examples(data)
    recorded = {"kind": data.kind, "preprocessing": data.preprocessing, "label_map": data.label_map}
    return recorded if found is None else {**recorded, "examples": found}


def channels(value: str) -> int | None:
    """The input channels of the records `value` names (`resolve`): 3 for video clips (RGB frames), 1 for CT
    volumes; None for other records, or data `resolve` refuses (the trainer's data check then names why)."""
    try:
        kind = resolve(value).kind
    except (ValueError, FileNotFoundError):
        return None
    return {tfrecord_schema.VIDEO_RECORDS: 3, tfrecord_schema.CT_RECORDS: 1}.get(kind)
