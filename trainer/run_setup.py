"""A training run's set-up: the layout and mesh, the model, the compiled step checked for gathers, and the state to
start from (a resume's checkpoint), with the run's files written and its TensorBoard writer opened by process 0.

It takes the run as `resolved_run.resolve` checked it and checks none of that again; what it can still refuse is
what only the built program shows (a split XLA would differentiate wrongly for a user's network, all-gathered
activations, a checkpoint written by another configuration), before anything is written. The loop (`train_loop`)
and the finish (`train._finish`) only add to a run that `set_up` accepted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable

import numpy as np

from trainer import resolved_run
from trainer.engine import checkpoints, kernel_choice, placement, program, run_files, run_record, scalars, step
from trainer.models import user_model
from trainer.parallel import device_mesh, distributed, thin_shards, xla_compile
from trainer.plan import gathers, layout_choice


@dataclasses.dataclass
class Run:
    """What `set_up` prepares for the loop and the finish."""

    resolved: resolved_run.ResolvedRun  # the config, task, shapes and steps, as checked
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
    writer: object | None  # scalars.writer of tensorboard/ (process 0; None on the others), closed when `held` closes
    input_wait_seconds: float = 0.0  # the loop's time waiting for its next batch, after the first step (the compile)
    input_wait_fraction: float = 0.0  # of the run's time after the first step
    input_cache: str | None = None  # the input cache's decision, in words


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


def set_up(resolved: resolved_run.ResolvedRun, held: contextlib.ExitStack, log: Callable[[str], None]) -> Run:
    """Mesh, model, the compiled step and the state to start from; the run's files written and its TensorBoard
    writer opened (process 0), the writer closed when `held` closes."""
    import jax

    config, task, image_shape, devices = resolved.config, resolved.task, resolved.image_shape, resolved.devices
    seed(config.seed)
    distribution = device_mesh.make_distribution(config.partition, devices)
    mesh = distribution.device_mesh
    log(
        f"fullres train ({task.name}): {resolved.num_examples} training examples of {image_shape[1:-1]}, "
        f"{resolved.total_steps} steps, global batch {config.batch_size}, mesh "
        f"{dict(zip(mesh.axis_names, mesh.shape))} on {len(devices)} {devices[0].platform} device(s), {config.precision}"
        + (f"; process {jax.process_index()} of {jax.process_count()}, {jax.local_device_count()} local devices"
           if jax.process_count() > 1 else "")
    )

    # Processes meet before work that may hold collectives (building the model; placing it, below, meets
    # again): one that compiled for longer (a layout search, a loaded host) would otherwise exceed gloo's
    # 30 s on CPUs.
    distributed.wait_for_the_others("model build")
    with distribution.scope():
        model, optimizer, schedule, state = program.build_model(config, task, resolved.total_steps,
                                                                 resolved.warmup_steps)
    if isinstance(config.model, user_model.UserModelConfig):  # a split where XLA would differentiate it wrongly
        thin_shards.check_model(model, state, config.partition.input_partition_dims, image_shape)
    # Measured on the network as built, by the process that says it: on this host's devices alone, no collective;
    # the others go on to the gather check, and the barrier before placing the state waits for this one.
    field = task.receptive_field(model) if jax.process_index() == 0 else None
    if field is not None:
        log(f"receptive field: {field}" + ("" if field.covers else " (context beyond that cannot decide a voxel's "
                                                                  "class; more levels widen it)"))
    recorded = run_files.read_run_record(config.output_dir).get(kernel_choice.RECORD_KEY)  # a resume keeps its choice
    kernels, jitted, arguments = step.choose_kernels(config, task, model, optimizer, distribution, state, image_shape,
                                                     log, recorded)
    # The step as the compiler compiles it, read for activation all-gathers before anything is written. The first
    # step runs this executable (`prime`) rather than compiling it again: in several processes JAX's persistent
    # cache would not serve it back (a process reads only what was written under its own key, and JAX writes from
    # process 0 alone except on CPU: `distributed._cache_cpu_programs_of_every_process`).
    train_step = distributed.RunTogether(jitted, "train step", log)
    lowered = jitted.lower(*arguments)
    compiled, options = xla_compile.compile(lowered)
    train_step.prime(compiled, *arguments, options=options)
    found = gathers.of_step(lowered, compiled, image_shape[0] // distribution.num_replicas,
                            gathers.weight_shapes(arguments[0]))
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
    for warning in resolved.warnings:  # nothing refuses the run any more
        log(warning)
    os.makedirs(config.output_dir, exist_ok=True)
    is_chief = jax.process_index() == 0
    if is_chief:
        run_files.save_description(config.output_dir, config, task, image_shape[1:])
        run_record.record(config.output_dir, {**resolved.rerun, "step": start_step})
        if kernels.record is not None:
            run_record.record_kernel_choice(config.output_dir, kernels.record)
        if resolved.choice is not None and not resolved.choice.cached:
            layout_choice.save_choice(resolved.choice, config.output_dir)
    writer = scalars.writer(os.path.join(config.output_dir, "tensorboard")) if is_chief else None
    if writer is not None:
        held.callback(writer.close)
    return Run(resolved, distribution, model, optimizer, schedule, state, start_step, checkpointer,
               run_files.read_history(config.output_dir, start_step), is_chief, train_step, writer)
