"""What segmentation and detection training do differently: each task is a `base.Task`.

`train.train` runs one loop for both; it asks the task for everything that
depends on what is being learned (model, loss, data, label layout, evaluation,
report). No other module branches on the task's name:

* `segmentation.SegmentationTask`: a UNet on CT volumes, per-class Dice.
* `detection.DetectionTask`: a RetinaNet on images with boxes, COCO mAP.

A trained run's task comes back through `trainer.trained_run.open_run`.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer import config as config_lib
from trainer.parallel import partitioning
from trainer.tasks import base, detection, segmentation

TASKS: dict[str, type[base.Task]] = {"segmentation": segmentation.SegmentationTask, "detection": detection.DetectionTask}


def make_task(config: config_lib.TrainConfig, class_names: Sequence[str] | None = None) -> base.Task:
    """The task `config.task` names, for `config`.

    Args:
        config: the run's configuration.
        class_names: one name per class, background first (a pipeline's `class_names`, or those a resumed run
            keeps): the classes' names where the training data's label_map.json names none; where it does, they
            must be its names.

    Raises:
        ValueError: `class_names` name another number of classes than the model predicts, or other classes than
            the training data's label map.
    """
    task = TASKS[config.task](config)
    if class_names:
        named = task.report_class_names(list(class_names))  # one per class (detection: the label map's)
        if task.class_names and list(task.class_names) != named:
            raise ValueError(f"class_names {','.join(class_names)} are not the names the label_map.json beside "
                             f"{config.train_data} gives its classes ({','.join(task.class_names)}); leave "
                             "class_names out, or give those.")
        task.class_names = named
    return task


def dimension_names(task: base.Task) -> tuple[str, ...] | None:
    """What the partition checks call each axis of `task`'s features (`partitioning.validate`'s `dimension_names`):
    a clip's first axis is its length in frames, as `fullres preprocess video --clip-length` set it; None: the
    default names (depth for CT volumes)."""
    video = (task.preprocessing() or {}).get("kind") == "video"
    return partitioning.VIDEO_DIMENSION_NAMES if video else None
