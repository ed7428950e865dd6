"""A CT record's depth slabs read straight into arrays: the whole volume, or only a depth range of it.

`tfrecord_schema` writes each volume as depth slabs (int16 image, uint8 label,
a CRC-32 per slab); `example_layout` finds where they lie in a record without
reading them; this module reads the slabs a depth range needs, with one read
for the image and one for the label (the few header bytes between slabs go to
a scratch buffer), into the caller's arrays, and checks each slab read whole.

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from preprocessing.records import tfrecord_files, tfrecord_schema
    >>> volume = np.linspace(0, 1, 8 * 4 * 4, dtype=np.float32).reshape(8, 4, 4)
    >>> record = tfrecord_schema.CtRecord("case", "case.nii", volume, (volume > 0.5).astype(np.uint8))
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> tfrecord_files.write_records(path, [tfrecord_schema.encode_ct_example(record)])
    >>> records = tfrecord_files.RecordFile(path)
    >>> layout = read_layout(records, 0)
    >>> layout.shape, layout.slab_depth
    ((8, 4, 4), 1)
    >>> image, label = np.empty((2, 4, 4), np.int16), np.empty((2, 4, 4), np.uint8)
    >>> read_depths(records, 0, layout, 4, 6, image, label)
    >>> bool(np.allclose(tfrecord_schema.dequantize(image, layout.scale), volume[4:6], atol=2e-5))
    True
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from preprocessing.records import example_layout, tfrecord_files, tfrecord_schema as schema


STORED_TYPES = {"int16": np.dtype("<i2"), "uint8": np.dtype(np.uint8)}  # `image/dtype`: CT int16, video uint8


@dataclasses.dataclass(frozen=True)
class CtLayout:
    """Where one CT record's slabs lie, and what a reader needs to know of it before reading them."""

    case_id: str
    shape: tuple[int, int, int]  # (D, H, W)
    slab_depth: int
    scale: float  # voxel value = stored int16 × scale
    image_slabs: tuple[example_layout.BytesValue, ...]
    label_slabs: tuple[example_layout.BytesValue, ...]
    image_crcs: tuple[int, ...]
    label_crcs: tuple[int, ...]
    channels: int = 1  # video clips: 3 (RGB), stored as uint8
    stored: np.dtype = STORED_TYPES["int16"]
    kind: str = schema.CT_RECORDS  # or schema.VIDEO_RECORDS: the first axis is time

    @property
    def voxel_bytes(self) -> int:
        """Bytes of one voxel as read: its image values (every channel) and its uint8 label."""
        return self.stored.itemsize * self.channels + 1

    @property
    def image_shape(self) -> tuple[int, ...]:
        """(D, H, W, C) of the image as read (a video clip: (T, H, W, 3))."""
        return (*self.shape, self.channels)

    def share_bytes(self, depth: int) -> int:
        """Bytes of `depth` depth voxels of this record, image (every channel) and label (uint8)."""
        return depth * self.shape[1] * self.shape[2] * self.voxel_bytes


def read_layout(records: tfrecord_files.RecordFile, number: int) -> CtLayout:
    """The layout of record `number` of `records`.

    Raises:
        tfrecord_files.RecordFileDamaged: the record is not a CT record of this format (an earlier fullres's,
            or damaged), naming the file and the fix.
    """
    try:
        features = example_layout.layout(lambda offset, length: records.read(number, offset, length),
                                         int(records.lengths[number]))
    except example_layout.ExampleDamaged as error:
        raise tfrecord_files.RecordFileDamaged(
            f"{records.path}: record {number + 1} is not a tf.train.Example ({error}); convert the scans again "
            "with fullres preprocess ct.") from None
    if schema.record_kind(features) not in (schema.CT_RECORDS, schema.VIDEO_RECORDS):
        raise tfrecord_files.RecordFileDamaged(
            f"{records.path}: record {number + 1} is not a CT record of this fullres "
            f"({schema.record_kind(features) or 'keys ' + ', '.join(sorted(features)[:4])}); convert the scans "
            "again with fullres preprocess ct.")
    shape = tuple(int(s) for s in features[schema.IMAGE_SHAPE])
    case = features[schema.CASE_ID][0].data.decode()
    channels = int(features[schema.IMAGE_CHANNELS][0]) if schema.IMAGE_CHANNELS in features else 1
    stored = features[schema.IMAGE_DTYPE][0].data.decode() if schema.IMAGE_DTYPE in features else "int16"
    if stored not in STORED_TYPES:
        raise tfrecord_files.RecordFileDamaged(
            f"{records.path}: record {number + 1} (case {case}) stores its image as {stored}, which this fullres does "
            f"not read ({', '.join(STORED_TYPES)}); convert the data again with this fullres.")
    layout = CtLayout(case, shape, int(features[schema.IMAGE_SLAB_DEPTH][0]), float(features[schema.IMAGE_SCALE][0]),
                      tuple(features[schema.IMAGE_SLABS]), tuple(features[schema.LABEL_SLABS]),
                      tuple(int(c) for c in features[schema.IMAGE_SLAB_CRC]),
                      tuple(int(c) for c in features[schema.LABEL_SLAB_CRC]), channels, STORED_TYPES[stored],
                      schema.record_kind(features))
    slabs = -(-shape[0] // layout.slab_depth)
    plane = shape[1] * shape[2]
    expected = [(min(layout.slab_depth, shape[0] - k * layout.slab_depth) * plane) for k in range(slabs)]
    if ([v.length for v in layout.image_slabs] != [layout.stored.itemsize * channels * n for n in expected]
            or [v.length for v in layout.label_slabs] != expected
            or len(layout.image_crcs) != slabs or len(layout.label_crcs) != slabs):
        raise tfrecord_files.RecordFileDamaged(
            f"{records.path}: record {number + 1} (case {case}) has slabs that do not make its {shape} volume; "
            "convert the scans again with fullres preprocess ct.")
    return layout


def _read_slabs(records, number: int, slabs, crcs, first: int, views: list, what: str, case: str) -> None:
    """Reads slabs first, first + 1, ... into `views` (one writable byte view each) with one read, and checks them."""
    buffers = []
    for index, view in enumerate(views):
        if index:
            gap = slabs[first + index].offset - (slabs[first + index - 1].offset + slabs[first + index - 1].length)
            buffers.append(memoryview(bytearray(gap)))  # the next value's tag and length
        buffers.append(view)
    records.read_into(number, slabs[first].offset, buffers)
    for index, view in enumerate(views):
        if zlib.crc32(view) != crcs[first + index]:
            raise tfrecord_files.RecordFileDamaged(
                f"{records.path}: record {number + 1} (case {case}) has a damaged {what} slab {first + index + 1} "
                "(its bytes do not match their CRC); copy the data set again, or convert the scans again.")


def read_depths(records: tfrecord_files.RecordFile, number: int, layout: CtLayout, start: int, stop: int,
                image: np.ndarray, label: np.ndarray) -> None:
    """Reads depths [start, stop) of record `number` into `image` (stop - start, H, W) int16 and `label` uint8
    (a record of several channels, a video clip: `image` (stop - start, H, W, C) of `layout.stored`).

    Only the slabs that hold those depths are read; a slab the range cuts is
    read into a scratch array (and checked whole) and the part needed copied.
    """
    depth = layout.slab_depth
    first, last = start // depth, -(-stop // depth)  # slabs [first, last)
    for stored, out, slabs, crcs, what in ((layout.stored, image, layout.image_slabs, layout.image_crcs, "image"),
                                           (np.uint8, label, layout.label_slabs, layout.label_crcs, "label")):
        views, partial = [], []
        for slab in range(first, last):
            low, high = slab * depth, min((slab + 1) * depth, layout.shape[0])
            if start <= low and high <= stop:
                views.append(memoryview(out[low - start:high - start]).cast("B"))
            else:  # cut by the range: read whole into scratch, copy the part
                scratch = np.empty((high - low, *out.shape[1:]), stored)
                views.append(memoryview(scratch).cast("B"))
                partial.append((scratch, low, high))
        _read_slabs(records, number, slabs, crcs, first, views, what, layout.case_id)
        for scratch, low, high in partial:
            a, b = max(start, low), min(stop, high)
            out[a - start:b - start] = scratch[a - low:b - low]
