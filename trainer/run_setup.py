"""A training run's set-up: the task, the layout and mesh, the model, the compiled step checked for gathers, and the
state to start from (a resume's checkpoint), with the run's files written by process 0.

Everything a rerun could be refused for is checked here before anything is written: the loop (`train_loop`) and the
finish (`train._finish`) only add to a run that `set_up` accepted.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence

import numpy as np

from trainer import config as config_lib, trained_run
from trainer.engine import checkpoints, placement, program, run_files, run_record
from trainer.parallel import device_mesh, distributed, partitioning
from trainer.plan import compiled_step, gathers, layout_choice
from trainer.tasks import registry


@dataclasses.dataclass
class Run:
    """What `set_up` prepares for the loop and the finish."""

    config: config_lib.TrainConfig
    task: object  # tasks.base.Task
    total_steps: int
    num_examples: int
    image_shape: tuple[int, ...]  # (B, D, H, W, 1) or (B, H, W, 3)
    choice: object  # layout_choice.LayoutChoice, or None when the layout was given
    distribution: device_mesh.SpatialParallel
    model: object
    optimizer: object
    schedule: object
    state: placement.TrainState
    start_step: int
    checkpointer: checkpoints.Checkpointer
    history: list[dict]
    is_chief: bool
    train_step: object  # distributed.RunTogether: the jitted step, already compiled once for the gather check
    input_wait_seconds: float = 0.0  # the loop's time waiting for its next batch, after the first step (the compile)
    input_wait_fraction: float = 0.0  # of the run's time after the first step
    input_cache: str | None = None  # the input cache's decision, in words
    eval_note: str | None = None  # --eval scored across preprocessings (`run_data.check_eval`), in words


def seed(seed: int) -> None:
    """`keras.utils.set_random_seed` but TensorFlow's: Python's, NumPy's and Keras's generators. Keras's would import
    TensorFlow to seed it (4.6 CPU-s in every training process); detection's tf.data input, the one reader that
    draws from it, seeds it with the same seed where it shuffles (`detection_input.record_stream`)."""
    import random

    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)  # made again from the seed
    random.seed(seed)
    np.random.seed(seed)


def set_up(config: config_lib.TrainConfig, log: Callable[[str], None], continue_with_changes: bool = False,
           class_names: Sequence[str] | None = None) -> Run:
    """Task, layout, mesh, model and the state to start from; the run's config files written (process 0).
    `class_names`: `registry.make_task`'s; a resume without them keeps those the run recorded."""
    import jax

    recorded = trained_run.read_record(config.output_dir)
    class_names = class_names or recorded.info.get("class_names")
    task = registry.make_task(config, class_names)
    num_examples = task.num_examples()
    total_steps = config.steps
    if config.epochs is not None:
        total_steps = config.epochs * math.ceil(num_examples / config.batch_size)
    image_shape = (config.batch_size, *task.example_shape())  # (B, D, H, W, 1) or (B, H, W, 3)
    devices = jax.devices()
    choice = None
    if config.partition.is_auto:  # chosen now that the devices and the volume are known; cached beside the run
        choice = layout_choice.choose_layout(config, image_shape[1:], devices, cache_dir=config.output_dir, log=log)
        log(f"input_partition_dims auto: {','.join(map(str, choice.input_partition_dims))}"
            f"{' (as chosen before for this config and these devices)' if choice.cached else ''}, {choice.reason}")
        config = config_lib.with_dims(config, choice.input_partition_dims)
        task = registry.make_task(config, class_names)
    # A rerun into a run's folder keeps to what the run means, checked before anything is built or written (and
    # before the split: a resume on clips of 4 frames is told the run's clip length, not to use "depth 8").
    rerun = run_record.check_rerun(config, recorded, total_steps, len(devices),
                                   continue_with_changes, log)
    partitioning.validate(
        config.partition, image_shape, len(devices), config.model.downsampling_levels, config.batch_size
    )
    distribution = device_mesh.make_distribution(config.partition, devices)
    mesh = distribution.device_mesh
    log(
        f"fullres train ({task.name}): {num_examples} training examples of {image_shape[1:-1]}, {total_steps} steps, "
        f"global batch {config.batch_size}, mesh {dict(zip(mesh.axis_names, mesh.shape))} on "
        f"{len(devices)} {devices[0].platform} device(s), {config.precision}"
        + (f"; process {jax.process_index()} of {jax.process_count()}, {jax.local_device_count()} local devices"
           if jax.process_count() > 1 else "")
    )

    # Processes meet before work that may hold collectives (building the model; placing it, below, meets
    # again): one that compiled for longer (a layout search, a loaded host) would otherwise exceed gloo's
    # 30 s on CPUs.
    distributed.wait_for_the_others("model build")
    seed(config.seed)
    with distribution.scope():
        model, optimizer, schedule, state = program.build_model(config, task, total_steps)
    compiled_step.check_thin_shards(config, model, state, image_shape)  # where XLA differentiates wrongly
    # Measured on the network as built, by the process that says it: on this host's devices alone, no collective;
    # the others go on to the gather check, and the barrier before placing the state waits for this one.
    field = task.receptive_field(model) if jax.process_index() == 0 else None
    if field is not None:
        log(f"receptive field: {field}" + ("" if field.covers else " (context beyond that cannot decide a voxel's "
                                                                  "class; more levels widen it)"))
    # The step as the compiler compiles it, read for activation all-gathers before anything is written.
    train_step = distributed.RunTogether(
        program.jit_step(task, model, optimizer, distribution, state, len(image_shape), config.kernels), "train step",
        log)
    found = compiled_step.step_gathers(train_step.jitted, task, state, distribution, image_shape,
                                       keep=train_step.prime)
    if found and not config.allow_gathers:
        gathers.refuse(found, config.partition.input_partition_dims)
    if found:
        log(f"warning: the training step all-gathers whole activations (--allow-gathers): {gathers.summary(found)}")

    start_step = 0
    state = placement.place_state(state, distribution)
    checkpointer = checkpoints.Checkpointer(run_files.path(config.output_dir, run_files.CHECKPOINTS),
                                            keep=config.keep_checkpoints)
    # Checked before anything is written: a rerun refused here leaves the finished run as it was.
    restored = checkpointer.restore_latest(state, log)
    if restored is not None:
        state, start_step = restored
        log(f"resuming from checkpoint at step {start_step}")
    os.makedirs(config.output_dir, exist_ok=True)
    is_chief = jax.process_index() == 0
    if is_chief:
        trained_run.save_description(config.output_dir, config, task, image_shape[1:])
        run_record.record(config.output_dir, {**rerun, "step": start_step})
        if choice is not None and not choice.cached:
            layout_choice.save_choice(choice, config.output_dir)
    return Run(config, task, total_steps, num_examples, image_shape, choice, distribution, model, optimizer, schedule,
                state, start_step, checkpointer, run_files.read_history(config.output_dir, start_step), is_chief,
                train_step)
