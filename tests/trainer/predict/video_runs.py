"""A video run written as `fullres train` leaves it, without training (its weights are the network's first draw):
what predict needs to be tested through the CLI in seconds (`test_video_predict.py` trains one, in a minute)."""

import os
import pathlib

import numpy as np
from PIL import Image

from preprocessing.video import video_clips
from trainer import export, presets
from trainer.engine import run_files
from trainer.models import unet
from trainer.parallel import partitioning
from trainer.tasks import registry

CLIP = (8, 16, 16)  # (T, H, W) of the training clips
CLASSES = ["background", "right", "left"]


def write_run(folder: pathlib.Path, dims=(1, 1, 1, 1, 1), levels: int = 2) -> str:
    """A video run in `folder` split `dims` in training, `levels` downsamplings; returns its path."""
    import keras

    keras.utils.set_random_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    config = presets.video(
        train_data=str(folder / "clips"), output_dir=str(folder), steps=1,
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, in_channels=3, num_levels=levels, base_filters=4,
                              stem="none"),
        partition=partitioning.PartitionConfig(tuple(dims)))
    settings = video_clips.VideoPreprocessConfig(clip_length=CLIP[0], size=CLIP[1:])
    run_files.write_train_config(str(folder), config)
    run_files.write_model_info(str(folder), "segmentation", [*CLIP, 3], CLASSES,
                               video_clips.preprocessing_record(settings))
    export.save_model(registry.make_task(config).build_model(), run_files.path(str(folder), run_files.MODEL))
    return str(folder)


def write_ct_run(folder: pathlib.Path) -> str:
    """A CT run (the smoke preset's network, untrained) with the preprocessing predict needs; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    config = presets.smoke(train_data=str(folder / "ct"), output_dir=str(folder))
    run_files.write_train_config(str(folder), config)
    run_files.write_model_info(str(folder), "segmentation", [32, 32, 32, 1], CLASSES, {
        "spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
        "shape": [32, 32, 32]})
    export.save_model(registry.make_task(config).build_model(), run_files.path(str(folder), run_files.MODEL))
    return str(folder)


def write_frames(folder: pathlib.Path, names: list[str], size=(24, 24), seed: int = 0) -> None:
    """JPEG frames named `names` in `folder`: a textured background and a square that moves right."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
    for index, name in enumerate(names):
        frame = background.copy()
        frame[8:14, index % (size[1] - 6):index % (size[1] - 6) + 6] = 200
        Image.fromarray(frame).save(os.path.join(folder, name), quality=95)


def write_clips(folder: pathlib.Path, names: list[str], labelled: bool = True, clip=CLIP) -> str:
    """A clip data set as `fullres preprocess video` leaves it: one clip of the motion task per video in `names`
    (masks, or none: an unlabelled conversion), then summary.json; returns the folder."""
    from preprocessing.records import dataset_files, tfrecord_files, video_clips as clip_records
    from preprocessing.video import demo_video

    folder.mkdir(parents=True)
    rng = np.random.default_rng(len(names))
    records, counts = [], {}
    for name in names:
        frames, masks = demo_video.motion_video(rng, clip[0], clip[1:])
        values = tuple(int(v) for v in np.unique(masks)) if labelled else ()
        for value in values:
            counts[str(value)] = counts.get(str(value), 0) + 1
        records.append(clip_records.encode_video_clip(clip_records.VideoClip(
            f"{name}@00000", f"{name}.mp4", frames, masks if labelled else np.zeros_like(masks), 24.0,
            tuple(range(clip[0])), clip[0], clip[1:], label_values=values)))
    tfrecord_files.write_records(str(folder / "data-00000-of-00001.tfrecord"), records)
    settings = video_clips.VideoPreprocessConfig(clip_length=clip[0], size=clip[1:])
    dataset_files.write_summary(str(folder), {"ok": len(names), "failed": 0, "shards": ["data-00000-of-00001.tfrecord"],
                                              **({"label_values": counts} if counts else {}),
                                              "preprocessing": video_clips.preprocessing_record(settings)})
    return str(folder)
