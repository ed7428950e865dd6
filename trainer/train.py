"""The training run, segmentation or detection: data, partitioned steps, checkpoints, export.

`train(config)` is the library entry point; `python -m trainer.train` and
`fullres train` parse arguments into a `TrainConfig` and call it.

Output directory:
    checkpoints/XXXXXXXX/           Orbax checkpoints every `checkpoint_every` steps; a rerun resumes
    tensorboard/                    loss, learning rate, gradient norm, Dice or mAP
    history.jsonl                   one line per logged step (survives resumes)
    train_config.json               the run's TrainConfig (read back by evaluation and export)
    layout_choice.json              with input_partition_dims "auto": the layout chosen and why (reused while
                                    the config and the devices stay the same)
    model_info.json                 the task, the shape of one input, detection class names, the preprocessing
    model.keras, saved_model/       the trained model
    metrics.json                    final loss, per-class Dice or COCO AP, timing, partitioning
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable

import numpy as np

from preprocessing import output_guard
from trainer import checkpoints, config as config_lib, ct_input, distributed, partitioning


def random_flips(images: np.ndarray, labels: np.ndarray, seed: int, step_number: int, rows=None):
    """Flips each example along each spatial axis with probability 1/2.

    The draw depends only on (seed, step, the example's row in the global
    batch), so a resumed run augments exactly as an uninterrupted one, and a
    process holding some rows of the batch flips them as one process would.

    Args:
        images: (B, D, H, W, C) or (B, H, W, C).
        labels: (B, D, H, W) or (B, H, W).
        rows: the global batch rows these examples are (default: 0 to B - 1).
    """
    rows = list(range(images.shape[0])) if rows is None else list(rows)
    rng = np.random.default_rng([seed, step_number])
    spatial_axes = range(1, labels.ndim)
    flips = rng.random((max(rows) + 1, len(spatial_axes))) < 0.5  # (global rows, axes), drawn row by row
    images, labels = images.copy(), labels.copy()
    for example, row in enumerate(rows):
        for axis in spatial_axes:
            if flips[row, axis - 1]:
                images[example] = np.flip(images[example], axis=axis - 1)
                labels[example] = np.flip(labels[example], axis=axis - 1)
    return images, labels


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


def read_history(path: str, up_to_step: float = math.inf) -> list[dict]:
    """The logged steps in `history.jsonl` up to `up_to_step` (all of them by default); [] when there is none."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        entries = [json.loads(line) for line in file if line.strip()]
    return [e for e in entries if e["step"] <= up_to_step]


def _write_history(path: str, entries: list[dict]) -> None:
    with open(path + ".tmp", "w") as file:
        file.writelines(json.dumps(e) + "\n" for e in entries)
    os.replace(path + ".tmp", path)


def build_model(config: config_lib.TrainConfig, task, total_steps: int):
    """The model, optimizer, learning-rate schedule and initial `TrainState` of a run (`fullres plan` builds the same).

    Variables land where the caller's scope puts them: training builds inside
    its distribution's scope (replicated on the mesh); planning needs only
    their shapes and builds them once, on one device.
    """
    import keras

    from trainer import step

    model = task.build_model()
    schedule = learning_rate_schedule(config, total_steps)
    optimizer = keras.optimizers.Adam(schedule)
    return model, optimizer, schedule, step.initial_state(model, optimizer)


def jit_step(task, model, optimizer, distribution: partitioning.SpatialParallel, state, image_ndim: int):
    """The jitted, partitioned training step that `train` runs and `fullres plan` compiles ahead of time."""
    from trainer import step

    return step.jit_train_step(step.make_train_step(model, optimizer, task.loss), distribution, state,
                               image_ndim=image_ndim, label_sharding=task.label_sharding(distribution, image_ndim))


def train(config: config_lib.TrainConfig, log: Callable[[str], None] = print, export_saved_model: bool = True) -> dict:
    """Trains (or resumes) the model `config` describes; returns the metrics dict.

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
        FileNotFoundError: no training data matches `config.train_data`.
        output_guard.OutputRefused: the output is unsafe (see `output_guard.check_run_directory`) or in use.
        ValueError: the run's newest checkpoint was written by another configuration.
        distributed.Preempted: after checkpointing at a preemption notice; rerun to resume.
    """
    import jax

    if not config.train_data or not config.output_dir:
        raise ValueError("TrainConfig needs train_data (a TFRecord pattern) and output_dir.")
    ct_input.list_files(config.train_data)  # names a pattern that matches nothing before judging the output
    output_guard.check_run_directory(config.output_dir, {"training data": config.train_data,
                                                         "evaluation data": config.eval_data})
    chief_lock = output_guard.lock(config.output_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with chief_lock:
        return _train(config, log, export_saved_model)


def _train(config: config_lib.TrainConfig, log: Callable[[str], None], export_saved_model: bool) -> dict:
    """`train`, once the output directory is known to be safe and this process holds it."""
    import jax
    import keras
    import tensorflow as tf

    from trainer import export, step, tasks

    ct_input.hide_accelerators_from_tensorflow()
    task = tasks.make_task(config)
    num_examples = ct_input.count_examples(config.train_data)
    total_steps = config.steps
    if config.epochs is not None:
        total_steps = config.epochs * math.ceil(num_examples / config.batch_size)
    image_shape = (config.batch_size, *task.example_shape())  # (B, D, H, W, 1) or (B, H, W, 3)
    devices = jax.devices()
    choice = None
    if config.partition.is_auto:  # chosen now that the devices and the volume are known; cached beside the run
        from trainer import layout_choice, memory_plan

        choice = layout_choice.choose_layout(config, image_shape[1:], devices, cache_dir=config.output_dir, log=log)
        log(f"input_partition_dims auto: {','.join(map(str, choice.input_partition_dims))}"
            f"{' (as chosen before for this config and these devices)' if choice.cached else ''}, {choice.reason}")
        config = memory_plan.with_dims(config, choice.input_partition_dims)
        task = tasks.make_task(config)
    partitioning.validate(
        config.partition, image_shape, len(devices), config.model.downsampling_levels, config.batch_size
    )
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
    keras.utils.set_random_seed(config.seed)
    with distribution.scope():
        model, optimizer, schedule, state = build_model(config, task, total_steps)

    checkpoint_dir = os.path.join(config.output_dir, "checkpoints")
    history_path = os.path.join(config.output_dir, "history.jsonl")
    start_step = 0
    state = step.place_state(state, distribution)
    checkpointer = checkpoints.Checkpointer(checkpoint_dir, keep=config.keep_checkpoints)
    # Checked before anything is written: a rerun refused here leaves the finished run as it was.
    restored = checkpointer.restore_latest(state)
    if restored is not None:
        state, start_step = restored
        log(f"resuming from checkpoint at step {start_step}")
    os.makedirs(config.output_dir, exist_ok=True)
    is_chief = jax.process_index() == 0
    if is_chief:
        with open(os.path.join(config.output_dir, "train_config.json"), "w") as file:
            json.dump(config_lib.to_dict(config), file, indent=2)
        with open(os.path.join(config.output_dir, "model_info.json"), "w") as file:
            json.dump({"task": task.name, "image_shape": list(image_shape[1:]),
                       "class_names": getattr(task, "class_names", None),
                       "preprocessing": task.preprocessing()}, file)
        if choice is not None and not choice.cached:
            layout_choice.save_choice(choice, config.output_dir)
    history = read_history(history_path, start_step)

    train_step = distributed.RunTogether(jit_step(task, model, optimizer, distribution, state, len(image_shape)),
                                         "train step")
    image_sharding = distribution.get_data_layout(image_shape).backend_layout
    log(f"each device holds a {tuple(image_sharding.shard_shape(tuple(image_shape)))} shard of every {tuple(image_shape)} "
        f"batch (input_partition_dims {','.join(map(str, config.partition.input_partition_dims))})")
    rows = step.process_rows(image_sharding, image_shape) if jax.process_count() > 1 else None
    batches = task.batches(start_step, rows, log)
    writer = tf.summary.create_file_writer(os.path.join(config.output_dir, "tensorboard")) if is_chief else None

    started = time.perf_counter()
    window_start, window_steps = started, 0
    for step_number in range(start_step, total_steps):
        images, labels = next(batches)
        placed_images = step.place_batch(distribution, images, batch_size=config.batch_size, rows=rows)
        state, step_metrics = train_step(state, placed_images, task.place_labels(distribution, labels, rows))
        done = step_number + 1
        preempted = distributed.preemption_reached(done)  # the same step on every process
        window_steps += 1
        if done % config.log_every == 0 or done == total_steps:
            loss = float(step_metrics["loss"])
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"the loss became {loss} at step {done}; lower the learning rate (now {config.learning_rate}) "
                    "or use precision float32."
                )
            now = time.perf_counter()
            rate = window_steps / (now - window_start)
            window_start, window_steps = now, 0
            learning_rate = float(schedule(step_number))
            history.append({"step": done, "loss": loss, "learning_rate": learning_rate})
            log(f"step {done}/{total_steps}  loss {loss:.4f}  lr {learning_rate:.2e}  {rate:.2f} steps/s")
            if writer is not None:
                with writer.as_default(step=done):
                    tf.summary.scalar("loss", loss)
                    tf.summary.scalar("learning_rate", learning_rate)
                    tf.summary.scalar("grad_norm", float(step_metrics["grad_norm"]))
        if preempted or done % config.checkpoint_every == 0 or done == total_steps:
            if is_chief:
                # History first: a run killed between the two resumes from the older checkpoint and drops the
                # newer lines, whereas the other order would resume past lines that were never written.
                _write_history(history_path, history)
            checkpointer.save(done, state)  # every process writes its part
        if preempted and done < total_steps:
            checkpointer.close()
            if writer is not None:
                writer.close()
            log(f"preemption notice: stopped after step {done}, checkpoint written")
            raise distributed.Preempted(done)
    checkpointer.close()
    train_seconds = time.perf_counter() - started

    results = {
        "task": task.name,
        "steps": total_steps,
        "resumed_from_step": start_step,
        "final_loss": history[-1]["loss"] if history else None,
        "loss_history": [[e["step"], e["loss"]] for e in history],
        "train_seconds": round(train_seconds, 3),
        "steps_per_second": round((total_steps - start_step) / train_seconds, 4) if train_seconds > 0 else None,
        "training_examples": num_examples,
        "image_shape": list(image_shape[1:]),
        "input_partition_dims": list(config.partition.input_partition_dims),
        **({"layout_choice": {k: v for k, v in choice.to_json().items() if k != "rows"}} if choice else {}),
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.shape)},
        "precision": config.precision,
        **task.input_counts(),  # e.g. detection boxes beyond max_boxes
        "config": config_lib.to_dict(config),
    }
    if config.eval_data:
        log(f"evaluating on {config.eval_data}")
        scores = task.evaluate(model, state, distribution, log)
        results.update(scores)
        if writer is not None:
            with writer.as_default(step=total_steps):
                for name, value in task.headline(scores).items():
                    tf.summary.scalar(name, value)
    # Every process takes the weights to its host (replicated, so no communication); process 0 alone exports,
    # from a copy of the model outside the mesh: the mesh's model would run on every process's devices.
    host_state = jax.tree_util.tree_map(np.asarray, state)
    if is_chief:
        model = task.build_model()
        optimizer = keras.optimizers.Adam(schedule)
        step.write_state_to_model(host_state, model, optimizer)
        if export_saved_model:
            results["model"] = export.export_model(model, config.output_dir, image_shape)
        else:
            model.save(os.path.join(config.output_dir, "model.keras"))
            results["model"] = {"keras": os.path.join(config.output_dir, "model.keras")}
        with open(os.path.join(config.output_dir, "metrics.json"), "w") as file:
            json.dump(results, file, indent=2)
        log(f"wrote {os.path.join(config.output_dir, 'metrics.json')}")
    if writer is not None:
        writer.close()
    return results


if __name__ == "__main__":
    import sys

    from trainer import cli

    cli.main(["train", *sys.argv[1:]])
