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

`_train` reads as its three parts: `run_setup.set_up` (task, layout, mesh, model, the resumed state),
`train_loop.loop` (the steps, logging, checkpoints, preemption) and `_finish` (evaluation, export, metrics.json).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from common import output_guard, output_lock
from trainer import config as config_lib, export, run_setup, train_loop, trained_run
from trainer.data import ct_input
from trainer.engine import placement, program, resume_devices, run_data, run_files, run_record, scalars
from trainer.parallel import partitioning
from trainer.tasks import registry


def train(config: config_lib.TrainConfig, log: Callable[[str], None] = print, export_saved_model: bool = True,
          continue_with_changes: bool = False, eval_across_preprocessings: bool = False,
          class_names: Sequence[str] | None = None) -> dict:
    """Trains (or resumes) the model `config` describes; returns the metrics dict.

    A rerun into a run's folder resumes it only as it was (`engine.run_record`) unless `continue_with_changes`;
    `--eval` data preprocessed otherwise than `--train` are refused unless `eval_across_preprocessings`.

    `model.keras` and `train_config.json` are always written; the SavedModel
    only with `export_saved_model` (the pipeline exports in its own step).
    `class_names` (one per class, background first: the pipeline's) name the
    classes where the training data's label_map.json names none; the run keeps
    them in model_info.json, for evaluate's report and predict.
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
    task = registry.make_task(config, class_names)
    task.check_data(config.train_data, "--train", training=True)
    eval_note = None
    if config.eval_data:
        task.check_data(config.eval_data, "--eval", training=False)
        eval_note = run_data.check_eval(run_data.data_fingerprint(config.train_data), f"--train {config.train_data}",
                                          config.eval_data, eval_across_preprocessings)
    # The network's own checks (a user's: its file, its function, its output; measured downsampling), before the
    # output is touched.
    partitioning.per_axis(config.model.downsampling_levels, config.model.spatial_dims)
    run_record.check_resumable(config.output_dir)  # a damaged train_config.json, or a model without checkpoints
    output_guard.check_run_directory(config.output_dir, {"training data": config.train_data,
                                                         "evaluation data": config.eval_data})
    chief_lock = output_lock.lock(config.output_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with chief_lock:
        return _train(config, log, export_saved_model, continue_with_changes, eval_note, class_names)


def _train(config: config_lib.TrainConfig, log: Callable[[str], None], export_saved_model: bool,
           continue_with_changes: bool, eval_note: str | None = None,
           class_names: Sequence[str] | None = None) -> dict:
    """`train`, once the output directory is known to be safe and this process holds it."""
    run = run_setup.set_up(config, log, continue_with_changes, class_names)
    run.eval_note = eval_note
    writer = scalars.writer(os.path.join(config.output_dir, "tensorboard")) if run.is_chief else None
    try:
        train_seconds = train_loop.loop(run, writer, log)
        return _finish(run, writer, train_seconds, export_saved_model, log)
    finally:
        if writer is not None:
            writer.close()


def _finish(run: run_setup.Run, writer, train_seconds: float, export_saved_model: bool, log: Callable[[str], None]) -> dict:
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
        "input_bound": run.input_wait_fraction >= train_loop.INPUT_BOUND,
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
