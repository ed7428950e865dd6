"""The programs of a run: its model, optimizer and schedule, and the partitioned training step built from them.

`fullres train` runs exactly what `fullres plan` compiles ahead of time: both
call `build_model` here and `step.jit_step`. The optimizer and its schedule are made
in one place, `build_optimizer`: training, planning and the export of a trained
model (which saves the optimizer's variables beside the weights) all build it here.
"""

from __future__ import annotations


import keras

from trainer import config as config_lib
from trainer.engine import placement


@keras.saving.register_keras_serializable(package="fullres")
class PolyDecay(keras.optimizers.schedules.LearningRateSchedule):
    """nnU-Net's poly schedule: `peak × (1 − t / T) ** power` (power 0.9), after an optional linear warm-up.

    `t` counts the steps after the warm-up and `T` is what remains of the run
    then, so the rate reaches 0 at `total_steps` (nnU-Net: `PolyLRScheduler`,
    `initial_lr × (1 − epoch / max_epochs) ** 0.9`, stepped once per epoch; here per step).

    Example:
        >>> schedule = PolyDecay(1e-2, total_steps=100)
        >>> [round(float(schedule(s)), 5) for s in (0, 50, 99)]
        [0.01, 0.00536, 0.00016]
    """

    def __init__(self, peak: float, total_steps: int, warmup_steps: int = 0, power: float = 0.9):
        self.peak, self.total_steps, self.warmup_steps, self.power = peak, total_steps, warmup_steps, power

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = float(self.warmup_steps)
        warming = self.peak * step / max(warmup, 1.0)
        progress = keras.ops.clip((step - warmup) / max(float(self.total_steps) - warmup, 1.0), 0.0, 1.0)
        decayed = self.peak * keras.ops.power(1.0 - progress, self.power)
        return keras.ops.where(step < warmup, warming, decayed)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "power": self.power}


def warmup_steps_used(config: config_lib.TrainConfig, total_steps: int) -> int:
    """The warm-up a run of `total_steps` takes: `config.warmup_steps`, cut to end before the last step.

    >>> from trainer import presets
    >>> warmup_steps_used(presets.smoke(warmup_steps=50), 2), warmup_steps_used(presets.smoke(warmup_steps=5), 40)
    (1, 5)
    """
    return max(min(config.warmup_steps, total_steps - 1), 0)


def warmup_note(config: config_lib.TrainConfig, total_steps: int) -> str | None:
    """The sentence saying that the run's warm-up is shorter than `config.warmup_steps` asks, or None."""
    used = warmup_steps_used(config, total_steps)
    if used == config.warmup_steps:
        return None
    return (f"warning: --warmup-steps {config.warmup_steps} is cut to {used}: this run has {total_steps} steps and its "
            f"warm-up must end before the last; run_record.json records the {used} used (train_config.json keeps "
            f"the {config.warmup_steps} asked, which a resume to more steps would use); pass --warmup-steps {used} "
            "or fewer, or more --steps, to make them agree.")


def learning_rate_schedule(config: config_lib.TrainConfig, total_steps: int, warmup: int | None = None):
    """Linear warm-up to the peak rate, then cosine decay to 0, poly decay to 0 (nnU-Net's), or constant.

    `warmup`: the warm-up steps, as the run resolved them (`warmup_steps_used`, which None asks).
    """
    warmup = warmup_steps_used(config, total_steps) if warmup is None else warmup
    if config.schedule == "poly":
        return PolyDecay(config.learning_rate, total_steps, warmup_steps=warmup)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=max(total_steps - warmup, 1),
        alpha=1.0 if config.schedule == "constant" else 0.0,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def build_optimizer(config: config_lib.TrainConfig, schedule) -> keras.optimizers.Optimizer:
    """The run's optimizer on `schedule`: Adam, or SGD with Nesterov momentum (nnU-Net: momentum 0.99).

    `weight_decay` (nnU-Net: 3e-5 with SGD) is Keras's: each step shrinks every
    weight by `learning_rate × weight_decay × weight`, beside the gradient step.
    """
    decay = config.weight_decay or None
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(schedule, momentum=config.momentum, nesterov=True, weight_decay=decay)
    return keras.optimizers.Adam(schedule, weight_decay=decay)


def build_model(config: config_lib.TrainConfig, task, total_steps: int, warmup_steps: int | None = None):
    """The model, optimizer, learning-rate schedule and initial `TrainState` of a run (`fullres plan` builds the same).

    Variables land where the caller's scope puts them: training builds inside
    its distribution's scope (replicated on the mesh); planning needs only
    their shapes and builds them once, on one device. `warmup_steps`: the warm-up a training run resolved
    (`resolved_run.ResolvedRun.warmup_steps`); None works it out (`warmup_steps_used`).
    """
    model = task.build_model()
    schedule = learning_rate_schedule(config, total_steps, warmup_steps)
    optimizer = build_optimizer(config, schedule)
    return model, optimizer, schedule, initial_state(model, optimizer)


def initial_state(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> placement.TrainState:
    """The state a run starts from: the model's and optimizer's current variables (building the optimizer if
    needed), as a `placement.TrainState` on the host; `placement.place_state` puts it on the mesh."""
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return placement.TrainState(
        trainable=[v.value for v in model.trainable_variables],
        non_trainable=[v.value for v in model.non_trainable_variables],
        optimizer=[v.value for v in optimizer.variables],
    )
