"""The TFRecord schema of detection data: one image with its boxes per `tf.train.Example`.

Records use the TF Object Detection API keys (`image/encoded`,
`image/object/bbox/ymin` ..., `image/object/class/label`, `image/object/is_crowd`,
`image/object/difficult`) so existing tools read them. Writing needs no
TensorFlow (`example_proto`); the parser, used inside `tf.data`, imports it
when first called. CT volumes and video clips are `tfrecord_schema`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from preprocessing.records import example_proto

_bytes, _floats, _ints = example_proto.BytesValues, example_proto.FloatValues, example_proto.IntValues


@dataclasses.dataclass(frozen=True)
class DetectionRecord:
    """One image with its boxes (TF Object Detection API layout).

    Boxes are normalized to [0, 1] as (ymin, xmin, ymax, xmax), one row per box.
    """

    source_id: str
    filename: str
    encoded: bytes  # the image file's bytes, as stored (JPEG or PNG)
    image_format: str  # "jpeg" or "png"
    height: int
    width: int
    boxes: np.ndarray  # (N, 4) float32 ymin, xmin, ymax, xmax in [0, 1]
    labels: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    crowd: tuple[int, ...] = ()  # per box, 1: a COCO crowd region (`iscrowd`); () : none is
    difficult: tuple[int, ...] = ()  # per box, 1: a Pascal VOC difficult object; (): none is


def encode_detection_example(record: DetectionRecord) -> bytes:
    """Serializes a `DetectionRecord` with the TF Object Detection API keys."""
    boxes = np.asarray(record.boxes, np.float32).reshape(-1, 4)  # (N, 4)
    features = {
        "image/encoded": _bytes(record.encoded),
        "image/format": _bytes(record.image_format.encode()),
        "image/height": _ints([record.height]),
        "image/width": _ints([record.width]),
        "image/filename": _bytes(record.filename.encode()),
        "image/source_id": _bytes(record.source_id.encode()),
        "image/object/bbox/ymin": _floats(boxes[:, 0]),
        "image/object/bbox/xmin": _floats(boxes[:, 1]),
        "image/object/bbox/ymax": _floats(boxes[:, 2]),
        "image/object/bbox/xmax": _floats(boxes[:, 3]),
        "image/object/class/label": _ints(record.labels),
        "image/object/class/text": _bytes([t.encode() for t in record.texts]),
        "image/object/is_crowd": _ints(record.crowd or (0,) * len(boxes)),
        "image/object/difficult": _ints(record.difficult or (0,) * len(boxes)),
    }
    return example_proto.serialize_example(features)


@functools.cache
def _detection_features() -> dict:
    import tensorflow as tf

    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/source_id": tf.io.FixedLenFeature([], tf.string),
        "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
        "image/object/class/label": tf.io.VarLenFeature(tf.int64),
        "image/object/class/text": tf.io.VarLenFeature(tf.string),
        "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
        "image/object/difficult": tf.io.VarLenFeature(tf.int64),
    }


def parse_detection_example(serialized) -> dict:
    """Parses one detection example with TensorFlow ops.

    Returns:
        `image` (H, W, 3) uint8, `boxes` (N, 4) float32 normalized (ymin, xmin,
        ymax, xmax), `labels` (N,) int32, `texts` (N,), `ignore` (N,) bool (a
        COCO crowd region or a VOC difficult object: not trained on, and ignored
        by the evaluation, as COCO and VOC evaluate; records without the flags:
        none), `source_id`, `height`, `width`.
    """
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, _detection_features())
    image = tf.io.decode_image(parsed["image/encoded"], channels=3, expand_animations=False)  # (H, W, 3)
    dense = {k: tf.sparse.to_dense(v) for k, v in parsed.items() if isinstance(v, tf.sparse.SparseTensor)}
    boxes = tf.stack([dense[f"image/object/bbox/{k}"] for k in ("ymin", "xmin", "ymax", "xmax")], axis=-1)  # (N, 4)
    count = tf.shape(boxes)[0]

    def flag(key):  # absent (records written before the flags, other tools' records): no box is flagged
        values = dense[key] > 0
        return tf.cond(tf.shape(values)[0] == count, lambda: values, lambda: tf.zeros([count], tf.bool))

    return {
        "image": image,
        "boxes": boxes,
        "ignore": tf.logical_or(flag("image/object/is_crowd"), flag("image/object/difficult")),
        "labels": tf.cast(dense["image/object/class/label"], tf.int32),
        "texts": dense["image/object/class/text"],
        "source_id": parsed["image/source_id"],
        "height": parsed["image/height"],
        "width": parsed["image/width"],
    }
