"""Synthetic videos where only motion tells the classes apart (`fullres demo-data video`).

Each video shows two identical grey squares on a textured background. One
moves right, the other left, at the same speed; the class of a square is the
direction it moves (1: right, 2: left), drawn per frame in a palette PNG mask
beside the video. A single frame shows two identical squares, so a model that
sees one frame at a time cannot tell which is which (it can find the squares,
not their class); a model that sees several frames can. Mirroring a clip
left-right, or playing it backwards, swaps the classes: a motion task trains
without those augmentations.

Videos are H.264 MP4 files (PyAV's libx264, the encoder users' videos come
from) with masks in `<name>/00000.png, ...` beside each: the layout
`fullres preprocess video` reads. Nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image
from scipy import ndimage

CLASSES = ("background", "moving_right", "moving_left")
PALETTE = [0, 0, 0, 230, 80, 40, 40, 120, 230]  # index 0 black, 1 orange, 2 blue
SQUARE_GREY = 200


def motion_video(rng: np.random.Generator, frames: int, size: tuple[int, int], square: int = 0, speed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(frames (N, H, W, 3) uint8, masks (N, H, W) uint8) of one video: see the module docstring.

    `square` (side, default H/6) and `speed` (pixels a frame, default W/32, at least 1) scale with the size.
    """
    height, width = size
    square = square or max(4, height // 6)
    speed = speed or max(1, width // 32)
    texture = ndimage.gaussian_filter(rng.normal(0, 1, (height, width)), sigma=2)
    background = np.clip(90 + 25 * texture / (texture.std() + 1e-6), 0, 255)  # (H, W)
    rows = rng.permutation(np.arange(0, height - square + 1, square))[:2]  # two rows that do not overlap
    travel = speed * (frames - 1)
    starts = rng.integers(0, max(1, width - square - travel + 1), 2)
    images = np.empty((frames, height, width, 3), np.uint8)
    masks = np.zeros((frames, height, width), np.uint8)
    for t in range(frames):
        frame = background.copy()
        for index, (row, start) in enumerate(zip(rows, starts)):
            moving_right = index == 0
            x = start + speed * t if moving_right else start + travel - speed * t
            frame[row:row + square, x:x + square] = SQUARE_GREY
            masks[t, row:row + square, x:x + square] = 1 if moving_right else 2
        noise = rng.normal(0, 4, (height, width))
        images[t] = np.clip(frame + noise, 0, 255).astype(np.uint8)[..., None]
    return images, masks


MAX_DEMO_BYTES = 3 * 2**30  # a demo video is made whole in memory before it is encoded


def check_settings(size: tuple[int, ...], videos: int, frames: int, fps: int, size_text: str | None = None) -> None:
    """Refuses demo settings that cannot make the videos, one sentence each, naming the option.

    >>> check_settings((33, 33), 8, 24, 24)
    Traceback (most recent call last):
    ValueError: --size 33,33: H.264 stores frames of even sizes only; pass --size 32,32 or --size 34,34.

    Raises:
        ValueError: see above; `size_text` is `--size` as typed, if it was.
    """
    typed = size_text if size_text is not None else ",".join(map(str, size))
    if len(size) != 2:
        raise ValueError(f"--size {typed} is not H,W; write it like --size 64,64.")
    if min(size) < 16:
        raise ValueError(f"--size {typed}: the squares need frames of 16 pixels or more a side; write it like --size 64,64.")
    if size[0] % 2 or size[1] % 2:
        low, high = (",".join(str(s - s % 2 + step * (s % 2)) for s in size) for step in (0, 2))
        raise ValueError(f"--size {typed}: H.264 stores frames of even sizes only; pass --size {low} or --size {high}.")
    for name, value, least, example in (("--videos", videos, 1, 8), ("--frames", frames, 2, 24), ("--fps", fps, 1, 24)):
        if value < least:
            raise ValueError(f"{name} {value} must be {least} or more, e.g. {name} {example}.")
    if frames * size[0] * size[1] * 4 > MAX_DEMO_BYTES:
        raise ValueError(f"--size {typed} with --frames {frames} makes a demo video of more than 3 GiB in memory; "
                         "choose a smaller --size or fewer --frames, e.g. --size 64,64 --frames 24.")


def demo_video_files(videos: int, frames: int) -> list[str]:
    """The files `write_demo_videos` writes, relative to its output folder (what `fullres demo-data video` claims)."""
    names = [f"videos/motion_{index:03d}.mp4" for index in range(videos)]
    masks = [f"videos/motion_{index:03d}/{t:05d}.png" for index in range(videos) for t in range(frames)]
    return sorted([*names, *masks])


def write_video(path: str, frames: np.ndarray, fps: int) -> None:
    """Encodes (N, H, W, 3) uint8 `frames` as an H.264 MP4 at a constant `fps` (near-lossless: crf 12)."""
    import av

    with av.open(path, "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": "12"})
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_mask(path: str, mask: np.ndarray) -> None:
    """One (H, W) uint8 mask of class ids as a palette PNG (indices are the classes, as DAVIS writes them)."""
    image = Image.fromarray(mask)  # mode L; the palette makes it P
    image.putpalette(PALETTE)
    image.save(path)


def write_demo_videos(output_dir: str, videos: int = 8, frames: int = 24, size: tuple[int, int] = (64, 64),
                      fps: int = 24, seed: int = 0) -> dict:
    """Writes `output_dir/videos/motion_NNN.mp4` with masks in `motion_NNN/`; returns `{"videos": folder}`.

    Raises:
        ValueError: `check_settings` refuses them (frame sizes must be even: H.264's 4:2:0 colour).
    """
    check_settings(tuple(size), videos, frames, fps)
    folder = os.path.join(output_dir, "videos")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(videos):
        images, masks = motion_video(rng, frames, size)
        name = os.path.join(folder, f"motion_{index:03d}")
        write_video(name + ".mp4", images, fps)
        os.makedirs(name, exist_ok=True)
        for t, mask in enumerate(masks):
            write_mask(os.path.join(name, f"{t:05d}.png"), mask)
    return {"videos": folder}
