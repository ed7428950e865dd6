"""What segmentation and detection training do differently: each task is a `base.Task`.

`train.train` runs one loop for both; it asks the task for everything that
depends on what is being learned (model, loss, data, label layout, evaluation,
report). No other module branches on the task's name:

* `segmentation.SegmentationTask`: a UNet on CT volumes, per-class Dice.
* `detection.DetectionTask`: a RetinaNet on images with boxes, COCO mAP.

A trained run's task comes back through `trainer.trained_run.open_run`.
"""

from __future__ import annotations

from trainer import config as config_lib
from trainer.tasks import base, detection, segmentation

TASKS: dict[str, type[base.Task]] = {"segmentation": segmentation.SegmentationTask, "detection": detection.DetectionTask}


def make_task(config: config_lib.TrainConfig) -> base.Task:
    """The task `config.task` names, for `config`."""
    return TASKS[config.task](config)
