"""Detection reads its records in the order of their image ids, not of its shards, as CT
reads case ids (test_record_order.py): Beam puts each record in a shard of its own choosing, so two preprocessings
of the same images gave two runs of one seed different orders. The same six images written as two shardings read
in one order, with and without the seeded shuffle."""

import io
import os

import numpy as np
from PIL import Image

from preprocessing.records import detection_schema
from trainer.data import detection_input


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _sharded(folder, shards: list[list[int]]) -> str:
    """Images `image-{id}` written to one file per list of ids, in that order."""
    import tensorflow as tf

    os.makedirs(folder)
    for number, ids in enumerate(shards):
        with tf.io.TFRecordWriter(str(folder / f"data-{number:05d}-of-{len(shards):05d}.tfrecord")) as writer:
            for image_id in ids:
                writer.write(detection_schema.encode_detection_example(detection_schema.DetectionRecord(
                    source_id=f"image-{image_id}", filename=f"{image_id}.png", encoded=_png(image_id),
                    image_format="png", height=8, width=8, boxes=np.array([[0.1, 0.1, 0.6, 0.6]], np.float32),
                    labels=(1,), texts=("thing",))))
    return str(folder / "data-*")


def _ids(pattern: str, **order) -> list[str]:
    stream = detection_input.record_stream(pattern, **order).take(6)
    return [detection_schema.parse_detection_example(record)["source_id"].numpy().decode() for record in stream]


def test_two_shardings_of_the_same_images_are_read_in_one_order(tmp_path):
    one = _sharded(tmp_path / "one", [[4, 1, 5], [0, 3, 2]])
    other = _sharded(tmp_path / "other", [[2, 0], [5, 3], [1, 4]])
    assert _ids(one) == _ids(other) == [f"image-{i}" for i in range(6)]
    shuffled = _ids(one, shuffle=True, seed=3)
    assert shuffled == _ids(other, shuffle=True, seed=3) and sorted(shuffled) == [f"image-{i}" for i in range(6)]
