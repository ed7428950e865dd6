"""Video files (MP4, AVI, MOV, MKV) decoded with PyAV, checked for the trouble real files bring.

Every frame is decoded (nothing is trusted from the header alone) and fitted
to the clip size as it arrives (`frames`), so a long 1080p video never sits in
memory at full size. What cannot be used becomes a `dead_letters.CaseError`
naming the fix:

| reason                | what                                                                     |
| --------------------- | ------------------------------------------------------------------------ |
| `empty_file`          | zero bytes                                                               |
| `undecodable`         | not a video container FFmpeg reads (or cut short before its index)       |
| `audio_only`          | audio streams, no video stream (`no_video_stream`: no stream at all)     |
| `cut_short`           | fewer frames decode than the container's index lists, or decoding stops  |
| `variable_frame_rate` | frame durations differ by more than `VFR_TOLERANCE` of the median        |
| `rotation_metadata`   | a display matrix that turns the frames (phone videos): masks would not line up |
| `frame_size_changes`  | frames of different sizes within one video                               |
| `odd_size`            | frames smaller than 2×2 pixels, or a mask of another size than its frame |
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from common import dead_letters

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm")
VFR_TOLERANCE = 0.1  # a frame lasting 10% more or less than the median one makes the rate variable
CONSTANT_RATE_FIX = "re-encode it at a constant rate, e.g. ffmpeg -i IN -vf fps=25 -fps_mode cfr OUT.mp4"


@dataclasses.dataclass(frozen=True)
class Decoded:
    """A whole video, fitted: its frames at the clip size, and what the source said of itself."""

    frames: np.ndarray  # (N, H, W, 3) uint8, at --size
    fps: float
    source_size: tuple[int, int]  # (H, W) of the source frames
    crop_box: tuple[float, float, float, float]


def _error(reason: str, detail: str, stage: str = "read") -> dead_letters.CaseError:
    return dead_letters.CaseError(stage, reason, detail)


def decode(path: str, fit: Callable[[tuple[int, int]], tuple[float, float, float, float]],
           fit_frame: Callable[[np.ndarray, tuple[float, float, float, float]], np.ndarray],
           check_length: Callable[..., None] = lambda frames, known=True: None) -> Decoded:
    """Decodes every frame of the video file `path`, each fitted by `fit_frame(frame, fit(source (H, W)))`.

    `check_length(frames, known)` may refuse the video by its length: with the index's count before decoding
    (`known`), and with the count decoded so far as frames arrive, so a long video stops before it fills memory.

    Raises:
        dead_letters.CaseError: see the module docstring.
    """
    import av

    if os.path.getsize(path) == 0:
        raise _error("empty_file", "the file is empty (0 bytes); copy it again from its source")
    try:
        container = av.open(path)
    except (av.error.FFmpegError, UnicodeDecodeError) as error:
        raise _error("undecodable", f"FFmpeg cannot read it as a video ({error}); the file is cut short before its "
                                    "index, damaged, or not a video: copy it again or re-encode it") from None
    with container:
        if not container.streams.video:
            if container.streams.audio:
                raise _error("audio_only", "it holds audio only, no video stream; pass the video it belongs to")
            raise _error("no_video_stream", "it holds no video stream; pass a video file")
        stream = container.streams.video[0]
        listed = int(stream.frames or 0)  # the container's index; 0 where it keeps none (AVI without one, MKV)
        check_length(listed)
        frames, times, size, box = [], [], None, None
        try:
            for frame in container.decode(stream):
                if frame.rotation:
                    raise _error("rotation_metadata", f"its frames are stored turned by {frame.rotation}° (a display "
                                 "matrix, as phones write), so masks drawn on the upright picture would not line up; "
                                 "re-encode it upright, e.g. ffmpeg -i IN OUT.mp4 (ffmpeg applies the rotation)")
                shape = (frame.height, frame.width)
                if min(shape) < 2:
                    raise _error("odd_size", f"its frames are {shape[1]}×{shape[0]} pixels; pass a real video")
                if size is None:
                    size, box = shape, fit(shape)
                elif shape != size:
                    raise _error("frame_size_changes", f"frame {len(frames)} is {shape[1]}×{shape[0]} but the first "
                                 f"is {size[1]}×{size[0]}; re-encode it at one size, e.g. ffmpeg -i IN -vf "
                                 f"scale={size[1]}:{size[0]} OUT.mp4")
                check_length(len(frames) + 1, False)
                frames.append(fit_frame(frame.to_ndarray(format="rgb24"), box))
                times.append(frame.time)
        except av.error.FFmpegError as error:
            raise _error("cut_short", f"decoding stopped after {len(frames)} frames ({error}); the file is cut short "
                         "or damaged: copy it again from its source") from None
        if not frames:
            raise _error("cut_short", "no frame decodes; the file is cut short or damaged: copy it again")
        if listed and len(frames) < listed:
            raise _error("cut_short", f"{len(frames)} frames decode but its index lists {listed}; the file is cut "
                         "short: copy it again from its source")
        fps = _constant_rate(times, stream)
    return Decoded(np.stack(frames), fps, size, box)


def _constant_rate(times: list, stream) -> float:
    """The stated frame rate (else the frames' own), checked constant from the frames' times (`VFR_TOLERANCE`)."""
    known = [t for t in times if t is not None]
    if len(known) == len(times) and len(times) > 2:
        durations = np.diff(np.asarray(known, np.float64))
        median = float(np.median(durations))
        if median <= 0:
            raise _error("variable_frame_rate", f"its frames' times do not increase; {CONSTANT_RATE_FIX}")
        worst = float(np.max(np.abs(durations - median)))
        if worst > VFR_TOLERANCE * median:
            raise _error("variable_frame_rate", f"its frames last from {durations.min() * 1000:.1f} to "
                         f"{durations.max() * 1000:.1f} ms (a variable frame rate), so frame numbers are not times; "
                         f"{CONSTANT_RATE_FIX}")
    rate = stream.average_rate or stream.guessed_rate  # the stated rate: frame times may be rounded (MKV: to 1 ms)
    if not rate and len(known) == len(times) and len(times) > 2:
        return round(1.0 / median, 3)
    if not rate:
        raise _error("variable_frame_rate", f"it states no frame rate; {CONSTANT_RATE_FIX}")
    return round(float(rate), 3)
