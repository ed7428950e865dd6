"""The TFRecord schema shared by preprocessing (writer) and the trainer (reader).

One `tf.train.Example` per CT case. Arrays are stored in array order
(depth, height, width) = (z, y, x); geometry is stored in ITK physical order
(x, y, z), exactly as SimpleITK reports it, so a case can be put back into
patient space.

| key                    | type          | meaning                                                  |
| ---------------------- | ------------- | -------------------------------------------------------- |
| `case_id`              | bytes         | case identifier, unique within a data set                |
| `source_path`          | bytes         | the image file or DICOM series folder, relative to the input root (a pseudonym under `--pseudonymize`) |
| `image/slabs`          | bytes × S     | the volume in S depth slabs of `image/slab_depth` voxels: little-endian int16, C order, (slab depth, H, W) each |
| `image/scale`          | float         | voxel value = stored int16 × scale (the largest magnitude maps to 32767) |
| `image/slab_depth`     | int64         | depth voxels per slab; S = D / slab depth                |
| `image/slab_crc32`     | int64 × S     | zlib CRC-32 of each image slab's bytes (a slab read alone is checked) |
| `image/shape`          | int64 × 3     | (D, H, W) of the stored volume                           |
| `image/original_shape` | int64 × 3     | (D, H, W) after resampling, before crop or pad           |
| `image/spacing`        | float × 3     | voxel spacing in mm, (x, y, z)                           |
| `image/origin`         | float × 3     | physical position of voxel (0, 0, 0) in mm, (x, y, z)    |
| `image/direction`      | float × 9     | direction cosines, row-major 3×3, ITK convention         |
| `image/window`         | float × 2     | `ct_window`: HU (low, high) mapped to [0, 1]; `zscore`: the (mean, std) used |
| `image/normalization`  | bytes         | `ct_window` (CT) or `zscore` (MR)                        |
| `label/slabs`          | bytes × S     | uint8 class ids in the same slabs, C order               |
| `label/slab_crc32`     | int64 × S     | zlib CRC-32 of each label slab                           |
| `label/values`         | int64 × K     | class ids present in the label map as read (none: no map) |
| `label/cropped_classes`| int64 × M     | classes of which the crop to `--shape` cut voxels        |
| `label/cropped_voxels` | int64 × M     | voxels of each of those classes cut (resampled grid)     |

Why slabs and int16. A process of a multi-process run reads only the depth
slabs its devices hold (`example_layout` finds them without reading the rest),
and int16 halves what is read, cached and sent to the accelerator, where the
training step turns it back into float32 (`dequantize`). The step is a
2^-15 fraction of the volume's largest magnitude: for a CT window mapped to
[0, 1], 3.1e-5, i.e. 0.06 HU of a 2000 HU window (error at most half that); for a
z-scored MR whose largest value is 20, 3e-4 standard deviations. S is the
largest power of two that divides D, at most 64 (D = 256: 64 slabs of 4), so
the depth share of 2, 4, ... 64 processes is whole slabs.

Records written before the slabs (one float32 `image/encoded`, `label/encoded`)
are refused by the trainer with the command that converts them again
(`OLD_CT_RECORDS`).

Detection records (images with boxes) are `detection_schema`; `record_kind`
tells the kinds apart by their keys.

Writing needs no TensorFlow (`example_proto`), so Beam workers start fast;
the parsers, used inside `tf.data`, import it when first called.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import numpy as np

from preprocessing.records import example_proto

CASE_ID = "case_id"
SOURCE_PATH = "source_path"
IMAGE_SLABS = "image/slabs"
IMAGE_SCALE = "image/scale"
IMAGE_SLAB_DEPTH = "image/slab_depth"
IMAGE_SLAB_CRC = "image/slab_crc32"
IMAGE_SHAPE = "image/shape"
IMAGE_ORIGINAL_SHAPE = "image/original_shape"
IMAGE_SPACING = "image/spacing"
IMAGE_ORIGIN = "image/origin"
IMAGE_DIRECTION = "image/direction"
IMAGE_WINDOW = "image/window"
IMAGE_NORMALIZATION = "image/normalization"
LABEL_SLABS = "label/slabs"
LABEL_SLAB_CRC = "label/slab_crc32"
LABEL_VALUES = "label/values"
LABEL_CROPPED_CLASSES = "label/cropped_classes"
LABEL_CROPPED_VOXELS = "label/cropped_voxels"
IMAGE_CHANNELS = "image/channels"  # absent: 1 (CT); video clips: 3 (RGB), `preprocessing.records.video_clips`
IMAGE_DTYPE = "image/dtype"  # absent: int16 (CT); video clips: uint8


@dataclasses.dataclass(frozen=True)
class CtRecord:
    """One preprocessed CT case, ready to be serialized.

    Example:
        >>> import numpy as np
        >>> record = CtRecord(
        ...     case_id="case0", source_path="/data/case0.nii.gz",
        ...     image=np.zeros((4, 8, 8), np.float32),
        ...     label=np.zeros((4, 8, 8), np.uint8))
        >>> parsed = parse_ct_example(encode_ct_example(record))
        >>> tuple(parsed["image"].shape)
        (4, 8, 8, 1)
    """

    case_id: str
    source_path: str
    image: np.ndarray  # (D, H, W) float32, scaled to [0, 1]
    label: np.ndarray  # (D, H, W) uint8 class ids
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0)
    direction: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
    original_shape: tuple[int, int, int] | None = None
    window: tuple[float, float] = (-1000.0, 1000.0)
    normalization: str = "ct_window"
    warnings: tuple[str, ...] = ()  # for the converter's log and summary; not serialized
    label_values: tuple[int, ...] = ()  # class ids in the label map as read; () without a label map
    cropped_voxels: tuple[tuple[int, int], ...] = ()  # (class, voxels cut by the crop), foreground classes only
    modality_seen: str = ""  # the scan's DICOM Modality, else CT / MR from its values; for summary.json, not serialized
    intensity_range: tuple[float, float] | None = None  # 1st and 99th percentile as read (HU for CT); not serialized

    def __post_init__(self):
        if self.image.ndim != 3:
            raise ValueError(f"CtRecord {self.case_id}: image must be 3-D (D, H, W), got shape {self.image.shape}.")
        if self.label.shape != self.image.shape:
            raise ValueError(
                f"CtRecord {self.case_id}: label shape {self.label.shape} differs from image shape {self.image.shape}."
            )
        if len(self.direction) != 9:
            raise ValueError(f"CtRecord {self.case_id}: direction needs 9 values, got {len(self.direction)}.")


_bytes, _floats, _ints = example_proto.BytesValues, example_proto.FloatValues, example_proto.IntValues


MAX_SLABS = 64
INT16_PEAK = 32767  # the stored value of the volume's largest magnitude


def slab_depth(depth: int) -> int:
    """Depth voxels per slab: D over the largest power of two that divides D, at most `MAX_SLABS` slabs.

    >>> slab_depth(256), slab_depth(96), slab_depth(75)
    (4, 3, 75)
    """
    slabs = 1
    while depth % (slabs * 2) == 0 and slabs * 2 <= min(MAX_SLABS, depth):
        slabs *= 2
    return depth // slabs


def quantize(image: np.ndarray) -> tuple[np.ndarray, float]:
    """(int16 voxels, scale) with voxel value = stored × scale; the largest magnitude is stored as ±32767.

    >>> stored, scale = quantize(np.array([0.0, 0.5, 1.0], np.float32))
    >>> stored.tolist(), float(np.max(np.abs(dequantize(stored, scale) - [0.0, 0.5, 1.0]))) < 2e-5
    ([0, 16384, 32767], True)
    """
    peak = float(np.max(np.abs(image))) if image.size else 0.0
    if not np.isfinite(peak):
        raise ValueError("the image holds NaN or infinite values, which int16 records cannot store.")
    scale = peak / INT16_PEAK if peak > 0 else 1.0
    return np.rint(image / np.float32(scale)).astype("<i2"), scale


def dequantize(stored: np.ndarray, scale) -> np.ndarray:
    """float32 voxel values of int16 `stored` (the training step does the same on the device)."""
    return stored.astype(np.float32) * np.float32(scale)


def slabs_of(volume: np.ndarray, depth: int) -> tuple[list[bytes], list[int]]:
    """The (depth, H, W) slabs of `volume` as bytes, and the zlib CRC-32 of each."""
    slabs = [np.ascontiguousarray(volume[start:start + depth]).tobytes() for start in range(0, len(volume), depth)]
    return slabs, [zlib.crc32(slab) for slab in slabs]


def encode_ct_example(record: CtRecord) -> bytes:
    """Serializes a `CtRecord` into a `tf.train.Example` byte string (int16 depth slabs; see the module docstring)."""
    try:
        image, scale = quantize(np.asarray(record.image, np.float32))
    except ValueError as error:
        raise ValueError(f"CtRecord {record.case_id}: {error}") from None
    label = np.asarray(record.label, dtype=np.uint8)
    original_shape = record.original_shape or image.shape
    depth = slab_depth(image.shape[0])
    image_slabs, image_crcs = slabs_of(image, depth)
    label_slabs, label_crcs = slabs_of(label, depth)
    features = {
        CASE_ID: _bytes(record.case_id.encode()),
        SOURCE_PATH: _bytes(record.source_path.encode()),
        IMAGE_SLABS: _bytes(image_slabs),
        IMAGE_SCALE: _floats([scale]),
        IMAGE_SLAB_DEPTH: _ints([depth]),
        IMAGE_SLAB_CRC: _ints(image_crcs),
        IMAGE_SHAPE: _ints(image.shape),
        IMAGE_ORIGINAL_SHAPE: _ints(original_shape),
        IMAGE_SPACING: _floats(record.spacing),
        IMAGE_ORIGIN: _floats(record.origin),
        IMAGE_DIRECTION: _floats(record.direction),
        IMAGE_WINDOW: _floats(record.window),
        IMAGE_NORMALIZATION: _bytes(record.normalization.encode()),
        LABEL_SLABS: _bytes(label_slabs),
        LABEL_SLAB_CRC: _ints(label_crcs),
        LABEL_VALUES: _ints(record.label_values),
        LABEL_CROPPED_CLASSES: _ints([c for c, _ in record.cropped_voxels]),
        LABEL_CROPPED_VOXELS: _ints([n for _, n in record.cropped_voxels]),
    }
    return example_proto.serialize_example(features)


@functools.cache
def _ct_features() -> dict:
    import tensorflow as tf

    return {
        CASE_ID: tf.io.FixedLenFeature([], tf.string),
        SOURCE_PATH: tf.io.FixedLenFeature([], tf.string),
        IMAGE_SLABS: tf.io.VarLenFeature(tf.string),
        IMAGE_SCALE: tf.io.FixedLenFeature([], tf.float32),
        IMAGE_SHAPE: tf.io.FixedLenFeature([3], tf.int64),
        IMAGE_ORIGINAL_SHAPE: tf.io.FixedLenFeature([3], tf.int64),
        IMAGE_SPACING: tf.io.FixedLenFeature([3], tf.float32),
        IMAGE_ORIGIN: tf.io.FixedLenFeature([3], tf.float32),
        IMAGE_DIRECTION: tf.io.FixedLenFeature([9], tf.float32),
        IMAGE_WINDOW: tf.io.FixedLenFeature([2], tf.float32),
        IMAGE_NORMALIZATION: tf.io.FixedLenFeature([], tf.string, default_value="ct_window"),
        LABEL_SLABS: tf.io.VarLenFeature(tf.string),
    }


def parse_ct_example(serialized) -> dict:
    """Parses one serialized CT example (a scalar string tensor) with TensorFlow ops, for `tf.data` pipelines.

    (fullres's trainer reads records with `trainer.data.ct_input`, which reads only the slabs a process needs.)

    Returns:
        A dict with `image` (D, H, W, 1) float32, `label` (D, H, W) int32 and the
        geometry fields as tensors; usable inside `tf.data.Dataset.map`.
    """
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, _ct_features())
    shape = tf.cast(parsed[IMAGE_SHAPE], tf.int32)
    image = tf.io.decode_raw(tf.sparse.to_dense(parsed[IMAGE_SLABS]), tf.int16, little_endian=True)  # (S, voxels)
    image = tf.cast(tf.reshape(image, tf.concat([shape, [1]], axis=0)), tf.float32) * parsed[IMAGE_SCALE]  # (D, H, W, 1)
    label = tf.io.decode_raw(tf.sparse.to_dense(parsed[LABEL_SLABS]), tf.uint8)  # (S, voxels)
    label = tf.cast(tf.reshape(label, shape), tf.int32)  # (D, H, W)
    return {
        "case_id": parsed[CASE_ID],
        "source_path": parsed[SOURCE_PATH],
        "image": image,
        "label": label,
        "spacing": parsed[IMAGE_SPACING],
        "origin": parsed[IMAGE_ORIGIN],
        "direction": parsed[IMAGE_DIRECTION],
        "original_shape": parsed[IMAGE_ORIGINAL_SHAPE],
        "window": parsed[IMAGE_WINDOW],
        "normalization": parsed[IMAGE_NORMALIZATION],
    }


CT_RECORDS, DETECTION_RECORDS = "CT volumes", "images with boxes"  # the kinds of records, as users read them
VIDEO_RECORDS = "video clips"  # CT's slab layout, time as depth, uint8 RGB (`preprocessing.records.video_clips`)
OLD_CT_RECORDS = "CT volumes of an earlier fullres (whole float32 volumes)"  # refused by the trainer


def record_kind(feature_keys) -> str | None:
    """Which kind of record holds these feature keys: `CT_RECORDS`, `DETECTION_RECORDS`, or None (neither).

    >>> record_kind({IMAGE_SHAPE, IMAGE_SLABS, LABEL_SLABS}) == CT_RECORDS
    True
    """
    keys = set(feature_keys)
    if IMAGE_SHAPE in keys and LABEL_SLABS in keys and "video/fps" in keys:
        return VIDEO_RECORDS
    if IMAGE_SHAPE in keys and LABEL_SLABS in keys:
        return CT_RECORDS
    if IMAGE_SHAPE in keys and "label/encoded" in keys:
        return OLD_CT_RECORDS
    if "image/object/bbox/ymin" in keys or "image/source_id" in keys:
        return DETECTION_RECORDS
    return None
