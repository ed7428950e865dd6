"""CT and clip records as a data set: their files, each record's layout, and reading any depth range of one.

`CtRecords` indexes a data set's records in case-id order (not the shards' order, which Beam chooses anew each
preprocessing) and reads the depth slabs asked for, nothing else (`ct_slabs`). Images stay as stored (CT int16,
video clips uint8 RGB). Turning records into the batches training reads is `ct_batches`; the decoded cache beside
it is `decoded_cache`.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Iterator

import numpy as np

from preprocessing.records import ct_slabs, dataset_files, tfrecord_files, tfrecord_schema
from trainer.data import batches


@functools.cache
def hide_accelerators_from_tensorflow() -> None:
    """Keeps TensorFlow on the CPU (once per process; later calls do nothing)."""
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")


def list_files(pattern: str) -> list[str]:
    """The TFRecord files `pattern` names (local paths or gs://): a data set folder's shards, or the files a
    pattern matches (`dataset_files.record_files`; `data_set.resolve` checks them before training).

    Raises:
        FileNotFoundError: when nothing matches, naming the pattern.
    """
    files = dataset_files.record_files(pattern)
    if not files:
        raise FileNotFoundError(
            f"no TFRecord files match {pattern!r}; check the path, or create the data with `fullres demo` or "
            "`fullres preprocess ct`."
        )
    return files


class CtRecords:
    """A data set's CT records by number, in their case ids' order (not the shards': Beam shards each preprocessing
    differently); a record's layout (where its slabs lie) is checked when first needed."""

    def __init__(self, pattern: str, workers: int | None = None):
        self.pattern = pattern
        paths = list_files(pattern)
        with concurrent.futures.ThreadPoolExecutor(min(len(paths), workers or batches.usable_cores())) as pool:
            self.files = list(pool.map(tfrecord_files.RecordFile, paths))
        where = [(file, number) for file in self.files for number in range(len(file))]
        try:  # each layout is read once, here: its case id orders the records, and `layout` checks its shape
            layouts = [ct_slabs.read_layout(file, number) for file, number in where]
        except tfrecord_files.RecordFileDamaged:  # not CT records: the first read of one says so, where it did
            layouts = [None] * len(where)  # (sorted is stable: the shards' order)
        order = sorted(range(len(where)), key=lambda i: layouts[i].case_id if layouts[i] else "")
        self._where = [where[i] for i in order]
        self._layouts: list[ct_slabs.CtLayout | None] = [layouts[i] for i in order]
        self._checked = [False] * len(self._where)  # the shape check, made when a record's layout is first used
        self.compressed = any(file.compressed for file in self.files)

    def __len__(self) -> int:
        return len(self._where)

    def layout(self, index: int) -> ct_slabs.CtLayout:
        """Record `index`'s layout (read once); every record must have the first one's shape.

        Raises:
            ValueError: a record of another shape (the message names its file and case).
        """
        layout = self._layouts[index]
        if not self._checked[index]:
            file, number = self._where[index]
            if layout is None:
                layout = self._layouts[index] = ct_slabs.read_layout(file, number)
            self._checked[index] = True
            first = self.layout(0)
            if layout.image_shape != first.image_shape:
                raise ValueError(
                    f"{file.path}: case {layout.case_id} is {'x'.join(map(str, layout.shape))} voxels but the data set's "
                    f"first is {'x'.join(map(str, first.shape))}; preprocess with --shape D,H,W so that every volume "
                    "has one shape.")
        return layout

    @property
    def shape(self) -> tuple[int, int, int]:
        """(D, H, W) of every volume."""
        return self.layout(0).shape

    channels = property(lambda self: self.layout(0).channels, doc="Image channels: 1 (CT), 3 (video clips' RGB).")
    stored = property(lambda self: self.layout(0).stored, doc="The images' stored (and sent) type: CT int16, video uint8.")

    def read(self, index: int, start: int, stop: int, image: np.ndarray, label: np.ndarray) -> None:
        """Depths [start, stop) of record `index` into `image` (stop - start, H, W, C) as stored, `label` uint8."""
        file, number = self._where[index]
        ct_slabs.read_depths(file, number, self.layout(index), start, stop, image, label)

    def share_bytes(self, depth: int | None = None) -> int:
        """Bytes of `depth` depth voxels (default: all) of every record: what the cache of that share holds."""
        shape = self.shape
        return len(self) * self.layout(0).share_bytes(depth or shape[0])

    def close(self) -> None:
        for file in self.files:
            file.close()


def read_examples(pattern: str) -> Iterator[dict]:
    """Every record of `pattern`, whole and in order, as numpy: `{"case_id", "image" (D, H, W, C) float32,
    "label" (D, H, W) uint8}` (for looking at a data set; training reads through `CtBatches`).

    Raises:
        tfrecord_files.RecordFileDamaged: a damaged or cut-short file, or records of an earlier fullres.
    """
    records = CtRecords(pattern, workers=1)
    try:
        for index in range(len(records)):
            layout = records.layout(index)
            image, label = np.empty(layout.image_shape, layout.stored), np.empty(layout.shape, np.uint8)
            records.read(index, 0, layout.shape[0], image, label)
            yield {"case_id": layout.case_id, "image": tfrecord_schema.dequantize(image, layout.scale), "label": label}
    finally:
        records.close()


def count_examples(pattern: str) -> int:
    """The records matching `pattern` (indexes every file)."""
    records = CtRecords(pattern)
    count = len(records)
    records.close()
    return count
