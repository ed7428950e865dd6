"""`fullres predict` with a model trained on video clips: whole videos of any length, masks per frame and an overlay.

Each video (a file, or a DAVIS / YouTube-VOS frame folder; `video_discovery`)
is decoded and fitted as its training clips were (the run's recorded
`preprocessing`: clip size and fit), then segmented through the split model:

* **as one volume**, every frame in one partitioned pass (the time axis padded
  to what the split accepts), when that pass fits a device's memory (checked by
  compiling it: `inference.VolumePredictor`); every frame then sees as far as
  the network reaches, across the whole video;
* **in overlapping clips** of the training clip's length (half overlap,
  Gaussian-weighted, `engine.sliding_window`) when it does not fit, or when
  asked (`clips=True`). The summary and the log say which, and why.

The masks go back to the source's frame size and are written in the DAVIS
layout, `OUTPUT/<video>/00000.png, ...` (palette PNGs whose indices are the
classes), with `OUTPUT/<video>.overlay.mp4` beside them (`video_outputs`). A
video that cannot be decoded is a dead letter, as in `fullres preprocess video`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from common import console, dead_letters, output_guard
from preprocessing.records import dataset_files
from preprocessing.video import video_clips, video_discovery
from trainer import config as config_lib, trained_run
from trainer.engine import inference
from trainer.parallel import device_mesh, device_split, partitioning
from trainer.predict import outputs, video_outputs


def is_video_run(model_dir: str) -> bool:
    """Whether the run in `model_dir` was trained on video clips (its recorded preprocessing says so)."""
    try:
        info = trained_run.read_info(model_dir)
    except (FileNotFoundError, ValueError):
        return False
    return (info.get("preprocessing") or {}).get("kind") == "video"


def _method(whole: inference.VolumePredictor, frames: int, plane: tuple[int, int], clip_length: int,
            forced: bool) -> tuple[bool, str]:
    """(whole or not, why in words) for a video of `frames` frames."""
    if forced:
        return False, f"overlapping clips of {clip_length} frames (--clips)"
    shape = (1, *whole.padded_shape((frames, *plane)), 3)
    try:
        whole.compiled(shape)
    except inference.VolumeTooLarge as error:
        return False, (f"overlapping clips of {clip_length} frames, half overlap, Gaussian-weighted: the whole video "
                       f"does not fit one pass ({error})")
    memory = "" if whole.device_memory is None else " within the devices' memory"
    return True, f"whole video in one pass ({frames} frames, padded to {shape[1]}){memory}"


def predict_videos(model_dir: str, input_path: str, output_dir: str, *,
                   input_partition_dims: Sequence[int] | None = None, device_memory: int | None = None,
                   clips: bool = False, max_failed_fraction: float = 0.1, overlay: bool = True,
                   log: Callable[[str], None] = print) -> dict:
    """Segments every video under `input_path` with the video model in `model_dir`; see the module docstring.

    Returns:
        The summary (also written as `summary.json`).

    Raises:
        FileNotFoundError: `input_path` holds no video.
        partitioning.PartitionError: the split needs more devices than are present.
        output_guard.OutputRefused: `output_dir` holds files fullres did not write, or overlaps the inputs.
        ValueError: more than `max_failed_fraction` of the videos are dead letters (after the summary is written).
    """
    dead_letters.check_failed_fraction(max_failed_fraction)
    info = trained_run.read_info(model_dir)
    settings = video_clips.config_of(info["preprocessing"])
    written = set(output_guard.check_listed_output(output_dir, "predict", {"input": input_path, "model": model_dir}))
    written |= {outputs.SUMMARY, "dead_letter.jsonl"}
    sources, layout = video_discovery.discover(input_path)
    if not sources:
        raise FileNotFoundError(f"--input {input_path} holds no video ({', '.join(video_clips.video_files.VIDEO_SUFFIXES)}"
                                f") or frame folder ({video_discovery.FRAMES_FOLDER}/<video>/00000.jpg).")
    import jax

    run = trained_run.open_run(model_dir)
    devices = jax.devices()
    # The training split where the devices hold it, else its axes in fewer parts (as predict and evaluation do):
    # a clip model trained split over time on 8 devices segments videos on 1.
    trained = run.config.partition.input_partition_dims
    chosen, split_reason = device_split.choose(trained, input_partition_dims, len(devices))
    config = config_lib.with_dims(run.config, chosen)
    cores = config.partition.num_cores_per_replica
    device_mesh.require_devices(cores, len(devices), f"input_partition_dims {list(config.partition.input_partition_dims)}",
                                 "pass --input-partition-dims with fewer parts")
    loaded = trained_run.load(run, devices[:cores], config.partition.input_partition_dims)
    make = lambda patch: inference.VolumePredictor(  # noqa: E731
        loaded.model, loaded.state, config.partition, devices, config.model.downsampling_levels, device_memory,
        patch_size=patch, pad_as=trained if input_partition_dims is None else None)
    whole, windows = make(None), None
    names = list(info.get("class_names") or dataset_files.segmentation_class_names(config.model.num_classes))
    dims = ",".join(map(str, config.partition.input_partition_dims))
    log(f"fullres predict: {len(sources)} video(s) ({layout}) from {input_path}, model {model_dir} ({len(names)} "
        f"classes: {', '.join(names)}), frames fitted to {settings.size[0]}x{settings.size[1]} ({settings.fit}), "
        f"split {dims} over {cores} {devices[0].platform} device(s) ({split_reason})")
    os.makedirs(output_dir, exist_ok=True)
    output_guard.write_marker(output_dir, "predict", sorted(written))
    videos, dead = [], []
    for number, source in enumerate(sources, 1):
        started = time.perf_counter()
        try:
            decoded = video_clips.decode(source, settings)
        except dead_letters.CaseError as error:
            dead.append(dead_letters.dead_letter(source.relative, error.stage, error.reason, error.detail))
            log(f"[{number}/{len(sources)}] {source.video_id}: skipped ({error.reason}: {error.detail})")
            continue
        frames = len(decoded.frames)
        in_one, why = _method(whole, frames, settings.size, settings.clip_length, clips)
        if not in_one and windows is None:
            windows = make((settings.clip_length, *settings.size))
        predictor = whole if in_one else windows
        volume = decoded.frames.astype(np.float32) / 255.0  # (N, H, W, 3), as the training step scales uint8
        ids = np.argmax(predictor.probabilities(volume, 0.0), axis=-1).astype(np.uint8)  # (N, H, W)
        masks = [video_outputs.unfit_mask(mask, decoded.source_size, decoded.crop_box) for mask in ids]
        planned = [os.path.join(source.video_id, f"{t:05d}.png") for t in range(frames)]
        overlay_name = source.video_id + video_outputs.OVERLAY_SUFFIX
        written.update([*planned, *([overlay_name] if overlay else [])])
        output_guard.write_marker(output_dir, "predict", sorted(written))  # listed before they are written
        video_outputs.write_masks(os.path.join(output_dir, source.video_id), masks)
        if overlay:
            video_outputs.write_overlay(os.path.join(output_dir, overlay_name),
                                        video_clips.source_frames(source), masks, decoded.fps)
        seconds = round(time.perf_counter() - started, 3)
        videos.append({"video": source.video_id, "source": source.relative, "frames": frames, "fps": decoded.fps,
                       "source_size": list(decoded.source_size), "method": "whole" if in_one else "clips",
                       "why": why, "masks": source.video_id + "/", "overlay": overlay_name if overlay else None,
                       "class_pixels": {names[c]: int(n) for c, n in enumerate(np.bincount(ids.ravel(),
                                                                                             minlength=len(names)))},
                       "seconds": seconds})
        log(f"[{number}/{len(sources)}] {source.video_id}: {frames} frames, {why} -> {source.video_id}/ "
            f"{'and ' + overlay_name if overlay else ''} ({seconds:.1f} s)")
    summary = {"model": os.path.abspath(model_dir), "input": os.path.basename(os.path.abspath(input_path)),
               "ok": len(videos), "failed": len(dead), "input_partition_dims": list(config.partition.input_partition_dims),
               "devices": f"{cores} {devices[0].platform}",
               "split": device_split.record(chosen, trained, len(devices), split_reason), "class_names": names,
               "videos": videos,
               "dead_letters": dead}
    path = outputs.write_summary_and_dead_letters(output_dir, summary)
    log(f"predicted {len(videos)} video(s), {len(dead)} dead letter(s); summary in {path}")
    too_many = outputs.too_many_failed(len(videos), len(dead), max_failed_fraction, output_dir, "videos")
    if too_many:
        raise ValueError(too_many)
    return summary


def command(model_dir: str, input_path: str, output_dir: str, dims: Sequence[int] | None, device_memory: int | None,
            clips: bool, max_failed_fraction: float) -> None:
    """`fullres predict` for a video model: `predict_videos` under the output's lock, failures as one sentence."""
    try:
        with output_guard.lock(output_dir):
            summary = predict_videos(model_dir, input_path, output_dir, input_partition_dims=dims,
                                     device_memory=device_memory, clips=clips,
                                     max_failed_fraction=max_failed_fraction, log=console.say)
    except (partitioning.PartitionError, output_guard.OutputRefused, FileNotFoundError, ValueError) as error:
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, output_dir)
    if summary["ok"] == 0:
        console.fail(f"no video was predicted ({summary['failed']} dead letter(s) in "
                     f"{os.path.join(output_dir, 'dead_letter.jsonl')}).")
