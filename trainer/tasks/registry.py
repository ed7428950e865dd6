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
from trainer.parallel import partitioning
from trainer.tasks import base, detection, segmentation

TASKS: dict[str, type[base.Task]] = {"segmentation": segmentation.SegmentationTask, "detection": detection.DetectionTask}


def make_task(config: config_lib.TrainConfig) -> base.Task:
    """The task `config.task` names, for `config`."""
    return TASKS[config.task](config)


def dimension_names(task: base.Task) -> tuple[str, ...] | None:
    """What the partition checks call each axis of `task`'s features (`partitioning.validate`'s `dimension_names`):
    a clip's first axis is its length in frames, as `fullres preprocess video --clip-length` set it; None: the
    default names (depth for CT volumes)."""
    video = (task.preprocessing() or {}).get("kind") == "video"
    return partitioning.VIDEO_DIMENSION_NAMES if video else None
