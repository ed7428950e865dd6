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

from common import console, dead_letters, output_guard, output_lock
from preprocessing.records import dataset_files
from preprocessing.video import video_clips, video_discovery
from trainer import trained_run
from trainer.engine import inference
from trainer.parallel import partitioning
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
    # Masks sit in one folder per video: every file below the output, not only its top level, must be predict's.
    written = set(output_guard.check_listed_output(output_dir, "predict", {"input": input_path, "model": model_dir},
                                                   below=True))
    written |= {outputs.SUMMARY, "dead_letter.jsonl"}
    sources, layout = video_discovery.discover(input_path)
    if not sources:
        raise FileNotFoundError(f"--input {input_path} holds no {video_discovery.WHAT_IS_TAKEN}.")
    import jax

    run = trained_run.open_run(model_dir)
    devices = jax.devices()
    # The training split where the devices hold it, else its axes in fewer parts (as predict and evaluation do):
    # a clip model trained split over time on 8 devices segments videos on 1, with the training split's masks.
    loaded, split = trained_run.load_split(run, input_partition_dims, one_replica=True)
    config, trained = loaded.config, run.config.partition.input_partition_dims
    cores = config.partition.num_cores_per_replica
    make = lambda patch: inference.VolumePredictor(  # noqa: E731
        loaded.model, loaded.state, config.partition, devices, config.model.downsampling_levels, device_memory,
        patch_size=patch, pad_as=trained)
    whole, windows = make(None), None
    names = list(info.get("class_names") or dataset_files.segmentation_class_names(config.model.num_classes))
    dims = ",".join(map(str, config.partition.input_partition_dims))
    log(f"fullres predict: {len(sources)} video(s) ({layout}) from {input_path}, model {model_dir} ({len(names)} "
        f"classes: {', '.join(names)}), frames fitted to {settings.size[0]}x{settings.size[1]} ({settings.fit}), "
        f"split {dims} over {cores} {devices[0].platform} device(s) ({split['why']})")
    os.makedirs(output_dir, exist_ok=True)
    output_guard.write_marker(output_dir, "predict", sorted(written))
    videos, dead = [], []
    for number, source in enumerate(sources, 1):
        started = time.perf_counter()
        try:
            decoded = video_clips.decode(source, settings)
            # Each mask named after its own frame (`00005.png` for YouTube-VOS's `00005.jpg`), as Annotations are.
            mask_names = [f"{name}.png" for name in source.names(len(decoded.frames))]
        except dead_letters.CaseError as error:
            dead.append(dead_letters.dead_letter(source.relative, error.stage, error.reason, error.detail))
            log(f"[{number}/{len(sources)}] {source.video_id}: skipped ({error.reason}: {error.detail})")
            continue
        frames = len(decoded.frames)
        in_one, why = _method(whole, frames, settings.size, settings.clip_length, clips)
        if not in_one and windows is None:
            windows = make((settings.clip_length, *settings.size))
        predictor = whole if in_one else windows
        beyond = predictor.pads_beyond((frames, *settings.size))
        why += f"; note: {beyond}" if beyond else ""
        volume = decoded.frames.astype(np.float32) / 255.0  # (N, H, W, 3), as the training step scales uint8
        ids = np.argmax(predictor.probabilities(volume, 0.0), axis=-1).astype(np.uint8)  # (N, H, W)
        masks = [video_outputs.unfit_mask(mask, decoded.source_size, decoded.crop_box) for mask in ids]
        planned = [os.path.join(source.video_id, name) for name in mask_names]
        overlay_name = source.video_id + video_outputs.OVERLAY_SUFFIX
        written.update([*planned, *([overlay_name] if overlay else [])])
        output_guard.write_marker(output_dir, "predict", sorted(written))  # listed before they are written
        video_outputs.write_masks(os.path.join(output_dir, source.video_id), masks, mask_names)
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
               "split": split, "class_names": names,
               "videos": videos,
               "dead_letters": dead}
    path = outputs.write_summary_and_dead_letters(output_dir, summary)
    log(f"predicted {len(videos)} video(s), {len(dead)} dead letter(s); summary in {path}")
    too_many = outputs.too_many_failed(len(videos), len(dead), max_failed_fraction, output_dir, "videos")
    if too_many:
        raise ValueError(too_many)
    return summary


# `fullres predict` options for scans, which a video model has no use for (parameter name: how users write it).
SCAN_OPTIONS = {"output_format": "--format", "probabilities": "--probabilities", "sliding_window": "--sliding-window",
                "strict": "--strict", "dicom_seg": "--dicom-seg/--no-dicom-seg", "pseudonymize": "--pseudonymize",
                "pseudonymize_key_file": "--pseudonymize-key-file", "max_voxels": "--max-voxels",
                "max_decoded_bytes": "--max-decoded-bytes", "follow_links": "--follow-links"}


def scan_options_given(context) -> list[str]:
    """The scan-only options given on the command line (`SCAN_OPTIONS`), as written (`--format nifti`)."""
    if context is None:
        return []
    given = console.given(context)
    shown = []
    for name, flag in SCAN_OPTIONS.items():
        if name in given:
            value = context.params[name]
            if not isinstance(value, bool):
                shown.append(f"{flag} {value}")
            else:  # --probabilities; --dicom-seg or --no-dicom-seg as given
                shown.append(flag.split("/")[0 if value else -1])
    return shown


def command(model_dir: str, input_path: str, output_dir: str, dims: Sequence[int] | None, device_memory: int | None,
            clips: bool, max_failed_fraction: float, context=None) -> None:
    """`fullres predict` for a video model: `predict_videos` under the output's lock, failures as one sentence.

    Options for scans (`SCAN_OPTIONS`: a mask format, probability maps, the sliding window, ...) are refused before
    anything is read or written: a video model writes PNG masks per frame and an overlay, and ignored they would
    say nothing. `context`: the command's (`typer.Context`), whose given options are read."""
    ignored = scan_options_given(context)
    if ignored:
        console.fail(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} to CT scans, but --model "
                     f"{model_dir} is a video model, which writes a palette PNG mask per frame and an overlay MP4 "
                     f"(docs/video.md); leave {'it' if len(ignored) == 1 else 'them'} out.")
    try:
        with output_lock.lock(output_dir):
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
