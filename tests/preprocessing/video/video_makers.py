"""Video files for tests, written by FFmpeg's own encoders through PyAV (not by fullres), and a second decoder.

The second decoder is the ffmpeg binary imageio-ffmpeg bundles (a dev dependency): it decodes every frame
(`-f null`) and reports the count, and its stream line states the size and frame rate.
"""

from __future__ import annotations

import fractions
import re
import subprocess

import av
import imageio_ffmpeg
import numpy as np
from PIL import Image


def frames(count: int, size: tuple[int, int], seed: int = 0) -> np.ndarray:
    """(count, H, W, 3) uint8: a moving gradient with noise, so that every frame differs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size[0], 0:size[1]]
    out = np.empty((count, *size, 3), np.uint8)
    for t in range(count):
        out[t] = ((x + 3 * t) % 256)[..., None] * np.array([1, 0.5, 0.25]) + rng.integers(0, 20, (*size, 1))
    return out


def encode(path: str, images: np.ndarray, fps: int = 25, codec: str = "libx264", rotation: int = 0,
           durations_ms: list[int] | None = None, faststart: bool = False) -> str:
    """Writes `images` with FFmpeg's `codec`; `rotation` sets a display matrix (as phones do); `durations_ms`
    gives each frame its own duration (a variable frame rate); `faststart` puts the MP4 index first."""
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(path, "w", options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.height, stream.width = images.shape[1:3]
        stream.pix_fmt = "yuv420p"
        if rotation:
            stream.set_display_rotation(rotation)
        if durations_ms is not None:
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        time = 0
        for index, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            if durations_ms is not None:
                frame.pts, frame.time_base = time, fractions.Fraction(1, 1000)
                time += durations_ms[index % len(durations_ms)]
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def encode_audio_only(path: str, seconds: float = 1.0) -> str:
    """An M4A-like MP4 with one AAC audio stream and no video."""
    with av.open(path, "w") as container:
        stream = container.add_stream("aac", rate=44100)
        samples = int(44100 * seconds)
        tone = (0.2 * np.sin(np.arange(samples) * 2 * np.pi * 440 / 44100)).astype(np.float32)[None]
        for start in range(0, samples, 1024):
            frame = av.AudioFrame.from_ndarray(tone[:, start:start + 1024], format="fltp", layout="mono")
            frame.sample_rate = 44100
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_masks(folder, masks: np.ndarray, palette: list[int] | None = None, start: int = 0) -> None:
    """(N, H, W) uint8 class ids as palette PNGs 00000.png, ... in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, mask in enumerate(masks):
        image = Image.fromarray(mask)
        image.putpalette(palette or [0, 0, 0, 255, 0, 0, 0, 255, 0])
        image.save(folder / f"{index + start:05d}.png")


def ffmpeg_probe(path: str) -> dict:
    """What the bundled ffmpeg binary says of `path`'s first video stream: frames decoded, (H, W), fps."""
    result = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path), "-map", "0:v:0",
                             "-f", "null", "-"], capture_output=True, text=True, timeout=60)
    text = result.stderr
    stream = re.search(r"Input #0.*?Stream #0:\d+.*?Video: .*?, (\d+)x(\d+).*?, ([\d.]+) fps", text, re.S)
    counts = re.findall(r"frame=\s*(\d+)", text)
    return {"frames": int(counts[-1]), "size": (int(stream.group(2)), int(stream.group(1))),
            "fps": float(stream.group(3))}


def write_motion_clip_records(path: str, clip: tuple[int, int, int], count: int = 2) -> None:
    """`count` clips of the demo's motion task, (T, H, W) = `clip`, seed 0, as one TFRecord file at `path` (the
    records `preprocess video` writes, made without a video file)."""
    from preprocessing.records import tfrecord_files, video_clips as clip_records
    from preprocessing.video import demo_video

    rng = np.random.default_rng(0)
    records = []
    for index in range(count):
        motion_frames, masks = demo_video.motion_video(rng, clip[0], clip[1:])
        records.append(clip_records.encode_video_clip(clip_records.VideoClip(
            f"motion_{index}@00000", f"motion_{index}.mp4", motion_frames, masks, 24.0, tuple(range(clip[0])),
            clip[0], clip[1:], label_values=(0, 1, 2))))
    tfrecord_files.write_records(path, records)


def write_frames(folder, names: list[str], size: tuple[int, int] = (24, 32)) -> None:
    """One image per name in `folder` (made if need be), frame k of the list `20 * k + 10` grey, so that the clips'
    pictures show which file each frame came from (PNG exactly, JPEG within a few levels)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(names):
        Image.fromarray(np.full((*size, 3), 20 * index + 10, np.uint8)).save(folder / name)


def clip_frames(output) -> dict:
    """`{case_id: (source frames, frame names, the mean grey of each clip frame)}` of every clip record in `output`."""
    import glob
    import os

    from preprocessing.records import example_layout, tfrecord_files, video_clips as clip_records
    from trainer.data import ct_input

    found = {}
    for path in sorted(glob.glob(os.path.join(str(output), "data-*.tfrecord*"))):
        records = tfrecord_files.RecordFile(path)
        for index in range(len(records)):
            keys = example_layout.layout(lambda offset, size, r=records, i=index: r.read(i, offset, size),
                                         int(records.lengths[index]))
            found[keys["case_id"][0].data.decode()] = (
                tuple(int(n) for n in keys[clip_records.SOURCE_FRAMES]),
                tuple(v.data.decode() for v in keys[clip_records.FRAME_NAMES]), None)
        records.close()
    for example in ct_input.read_examples(os.path.join(str(output), "data-*")):
        frames, names, _ = found[example["case_id"]]
        found[example["case_id"]] = (frames, names, tuple(round(float(f.mean()) * 255) for f in example["image"]))
    return found
