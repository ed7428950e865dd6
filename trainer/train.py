"""The training run, segmentation or detection: data, partitioned steps, checkpoints, export.

`train(config)` is the library entry point; `python -m trainer train` and
`fullres train` parse arguments into a `TrainConfig` and call it.

Output directory (each file has one owning module: `engine.run_files`, `engine.checkpoints`, `plan.layout_choice`):
    checkpoints/XXXXXXXX/           Orbax checkpoints every `checkpoint_every` steps; a rerun resumes
    tensorboard/                    loss, learning rate, gradient norm, Dice or mAP
    history.jsonl                   one line per logged step (survives resumes)
    train_config.json               the run's TrainConfig (read back by evaluation and export)
    layout_choice.json              with input_partition_dims "auto": the layout chosen and why (reused while
                                    the config and the devices stay the same)
    model_info.json                 the task, the shape of one input, detection class names, the preprocessing
    model.keras, saved_model/       the trained model
    metrics.json                    final loss, per-class Dice or COCO AP, timing, partitioning

`_train` reads as its three parts: `_set_up` (task, layout, mesh, model, the resumed state), `_loop` (the
steps, logging, checkpoints, preemption) and `_finish` (evaluation, export, metrics.json).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable

import numpy as np

from common import output_guard
from trainer import config as config_lib, export, trained_run
from trainer.data import ct_input
from trainer.engine import checkpoints, placement, plateau, program, resume_devices, run_files, run_record, scalars
from trainer.parallel import distributed, partitioning
from trainer.plan import compiled_step, gathers, layout_choice
from trainer.tasks import registry


def train(config: config_lib.TrainConfig, log: Callable[[str], None] = print, export_saved_model: bool = True,
          continue_with_changes: bool = False, eval_across_preprocessings: bool = False) -> dict:
    """Trains (or resumes) the model `config` describes; returns the metrics dict.

    A rerun into a run's folder resumes it only as it was (`engine.run_record`) unless `continue_with_changes`;
    `--eval` data preprocessed otherwise than `--train` are refused unless `eval_across_preprocessings`.

    `model.keras` and `train_config.json` are always written; the SavedModel
    only with `export_saved_model` (the pipeline exports in its own step).
    The output directory must be new, empty, or an earlier run (resumed), and
    outside the data's directories; the first process holds its lock while it
    trains. A rerun refused for its configuration leaves the run untouched.

    In a multi-process run (`distributed.initialize` first) every process calls
    this with the same config: each reads only the rows of every global batch
    its devices hold, all write the checkpoints together, and process 0 alone
    writes the other files. At a preemption notice (SIGTERM) every process
    finishes the same step, the checkpoint of that step is written, and
    `distributed.Preempted` is raised.

    Raises:
        partitioning.PartitionError: the partitioning does not fit the data or devices.
        FileNotFoundError: no training data matches `config.train_data`, or it has no summary.json.
        ValueError: data the task cannot use (`Task.check_data`: unlabelled, mixed shapes, another task's records,
            data sets that differ).
        output_guard.OutputRefused: the output is unsafe (see `output_guard.check_run_directory`) or in use.
        run_record.RunChanged: the rerun changes a setting that defines the run, or asks for fewer steps than done.
        ValueError: the run's newest checkpoint was written by another configuration.
        user_model.UserModelError: a user's network (`--model FILE.py:FUNCTION`) cannot be loaded or breaks the
            contract (a ValueError).
        gathers.GathersRefused: the compiled step all-gathers activations and `config.allow_gathers` is False.
        checkpoints.CheckpointDamaged: no checkpoint of the run can be read (a damaged one is otherwise passed
            over for the one before it, and moved aside).
        distributed.Preempted: after checkpointing at a preemption notice; rerun to resume.
    """
    import jax

    if not config.train_data or not config.output_dir:
        raise ValueError("TrainConfig needs train_data (a TFRecord pattern) and output_dir.")
    if not config.partition.is_auto:  # a split the devices cannot hold is named before the data are read (a resume:
        resume_devices.check(config, jax.device_count())  # by the device counts its run fits)
    # The data are judged before the output: a run refused for its data leaves no run folder behind.
    task = registry.make_task(config)
    task.check_data(config.train_data, "--train", training=True)
    eval_note = None
    if config.eval_data:
        task.check_data(config.eval_data, "--eval", training=False)
        eval_note = run_record.check_eval(run_record.data_fingerprint(config.train_data), f"--train {config.train_data}",
                                          config.eval_data, eval_across_preprocessings)
    # The network's own checks (a user's: its file, its function, its output; measured downsampling), before the
    # output is touched.
    partitioning.per_axis(config.model.downsampling_levels, config.model.spatial_dims)
    run_record.check_resumable(config.output_dir)  # a damaged train_config.json, or a model without checkpoints
    output_guard.check_run_directory(config.output_dir, {"training data": config.train_data,
                                                         "evaluation data": config.eval_data})
    chief_lock = output_guard.lock(config.output_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with chief_lock:
        return _train(config, log, export_saved_model, continue_with_changes, eval_note)


@dataclasses.dataclass
class _Run:
    """What `_set_up` prepares for the loop and the finish."""

    config: config_lib.TrainConfig
    task: object  # tasks.base.Task
    total_steps: int
    num_examples: int
    image_shape: tuple[int, ...]  # (B, D, H, W, 1) or (B, H, W, 3)
    choice: object  # layout_choice.LayoutChoice, or None when the layout was given
    distribution: partitioning.SpatialParallel
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
    eval_note: str | None = None  # --eval scored across preprocessings (`run_record.check_eval`), in words


def _train(config: config_lib.TrainConfig, log: Callable[[str], None], export_saved_model: bool,
           continue_with_changes: bool, eval_note: str | None = None) -> dict:
    """`train`, once the output directory is known to be safe and this process holds it."""
    run = _set_up(config, log, continue_with_changes)
    run.eval_note = eval_note
    writer = scalars.writer(os.path.join(config.output_dir, "tensorboard")) if run.is_chief else None
    try:
        train_seconds = _loop(run, writer, log)
        return _finish(run, writer, train_seconds, export_saved_model, log)
    finally:
        if writer is not None:
            writer.close()


def _seed(seed: int) -> None:
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


def _set_up(config: config_lib.TrainConfig, log: Callable[[str], None], continue_with_changes: bool = False) -> _Run:
    """Task, layout, mesh, model and the state to start from; the run's config files written (process 0)."""
    import jax

    task = registry.make_task(config)
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
        task = registry.make_task(config)
    partitioning.validate(
        config.partition, image_shape, len(devices), config.model.downsampling_levels, config.batch_size
    )
    # A rerun into a run's folder keeps to what the run means, checked before anything is built or written.
    rerun = run_record.check_rerun(config, trained_run.read_record(config.output_dir), total_steps, len(devices),
                                   continue_with_changes, log)
    distribution = partitioning.make_distribution(config.partition, devices)
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
    _seed(config.seed)
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
        program.jit_step(task, model, optimizer, distribution, state, len(image_shape)), "train step", log)
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
    return _Run(config, task, total_steps, num_examples, image_shape, choice, distribution, model, optimizer, schedule,
                state, start_step, checkpointer, run_files.read_history(config.output_dir, start_step), is_chief,
                train_step)


def _loop(run: _Run, writer, log: Callable[[str], None]) -> float:
    """The training steps from `run.start_step` on; returns their seconds.

    Raises:
        distributed.Preempted: at a preemption notice, after the checkpoint of the step every process reached.
    """
    import jax

    config, task, distribution, image_shape = run.config, run.task, run.distribution, run.image_shape
    train_step = run.train_step
    image_sharding = distribution.get_data_layout(image_shape).backend_layout
    log(f"each device holds a {tuple(image_sharding.shard_shape(tuple(image_shape)))} shard of every {tuple(image_shape)} "
        f"batch (input_partition_dims {','.join(map(str, config.partition.input_partition_dims))})")
    share = placement.process_share(image_sharding, image_shape) if jax.process_count() > 1 else None
    if share is not None and share.depth is not None:
        log(f"process {jax.process_index()} reads depths {share.depth[0]}-{share.depth[1] - 1} of rows "
            f"{','.join(map(str, share.rows))} of every batch")
    batches = task.batches(run.start_step, share, log)
    state, history = run.state, run.history
    in_flight = collections.deque()  # (host batch, its step's metrics): its buffer is reused once the step is done

    started = time.perf_counter()
    window, compiled_at, watch = _Window(started), None, plateau.PlateauWatch()  # watch: a plateau, said once
    try:
        for step_number in range(run.start_step, run.total_steps):
            waiting = time.perf_counter()
            batch = next(batches)
            waited_now = time.perf_counter() - waiting
            window.input_wait += waited_now
            if compiled_at is not None:
                run.input_wait_seconds += waited_now
            inputs, labels = task.place(distribution, batch, share)
            state, step_metrics = train_step(state, inputs, labels, np.int32(step_number))
            compiled_at = compiled_at or time.perf_counter()  # the run's input wait is judged after the compile
            in_flight.append((batch, step_metrics))
            while len(in_flight) > 1:  # at most this step and the next in flight; the one before is done with its input
                done_batch, done_metrics = in_flight.popleft()
                jax.block_until_ready(done_metrics)
                done_batch.release()
            done = step_number + 1
            preempted = distributed.preemption_reached(done)  # the same step on every process
            window.steps += 1
            if done % config.log_every == 0 or done == run.total_steps:
                loss = float(step_metrics["loss"])
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"the loss became {loss} at step {done}; lower the learning rate (now {config.learning_rate}) "
                        "or use precision float32."
                    )
                rate, waited = window.close(time.perf_counter())
                learning_rate = float(run.schedule(step_number))
                history.append({"step": done, "loss": loss, "learning_rate": learning_rate,
                                "input_wait": round(waited, 4)})
                log(f"step {done}/{run.total_steps}  loss {loss:.4f}  lr {learning_rate:.2e}  {rate:.2f} steps/s  "
                    f"input wait {waited:.0%}{_input_bound_note(waited, batches)}")
                if "class_dice" in step_metrics and (stalled := watch.observe(done, loss, step_metrics["class_dice"])):
                    log(stalled)
                if writer is not None:
                    writer.scalars(done, {"loss": loss, "learning_rate": learning_rate,
                                          "grad_norm": float(step_metrics["grad_norm"]), "input_wait_fraction": waited})
            if preempted or done % config.checkpoint_every == 0 or done == run.total_steps:
                if run.is_chief:
                    # History first: a run killed between the two resumes from the older checkpoint and drops the
                    # newer lines, whereas the other order would resume past lines that were never written.
                    run_files.write_history(config.output_dir, history)
                run.checkpointer.save(done, state)  # every process writes its part
            if preempted and done < run.total_steps:
                run.checkpointer.close()
                log(f"preemption notice: stopped after step {done}, checkpoint written")
                raise distributed.Preempted(done)
        for done_batch, done_metrics in in_flight:
            jax.block_until_ready(done_metrics)
            done_batch.release()
        run.checkpointer.close()
        run.input_cache = getattr(batches, "cache_reason", None)  # the CT input says whether it caches, and why
    finally:
        batches.close()  # the reading threads stop (a generator's close, for detection)
    run.state = state
    finished = time.perf_counter()
    run.input_wait_fraction = run.input_wait_seconds / (finished - compiled_at) if compiled_at else 0.0
    return finished - started


INPUT_BOUND = 0.5  # a logging window that waited for input this much of its time is input-bound


def _input_bound_note(waited: float, batches) -> str:
    """', input-bound: ...' with what would help, when the window waited for input `INPUT_BOUND` of its time."""
    if waited < INPUT_BOUND:
        return ""
    helps = ["more host cores"]
    if getattr(batches, "cached", True) is False:
        helps.append("the input cache (--input-cache on, if the data set fits in memory)")
    if getattr(getattr(batches, "records", None), "compressed", False):
        helps.append("uncompressed records (fullres preprocess without --compress)")
    return f" (input-bound: the accelerators waited for input; {', or '.join(helps)} would help)"


@dataclasses.dataclass
class _Window:
    """One logging window: its start, steps, and the seconds the loop waited for input in it."""

    start: float
    steps: int = 0
    input_wait: float = 0.0

    def close(self, now: float) -> tuple[float, float]:
        """(steps per second, fraction of the window spent waiting for input); starts the next window."""
        seconds = max(now - self.start, 1e-9)
        result = (self.steps / seconds, min(1.0, self.input_wait / seconds))
        self.start, self.steps, self.input_wait = now, 0, 0.0
        return result


def _finish(run: _Run, writer, train_seconds: float, export_saved_model: bool, log: Callable[[str], None]) -> dict:
    """Evaluation, the exported model and metrics.json (process 0); returns the metrics."""
    import jax

    config, task, history, mesh = run.config, run.task, run.history, run.distribution.device_mesh
    results = {
        "task": task.name,
        "steps": run.total_steps,
        "resumed_from_step": run.start_step,
        "final_loss": history[-1]["loss"] if history else None,
        "loss_history": [[e["step"], e["loss"]] for e in history],
        "train_seconds": round(train_seconds, 3),
        "steps_per_second": round((run.total_steps - run.start_step) / train_seconds, 4) if train_seconds > 0 else None,
        "input_wait_fraction": round(run.input_wait_fraction, 4),
        "input_bound": run.input_wait_fraction >= INPUT_BOUND,
        **({"input_cache": run.input_cache} if run.input_cache else {}),
        "training_examples": run.num_examples,
        "image_shape": list(run.image_shape[1:]),
        "trained_on": "whole volumes" if config.patch_size is None else "patches",
        "input_partition_dims": list(config.partition.input_partition_dims),
        **({"layout_choice": {k: v for k, v in run.choice.to_json().items() if k != "rows"}} if run.choice else {}),
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.shape)},
        "precision": config.precision,
        **task.input_counts(),  # e.g. detection boxes beyond max_boxes
        "config": config_lib.to_dict(config),
    }
    if config.eval_data:
        log(f"evaluating on {config.eval_data}")
        scores = task.evaluate(run.model, run.state, run.distribution, log)
        results.update(scores, **({"across_preprocessings": run.eval_note} if run.eval_note else {}))
        if run.eval_note:
            log(f"warning: {run.eval_note}")
        if writer is not None:
            writer.scalars(run.total_steps, task.headline(scores))
    # Every process takes the weights to its host (replicated, so no communication); process 0 alone exports,
    # from a copy of the model outside the mesh: the mesh's model would run on every process's devices.
    host_state = jax.tree_util.tree_map(np.asarray, run.state)
    if run.is_chief:
        model = task.build_model()
        optimizer = program.build_optimizer(config, run.schedule)
        placement.write_state_to_model(host_state, model, optimizer)
        if export_saved_model:
            ct_input.hide_accelerators_from_tensorflow()  # TensorFlow's first use in a training process
            results["model"] = export.export_model(model, config.output_dir, run.image_shape)
        else:
            trained_run.save_model(model, run_files.path(config.output_dir, run_files.MODEL))
            results["model"] = {"keras": run_files.path(config.output_dir, run_files.MODEL)}
        log(f"wrote {run_files.write_metrics(config.output_dir, results)}")
    return results

