"""One video into clips: decode (file or frame folder), fit to --size, pair its masks, cut T-frame clips.

Clips start at frames 0, S, 2S, ... (`--clip-stride S`) while T frames
remain (`--clip-length T`); each records its source frames (their places in
the video, and their own names: a frame folder's file names, `00005` in
YouTube-VOS), and the video's frame rate. A frame folder has no frame rate of
its own: `folder_fps` (DAVIS is 24 frames per second) is recorded.

A whole video is decoded, at the clip size, before it is cut: `max_decoded_bytes`
bounds it (4 bytes a clip pixel: RGB and the mask). A `--size` whose one clip
would not fit is refused before anything runs; a video too long to fit is a
dead letter (`too_large`) before its frames are decoded, where its length is
known (a frame folder, a file whose index lists its frames), else as soon as
the decoded frames reach the bound.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from common import dead_letters, sizes
from preprocessing.records import video_clips as clip_records
from preprocessing.video import frames as frames_lib, mask_frames, video_discovery, video_files


DEFAULT_MAX_DECODED_BYTES = 3 * 2**30  # as CT's


@dataclasses.dataclass(frozen=True)
class VideoPreprocessConfig:
    """How `fullres preprocess video` cuts and sizes clips.

    Example:
        >>> VideoPreprocessConfig(clip_length=8, size=(64, 64)).clip_stride
        8
    """

    clip_length: int = 16
    clip_stride: int | None = None  # None: clip_length (clips side by side)
    size: tuple[int, int] = (128, 128)  # (H, W) of every clip frame
    fit: str = "crop"  # `frames.FITS`
    folder_fps: float = 24.0  # recorded for frame folders, which state none (DAVIS: 24)
    max_label: int = 255
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES  # one whole video at the clip size, frames and masks

    def __post_init__(self):
        if self.clip_stride is None:
            object.__setattr__(self, "clip_stride", self.clip_length)
        if self.clip_length < 1 or self.clip_stride < 1:
            raise ValueError(f"--clip-length {self.clip_length} and --clip-stride {self.clip_stride} must be 1 or "
                             "more, e.g. --clip-length 16 --clip-stride 8.")
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"--size {','.join(map(str, self.size))} must be two positive sizes H,W, e.g. --size 128,128.")
        if self.fit not in frames_lib.FITS:
            raise ValueError(f"--fit {self.fit!r} is not known; use one of {', '.join(frames_lib.FITS)}.")
        if not 0 < self.folder_fps < math.inf:  # nan too
            raise ValueError(f"--folder-fps {self.folder_fps} must be a positive, finite frame rate, e.g. 24.")
        if self.max_decoded_bytes < 1:
            raise ValueError(f"--max-decoded-bytes must be positive, e.g. 3GiB, got {self.max_decoded_bytes}.")
        clip = self.clip_length * self.frame_bytes
        if clip > self.max_decoded_bytes:
            height, width = self.size
            raise ValueError(
                f"--size {height},{width} with --clip-length {self.clip_length} makes clips of {sizes.human_bytes(clip)} "
                f"decoded ({self.clip_length} frames × {height} × {width} pixels × 4 bytes: RGB and mask), over "
                f"--max-decoded-bytes {sizes.human_bytes(self.max_decoded_bytes)}; choose a smaller --size (e.g. "
                "128,128) or --clip-length, or raise --max-decoded-bytes if the workers have that memory to spare.")

    @property
    def frame_bytes(self) -> int:
        """Bytes one decoded frame takes at the clip size, with its mask: H × W × (3 + 1)."""
        return self.size[0] * self.size[1] * 4

    def check_length(self, frames: int, known: bool = True) -> None:
        """Refuses a video of `frames` frames (`known`: counted before decoding; else: decoded so far) that would
        not fit `max_decoded_bytes` at the clip size.

        Raises:
            dead_letters.CaseError: `too_large`.
        """
        if frames * self.frame_bytes <= self.max_decoded_bytes:
            return
        count = f"{frames} frames" if known else f"more than {frames - 1} frames"
        raise dead_letters.CaseError("read", "too_large", (
            f"it has {count}, which at --size {self.size[0]},{self.size[1]} take more than "
            f"{sizes.human_bytes(self.max_decoded_bytes)} decoded (--max-decoded-bytes); cut it into shorter videos "
            "(e.g. ffmpeg -i IN -t 60 OUT.mp4), choose a smaller --size, or raise --max-decoded-bytes"))


def preprocessing_record(config: VideoPreprocessConfig) -> dict:
    """summary.json's `preprocessing`: what predict repeats on new videos, and what data sets must agree in."""
    return {"kind": "video", "clip_length": config.clip_length, "clip_stride": config.clip_stride,
            "size": list(config.size), "fit": config.fit, "shape": [config.clip_length, *config.size]}


def _decode_folder(source: video_discovery.VideoSource, config: VideoPreprocessConfig) -> video_files.Decoded:
    config.check_length(len(source.frames))
    frames, size, box = [], None, None
    for path in source.frames:
        rgb = frames_lib.read_frame(path)  # (H, W, 3), upright
        if size is None:
            size, box = rgb.shape[:2], frames_lib.crop_box(rgb.shape[:2], config.size, config.fit)
        elif rgb.shape[:2] != size:
            raise dead_letters.CaseError("read", "frame_size_changes", (
                f"frame {path.rsplit('/', 1)[-1]} is {rgb.shape[1]}×{rgb.shape[0]} but the first is {size[1]}×{size[0]}; "
                "give every frame of a video one size"))
        frames.append(frames_lib.fit_frame(rgb, config.size, box))
    return video_files.Decoded(np.stack(frames), config.folder_fps, tuple(size), box)


def decode(source: video_discovery.VideoSource, config: VideoPreprocessConfig) -> video_files.Decoded:
    """Every frame of a video file or frame folder, fitted to `config.size` (`fullres predict` decodes so too).

    Raises:
        dead_letters.CaseError: the video cannot be used (`video_files`; its `problem`, found when it was listed:
            an empty folder, frames that cannot be ordered or one missing; `too_large`).
    """
    source.check_frames()
    if source.frame_folder:
        return _decode_folder(source, config)
    return video_files.decode(source.path, functools.partial(frames_lib.crop_box, size=config.size, fit=config.fit),
                              lambda frame, box: frames_lib.fit_frame(frame, config.size, box), config.check_length)


def source_frames(source: video_discovery.VideoSource):
    """The source's frames as they are, (H, W, 3) uint8 one at a time (for predict's overlay video)."""
    if source.frame_folder:
        for path in source.frames:
            yield frames_lib.read_frame(path)
        return
    import av

    with av.open(source.path) as container:
        for frame in container.decode(container.streams.video[0]):
            yield frame.to_ndarray(format="rgb24")


def config_of(record: dict) -> VideoPreprocessConfig:
    """The config a summary's `preprocessing` (`preprocessing_record`) was written from."""
    return VideoPreprocessConfig(clip_length=int(record["clip_length"]), clip_stride=int(record["clip_stride"]),
                                 size=tuple(int(s) for s in record["size"]), fit=record["fit"])


def _shorter_clips(count: int) -> str:
    """What clip length a video of `count` frames takes, in words: leaving --clip-length out only where the
    default is short enough.

    >>> _shorter_clips(1), _shorter_clips(20)
    ('pass --clip-length 1', 'pass --clip-length 20 or less, or leave it out (16 frames)')
    """
    default = VideoPreprocessConfig.clip_length
    if count == 1:
        return "pass --clip-length 1"
    return f"pass --clip-length {count} or less" + (f", or leave it out ({default} frames)" if count >= default else "")


def video_to_clips(source: video_discovery.VideoSource, config: VideoPreprocessConfig) -> list[clip_records.VideoClip]:
    """The clips of one video (see the module docstring).

    Raises:
        dead_letters.CaseError: the video or its masks cannot be used (`video_files`, `mask_frames`), or it has
            fewer frames than one clip.
    """
    source.check_frames()
    if source.masks or source.mask_problem:
        source.check_masks()  # what its masks' names tell, before decoding anything
    if source.frame_folder and source.masks:
        mask_frames.pair_names(list(source.frames), list(source.masks))
    decoded = decode(source, config)
    source.check_masks()  # none in a labelled data set: after decoding, so that a broken video is named as such
    count = len(decoded.frames)
    if source.masks:
        if not source.frame_folder:
            mask_frames.count_masks(count, list(source.masks))
        masks = mask_frames.read_masks(list(source.masks), decoded.source_size,
                                       functools.partial(frames_lib.fit_mask, size=config.size, box=decoded.crop_box),
                                       config.max_label)
    else:
        masks = np.zeros(decoded.frames.shape[:3], np.uint8)
    if count < config.clip_length:
        raise dead_letters.CaseError("clips", "too_few_frames", (
            f"it has {count} frame{'s' if count > 1 else ''}, fewer than one clip of --clip-length "
            f"{config.clip_length}; {_shorter_clips(count)}"))
    names = source.names(count)
    clips = []
    for start in range(0, count - config.clip_length + 1, config.clip_stride):
        stop = start + config.clip_length
        label = masks[start:stop]
        values = tuple(int(v) for v in np.unique(label)) if source.masks else ()
        clips.append(clip_records.VideoClip(
            f"{source.video_id}@{start:05d}", source.relative, decoded.frames[start:stop], label, decoded.fps,
            tuple(range(start, stop)), count, tuple(decoded.source_size), tuple(decoded.crop_box), values,
            names[start:stop]))
    return clips
