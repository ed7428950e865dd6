"""`tf.data` input of CT TFRecords (schema in `preprocessing.records.tfrecord_schema`).

TensorFlow only reads and parses here; it must never claim an accelerator that
JAX needs, so GPUs are hidden from it before the first dataset is built.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from preprocessing.records import dataset_files, tfrecord_schema


@functools.cache
def hide_accelerators_from_tensorflow() -> None:
    """Keeps TensorFlow on the CPU (once per process; later calls do nothing)."""
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


def count_examples(pattern: str) -> int:
    """Counts the records matching `pattern` (reads every file once)."""
    files = list_files(pattern)
    dataset = tf.data.TFRecordDataset(files, compression_type=dataset_files.compression(files))
    return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def record_stream(pattern: str, *, shuffle: bool = False, repeat: bool = False, seed: int = 0) -> tf.data.Dataset:
    """Serialized records of every file matching `pattern`, optionally shuffled (seeded) and repeated.

    With `shuffle` and `repeat`, epoch k is always the same permutation for a
    given `seed`, so a resumed run can skip back to exactly where it was.
    """
    hide_accelerators_from_tensorflow()
    files = list_files(pattern)
    dataset = tf.data.TFRecordDataset(files, compression_type=dataset_files.compression(files))
    if shuffle:
        dataset = dataset.shuffle(1024, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    return dataset


def rows_of_each_batch(positions: tf.Tensor, batch_size: int, rows: Sequence[int]) -> tf.Tensor:
    """True where a stream position falls on one of `rows` of its global batch of `batch_size`.

    A process of a multi-process run keeps only the records its own devices
    need and parses nothing else; the global batches stay those of one process.
    """
    return tf.reduce_any(tf.equal(positions % batch_size, tf.constant(list(rows), tf.int64)))


def ct_dataset(
    pattern: str,
    batch_size: int,
    *,
    shuffle: bool = False,
    repeat: bool = False,
    seed: int = 0,
    skip_examples: int = 0,
    drop_remainder: bool = False,
    rows: Sequence[int] | None = None,
) -> tf.data.Dataset:
    """Batches of `{"image": (B, D, H, W, 1) float32, "label": (B, D, H, W) int32, "case_id": (B,)}`.

    The order is a pure function of `seed`: with `shuffle` and `repeat`, epoch k
    is always the same permutation, so `skip_examples` (a multiple of
    `batch_size`) puts a resumed run back at exactly the record an
    uninterrupted run would read next. With `rows`, only those rows of every
    global batch of `batch_size` are read (B = len(rows)): one process's share.
    """
    dataset = record_stream(pattern, shuffle=shuffle, repeat=repeat, seed=seed)
    if skip_examples:
        dataset = dataset.skip(skip_examples)  # skipped before parsing: cheap
    if rows is not None:
        dataset = dataset.enumerate().filter(lambda position, _: rows_of_each_batch(position, batch_size, rows))
        dataset = dataset.map(lambda _, serialized: serialized)
        batch_size = len(rows)
    dataset = dataset.map(tfrecord_schema.parse_ct_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.map(lambda e: {"image": e["image"], "label": e["label"], "case_id": e["case_id"]})
    return dataset.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)
