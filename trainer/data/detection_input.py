"""`tf.data` input of detection TFRecords (TF Object Detection API keys) for RetinaNet.

Every image is scaled to fit a fixed canvas (H, W) — the partitioned step needs
one static shape — and placed in its top-left corner, padded with zeros. With
augmentation, the scale is jittered (a random factor on top of the fitting
scale, then a random crop or placement on the canvas) and the image is flipped
left-right half the time; boxes move with the image, are clipped to the canvas
and dropped when less than a quarter of them is left. An image keeps its first
`max_boxes` boxes; how many more it had is reported with it (`boxes_dropped`),
so the trainer can say so instead of dropping them without a word.
"""

from __future__ import annotations

import tensorflow as tf

from preprocessing.records import detection_schema, tfrecord_files
from trainer.data import ct_input


def _transform(example: dict, canvas: tuple[int, int], max_boxes: int, augment: bool, seed) -> dict:
    height, width = canvas
    image = tf.image.convert_image_dtype(example["image"], tf.float32)  # (h, w, 3) in [0, 1]
    source = tf.cast(tf.shape(image)[:2], tf.float32)
    boxes = example["boxes"] * tf.concat([source, source], axis=0)  # (N, 4) yxyx pixels of the source image
    classes = example["labels"] - 1  # 0-based; the TF OD API counts from 1
    ignore = tf.cast(example["ignore"], tf.int32)  # crowd regions and difficult objects
    scale = tf.minimum(height / source[0], width / source[1])
    if augment:
        seeds = tf.random.experimental.stateless_split(seed, 4)
        scale *= tf.random.stateless_uniform([], seeds[0], 0.8, 1.25)
    scaled = tf.cast(tf.round(source * scale), tf.int32)
    image = tf.image.resize(image, scaled)
    boxes *= scale
    offset = tf.zeros([2], tf.int32)
    if augment:
        # Crop where the scaled image is larger than the canvas, place it anywhere where smaller.
        room = tf.abs(scaled - [height, width])
        offset = tf.cast(tf.random.stateless_uniform([2], seeds[1], 0.0, 1.0) * tf.cast(room + 1, tf.float32), tf.int32)
        offset = tf.minimum(offset, room)
        offset = tf.where(scaled > [height, width], -offset, offset)  # negative: crop
    crop = tf.maximum(-offset, 0)
    place = tf.maximum(offset, 0)
    visible = tf.minimum(scaled - crop, [height, width] - place)
    image = image[crop[0]:crop[0] + visible[0], crop[1]:crop[1] + visible[1]]
    image = tf.pad(image, [[place[0], height - place[0] - visible[0]], [place[1], width - place[1] - visible[1]], [0, 0]])
    shift = tf.cast(tf.concat([offset, offset], axis=0), tf.float32)
    boxes += shift
    if augment:
        flip = tf.random.stateless_uniform([], seeds[2]) < 0.5
        image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
        boxes = tf.cond(flip, lambda: tf.stack([boxes[:, 0], width - boxes[:, 3], boxes[:, 2], width - boxes[:, 1]], 1),
                        lambda: boxes)
    clipped = tf.clip_by_value(boxes, 0.0, [height, width, height, width])
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept_area = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    keep = kept_area >= 0.25 * area
    boxes, classes, ignore = (tf.boolean_mask(clipped, keep), tf.boolean_mask(classes, keep),
                              tf.boolean_mask(ignore, keep))
    dropped = tf.maximum(tf.shape(classes)[0] - max_boxes, 0)  # boxes beyond max_boxes, left out below
    boxes, classes, ignore = boxes[:max_boxes], classes[:max_boxes], ignore[:max_boxes]
    count = tf.shape(classes)[0]
    boxes = tf.pad(boxes, [[0, max_boxes - count], [0, 0]])  # (M, 4)
    classes = tf.pad(classes, [[0, max_boxes - count]], constant_values=-1)  # (M,), -1 = no box
    ignore = tf.pad(ignore, [[0, max_boxes - count]])  # (M,), 1: a crowd region or difficult object
    image = tf.ensure_shape(image, [height, width, 3])
    return {"image": image, "boxes": tf.ensure_shape(boxes, [max_boxes, 4]),
            "classes": tf.ensure_shape(classes, [max_boxes]), "ignore": tf.ensure_shape(ignore, [max_boxes]),
            "source_id": example["source_id"], "boxes_dropped": dropped}


def _in_image_id_order(files: list[str]) -> tf.data.Dataset:
    """The serialized records of `files` in the order of their image ids (`image/source_id`), not of the shards: Beam
    assigns records to shards differently in each preprocessing, and two runs of the same data would otherwise train
    on different orders (CT records are read in case-id order likewise: `ct_input.CtRecords`). Finding the ids reads
    every record once at the start; equal ids keep the shards' order."""
    opened = [tfrecord_files.RecordFile(path) for path in files]
    where = []
    for file in opened:
        for number in range(len(file)):
            example = tf.train.Example.FromString(file.record(number))
            ids = example.features.feature["image/source_id"].bytes_list.value
            where.append((ids[0] if ids else b"", file, number))
    where.sort(key=lambda item: item[0])  # stable

    def records():
        for _, file, number in where:
            yield file.record(number)

    return tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.string))


def record_stream(pattern: str, *, shuffle: bool = False, repeat: bool = False, seed: int = 0) -> tf.data.Dataset:
    """Serialized records of every file matching `pattern`, optionally shuffled (seeded) and repeated.

    With `shuffle` and `repeat`, epoch k is always the same permutation for a
    given `seed`, so a resumed run can skip back to exactly where it was.
    """
    ct_input.hide_accelerators_from_tensorflow()
    dataset = _in_image_id_order(ct_input.list_files(pattern))
    if shuffle:  # TensorFlow's global seed too (the trainer seeds Python, NumPy and Keras only): the order is (seed, seed)
        tf.random.set_seed(seed)
        dataset = dataset.shuffle(1024, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    return dataset


def rows_of_each_batch(positions: tf.Tensor, batch_size: int, rows) -> tf.Tensor:
    """True where a stream position falls on one of `rows` of its global batch of `batch_size`.

    A process of a multi-process run keeps only the records its own devices
    need and parses nothing else; the global batches stay those of one process.
    """
    return tf.reduce_any(tf.equal(positions % batch_size, tf.constant(list(rows), tf.int64)))


def detection_dataset(
    pattern: str,
    batch_size: int,
    canvas: tuple[int, int],
    *,
    max_boxes: int = 100,
    augment: bool = False,
    shuffle: bool = False,
    repeat: bool = False,
    seed: int = 0,
    skip_examples: int = 0,
    drop_remainder: bool = False,
    rows=None,
) -> tf.data.Dataset:
    """Batches of `{"image": (B, H, W, 3) float32, "boxes": (B, M, 4) yxyx pixels, "classes": (B, M), "source_id",
    "boxes_dropped": (B,)}`; M is `max_boxes`, and `boxes_dropped` counts each image's boxes beyond it.

    Augmentation draws from (seed, position in the stream), so a resumed run
    that skips `skip_examples` sees exactly what an uninterrupted one would.
    With `rows`, only those rows of every global batch of `batch_size` are read
    and decoded (B = len(rows)): one process's share of a multi-process run.
    """
    dataset = record_stream(pattern, shuffle=shuffle, repeat=repeat, seed=seed)
    dataset = dataset.enumerate().skip(skip_examples)
    if rows is not None:
        dataset = dataset.filter(lambda index, _: rows_of_each_batch(index, batch_size, rows))
        batch_size = len(rows)
    dataset = dataset.map(
        lambda index, serialized: _transform(detection_schema.parse_detection_example(serialized), canvas, max_boxes,
                                             augment, tf.stack([tf.cast(seed, tf.int64), index])),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )
    return dataset.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)
