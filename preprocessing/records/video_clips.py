"""Video clips as records: CT's depth-slab layout with time as depth, uint8 RGB frames.

A clip is a volume whose first axis is time, so it is written with the keys of
a CT record (`tfrecord_schema`) and read by the same code (`ct_slabs`,
`trainer.data.ct_input`): a process reads only the frames its devices hold.
What differs:

| key                   | type       | meaning                                                            |
| --------------------- | ---------- | ------------------------------------------------------------------ |
| `image/slabs`         | bytes × S  | the clip in S slabs of `image/slab_depth` frames: uint8, C order, (frames, H, W, 3) each |
| `image/channels`      | int64      | 3 (RGB)                                                            |
| `image/dtype`         | bytes      | `uint8`                                                            |
| `image/scale`         | float      | 1/255: value in [0, 1] = stored × scale, as for CT                 |
| `image/shape`         | int64 × 3  | (T, H, W) of the clip                                              |
| `label/slabs`         | bytes × S  | uint8 class ids per frame, (frames, H, W) each                     |
| `video/fps`           | float      | the source's frame rate (frames per second)                        |
| `video/source_frames` | int64 × T  | the source frame each clip frame is (0 = the video's first)        |
| `video/frame_names`   | bytes × T  | each clip frame's own name: a frame folder's file stem (`00005`), a video file's frame number (`00012`) |
| `video/frame_count`   | int64      | frames in the whole source video                                   |
| `video/source_size`   | int64 × 2  | (H, W) of the source frames, before `--size`                       |
| `video/crop_box`      | float × 4  | (left, top, right, bottom) of the source frame that became the clip's frame |

Example:
    >>> import numpy as np
    >>> from preprocessing.records import example_layout, tfrecord_schema
    >>> clip = VideoClip("cat@00000", "cat.mp4", np.zeros((4, 8, 8, 3), np.uint8), np.zeros((4, 8, 8), np.uint8),
    ...                  fps=25.0, source_frames=(0, 1, 2, 3), frame_count=10, source_size=(16, 16))
    >>> data = encode_video_clip(clip)
    >>> keys = example_layout.layout(lambda offset, length: data[offset:offset + length], len(data))
    >>> tfrecord_schema.record_kind(keys) == tfrecord_schema.VIDEO_RECORDS
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from preprocessing.records import example_proto, tfrecord_schema as schema

FPS = "video/fps"
SOURCE_FRAMES = "video/source_frames"
FRAME_NAMES = "video/frame_names"
FRAME_COUNT = "video/frame_count"
SOURCE_SIZE = "video/source_size"
CROP_BOX = "video/crop_box"
RGB_SCALE = 1.0 / 255.0


@dataclasses.dataclass(frozen=True)
class VideoClip:
    """One clip of a video, ready to be serialized: T frames of uint8 RGB and their class-id masks."""

    case_id: str
    source_path: str
    image: np.ndarray  # (T, H, W, 3) uint8
    label: np.ndarray  # (T, H, W) uint8 class ids
    fps: float
    source_frames: tuple[int, ...]
    frame_count: int
    source_size: tuple[int, int]
    crop_box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    label_values: tuple[int, ...] = ()  # class ids in the clip's masks; () for a video without masks
    frame_names: tuple[str, ...] = ()  # each frame's own name (a frame folder's stems); (): its source frame, 00012

    def __post_init__(self):
        if self.image.ndim != 4 or self.image.shape[-1] != 3 or self.image.dtype != np.uint8:
            raise ValueError(f"VideoClip {self.case_id}: image must be (T, H, W, 3) uint8, got {self.image.shape} "
                             f"{self.image.dtype}.")
        if self.label.shape != self.image.shape[:-1]:
            raise ValueError(f"VideoClip {self.case_id}: label shape {self.label.shape} differs from the frames' "
                             f"{self.image.shape[:-1]}.")
        if len(self.source_frames) != len(self.image):
            raise ValueError(f"VideoClip {self.case_id}: {len(self.source_frames)} source frames for a clip of "
                             f"{len(self.image)} frames.")
        if not self.frame_names:
            object.__setattr__(self, "frame_names", tuple(f"{frame:05d}" for frame in self.source_frames))
        if len(self.frame_names) != len(self.image):
            raise ValueError(f"VideoClip {self.case_id}: {len(self.frame_names)} frame names for a clip of "
                             f"{len(self.image)} frames.")


def encode_video_clip(clip: VideoClip) -> bytes:
    """Serializes a `VideoClip` into a `tf.train.Example` byte string (see the module docstring)."""
    depth = schema.slab_depth(clip.image.shape[0])
    image_slabs, image_crcs = schema.slabs_of(np.ascontiguousarray(clip.image), depth)
    label_slabs, label_crcs = schema.slabs_of(np.ascontiguousarray(clip.label, np.uint8), depth)
    shape = clip.image.shape[:3]
    features = {
        schema.CASE_ID: example_proto.BytesValues(clip.case_id.encode()),
        schema.SOURCE_PATH: example_proto.BytesValues(clip.source_path.encode()),
        schema.IMAGE_SLABS: example_proto.BytesValues(image_slabs),
        schema.IMAGE_SCALE: example_proto.FloatValues([RGB_SCALE]),
        schema.IMAGE_SLAB_DEPTH: example_proto.IntValues([depth]),
        schema.IMAGE_SLAB_CRC: example_proto.IntValues(image_crcs),
        schema.IMAGE_SHAPE: example_proto.IntValues(shape),
        schema.IMAGE_ORIGINAL_SHAPE: example_proto.IntValues(shape),
        schema.IMAGE_CHANNELS: example_proto.IntValues([3]),
        schema.IMAGE_DTYPE: example_proto.BytesValues(b"uint8"),
        schema.LABEL_SLABS: example_proto.BytesValues(label_slabs),
        schema.LABEL_SLAB_CRC: example_proto.IntValues(label_crcs),
        schema.LABEL_VALUES: example_proto.IntValues(clip.label_values),
        FPS: example_proto.FloatValues([clip.fps]),
        SOURCE_FRAMES: example_proto.IntValues(clip.source_frames),
        FRAME_NAMES: example_proto.BytesValues([name.encode() for name in clip.frame_names]),
        FRAME_COUNT: example_proto.IntValues([clip.frame_count]),
        SOURCE_SIZE: example_proto.IntValues(clip.source_size),
        CROP_BOX: example_proto.FloatValues(clip.crop_box),
    }
    return example_proto.serialize_example(features)
