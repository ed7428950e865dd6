"""The programs of a run: its model, optimizer and schedule, and the partitioned training step built from them.

`fullres train` runs exactly what `fullres plan` compiles ahead of time: both
call `build_model` and `jit_step` here.
"""

from __future__ import annotations

from trainer import config as config_lib
from trainer.engine import placement, step
from trainer.parallel import partitioning


def learning_rate_schedule(config: config_lib.TrainConfig, total_steps: int):
    """Linear warm-up to the peak rate, then cosine decay to 0 (or constant)."""
    import keras

    warmup = min(config.warmup_steps, total_steps - 1)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=max(total_steps - warmup, 1),
        alpha=1.0 if config.schedule == "constant" else 0.0,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def build_model(config: config_lib.TrainConfig, task, total_steps: int):
    """The model, optimizer, learning-rate schedule and initial `TrainState` of a run (`fullres plan` builds the same).

    Variables land where the caller's scope puts them: training builds inside
    its distribution's scope (replicated on the mesh); planning needs only
    their shapes and builds them once, on one device.
    """
    import keras

    model = task.build_model()
    schedule = learning_rate_schedule(config, total_steps)
    optimizer = keras.optimizers.Adam(schedule)
    return model, optimizer, schedule, placement.initial_state(model, optimizer)


def jit_step(task, model, optimizer, distribution: partitioning.SpatialParallel, state, image_ndim: int):
    """The jitted, partitioned training step that `train` runs and `fullres plan` compiles ahead of time:
    `(state, inputs, labels, step) -> (state, metrics)`, the task's `prepare` (cast, augmentation) inside it."""
    return step.jit_train_step(step.make_train_step(model, optimizer, task.loss, task.prepare), distribution, state,
                               image_ndim=image_ndim, label_sharding=task.label_sharding(distribution, image_ndim),
                               input_sharding=task.input_sharding(distribution, image_ndim))
