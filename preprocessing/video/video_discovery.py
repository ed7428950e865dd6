"""What `fullres preprocess video --input` names: video files, or frame folders in the DAVIS / YouTube-VOS layout.

Layouts:
- **frame folders**: a folder holding `JPEGImages/` (DAVIS 2017 adds a resolution level, `JPEGImages/480p/`):
  `JPEGImages/<video>/00000.jpg, ...` with masks `Annotations/<video>/00000.png, ...` (or under `--labels`).
- **video files** (`video_files.VIDEO_SUFFIXES`), a file or every one under a folder; a video's masks are
  the PNG folder named like it, beside it (`cat.mp4` + `cat/00000.png`) or under `--labels` at the same
  relative place (`LABELS/cat/00000.png`). A video without such a folder is unlabelled (all background).
"""

from __future__ import annotations

import dataclasses
import os

from preprocessing.video import mask_frames, video_files

FRAME_SUFFIXES = (".jpg", ".jpeg", ".png")
FRAMES_FOLDER, MASKS_FOLDER = "JPEGImages", "Annotations"


@dataclasses.dataclass(frozen=True)
class VideoSource:
    """One video to convert: a file, or a folder of frames; and its masks, if any."""

    video_id: str  # the path relative to the input, without suffix: `cat`, `480p/bear`
    path: str  # the video file, or the frame folder
    frames: tuple[str, ...] = ()  # a frame folder's images, in order; () for a video file
    masks: tuple[str, ...] = ()  # the PNG masks, in order; () unlabelled
    mask_folder: str | None = None  # where the masks are (named in messages)

    @property
    def relative(self) -> str:
        """The source as outputs name it: relative to the input, never an absolute path."""
        return self.video_id + (os.path.splitext(self.path)[1] if not self.frames else "/")


def _frame_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.lower().endswith(FRAME_SUFFIXES))


def discover(input_path: str, labels: str | None = None) -> tuple[list[VideoSource], str]:
    """The videos under `input_path` and the layout's name (`frame folders` or `video files`).

    Raises:
        FileNotFoundError: `input_path` does not exist.
    """
    if not os.path.exists(input_path):
        raise FileNotFoundError(f"--input {input_path!r} does not exist.")
    if os.path.isdir(os.path.join(input_path, FRAMES_FOLDER)):
        return _frame_folders(input_path, labels), "frame folders (DAVIS / YouTube-VOS)"
    if os.path.isfile(input_path):
        root, files = os.path.dirname(input_path), [input_path]
    else:
        root = input_path
        files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(input_path) for name in names
                       if name.lower().endswith(video_files.VIDEO_SUFFIXES))
    sources = []
    for path in files:
        video_id = os.path.splitext(os.path.relpath(path, root))[0]
        folder = os.path.join(labels or root, video_id)
        masks = tuple(mask_frames.mask_files(folder)) if os.path.isdir(folder) else ()
        sources.append(VideoSource(video_id, path, masks=masks, mask_folder=folder if masks else None))
    return sources, "video files"


def _frame_folders(root: str, labels: str | None) -> list[VideoSource]:
    frames_root = os.path.join(root, FRAMES_FOLDER)
    masks_root = labels or os.path.join(root, MASKS_FOLDER)
    sources = []
    for folder, _, names in sorted(os.walk(frames_root)):
        if not any(n.lower().endswith(FRAME_SUFFIXES) for n in names):
            continue
        video_id = os.path.relpath(folder, frames_root)
        mask_folder = os.path.join(masks_root, video_id)
        masks = tuple(mask_frames.mask_files(mask_folder)) if os.path.isdir(mask_folder) else ()
        sources.append(VideoSource(video_id, folder, tuple(_frame_files(folder)), masks,
                                   mask_folder if masks else None))
    return sources
