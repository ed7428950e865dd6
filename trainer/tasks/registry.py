"""What segmentation and detection training do differently: each task is a `base.Task`.

`train.train` runs one loop for both; it asks the task for everything that
depends on what is being learned (model, loss, data, label layout, evaluation,
report). No other module branches on the task's name:

* `segmentation.SegmentationTask`: a UNet on CT volumes, per-class Dice.
* `detection.DetectionTask`: a RetinaNet on images with boxes, COCO mAP.
"""

from __future__ import annotations

import os
import zipfile
import zlib

from trainer import config as config_lib
from trainer.engine import run_files
from trainer.tasks import base, detection, segmentation

TASKS: dict[str, type[base.Task]] = {"segmentation": segmentation.SegmentationTask, "detection": detection.DetectionTask}


def make_task(config: config_lib.TrainConfig) -> base.Task:
    """The task `config.task` names, for `config`."""
    return TASKS[config.task](config)


def restore(model_dir: str):
    """The task of the model `fullres train` left in `model_dir`, with the class names it was trained with.

    Returns:
        (config, task): the `TrainConfig` read from `train_config.json`, and its task.
    """
    config = run_files.read_train_config(model_dir)
    task = make_task(config)
    if os.path.exists(run_files.path(model_dir, run_files.MODEL_INFO)):
        names = run_files.read_model_info(model_dir).get("class_names")
        if names:  # the names the model was trained with, wherever its training data is now
            task.class_names = names
    return config, task


def load_weights(task, model_dir: str):
    """The model of `task`, rebuilt from its config and given the trained weights in `model_dir/model.keras`.

    Rebuilt rather than loaded whole: KerasHub's backbones inside the detector do
    not survive `keras.saving.load_model`, and a rebuilt model is the one the
    trainer compiled. Build it inside a distribution's scope to place it.

    Raises:
        ModelFileDamaged: `model.keras` is cut short or its contents do not decompress (a copy or a save that
            did not finish).
    """
    model = task.build_model()
    path = run_files.path(model_dir, run_files.MODEL)
    try:
        model.load_weights(path)
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:
        why = "not a complete Keras archive" if isinstance(error, zipfile.BadZipFile) else f"{error}".strip()
        raise ModelFileDamaged(
            f"{path} is damaged ({why}, {os.path.getsize(path)} bytes); copy model.keras again from the run "
            "that trained it, or retrain with `fullres train`.") from None
    return model


class ModelFileDamaged(ValueError):
    """A run's `model.keras` cannot be read; the message names it and what to do."""
