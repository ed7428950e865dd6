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

`train` reads as its phases: `resolved_run.resolve` (every check a run is refused for, the partition and the
resume resolved), `run_setup.set_up` (mesh, model, the compiled step, the resumed state, the run's files and its
TensorBoard writer), `train_loop.loop` (the steps, logging, checkpoints, preemption) and `_finish` (evaluation,
export, metrics.json).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np

from trainer import config as config_lib, export, resolved_run, run_setup, train_loop
from trainer.data import ct_input
from trainer.engine import placement, run_files


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
    # Process 0 holds the output's lock from its check to the end, and closes the run's TensorBoard writer before it.
    with contextlib.ExitStack() as held:
        resolved = resolved_run.resolve(config, held, log, continue_with_changes, eval_across_preprocessings,
                                        class_names)
        run = run_setup.set_up(resolved, held, log)
        train_seconds = train_loop.loop(run, log)
        return _finish(run, train_seconds, export_saved_model, log)


def _finish(run: run_setup.Run, train_seconds: float, export_saved_model: bool, log: Callable[[str], None]) -> dict:
    """Evaluation, the exported model and metrics.json (process 0); returns the metrics."""
    import jax

    resolved, history, mesh = run.resolved, run.history, run.distribution.device_mesh
    config, task = resolved.config, resolved.task
    results = {
        "task": task.name,
        "steps": resolved.total_steps,
        "resumed_from_step": run.start_step,
        "final_loss": history[-1]["loss"] if history else None,
        "loss_history": [[e["step"], e["loss"]] for e in history],
        "train_seconds": round(train_seconds, 3),
        "steps_per_second": round((resolved.total_steps - run.start_step) / train_seconds, 4) if train_seconds > 0 else None,
        "input_wait_fraction": round(run.input_wait_fraction, 4),
        "input_bound": run.input_wait_fraction >= train_loop.INPUT_BOUND,
        **({"input_cache": run.input_cache} if run.input_cache else {}),
        "training_examples": resolved.num_examples,
        "image_shape": list(resolved.image_shape[1:]),
        "trained_on": "whole volumes" if config.patch_size is None else "patches",
        "input_partition_dims": list(config.partition.input_partition_dims),
        **({"layout_choice": {k: v for k, v in resolved.choice.to_json().items() if k != "rows"}}
           if resolved.choice else {}),
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.shape)},
        "precision": config.precision,
        **task.input_counts(),  # e.g. detection boxes beyond max_boxes
        "config": config_lib.to_dict(config),
    }
    if config.eval_data:
        log(f"evaluating on {config.eval_data}")
        scores = task.evaluate(run.model, run.state, run.distribution, log)
        results.update(scores, **({"across_preprocessings": resolved.eval_note} if resolved.eval_note else {}))
        if resolved.eval_note:
            log(f"warning: {resolved.eval_note}")
        if run.writer is not None:
            run.writer.scalars(resolved.total_steps, task.headline(scores))
    # Every process takes the weights to its host (replicated, so no communication); process 0 alone exports,
    # from a copy of the model outside the mesh: the mesh's model would run on every process's devices.
    host_state = jax.tree_util.tree_map(np.asarray, run.state)
    if run.is_chief:
        model = task.build_model()
        placement.write_weights_to_model(host_state, model)  # the optimizer's state stays in the checkpoints
        if export_saved_model:
            ct_input.hide_accelerators_from_tensorflow()  # TensorFlow's first use in a training process
            results["model"] = export.export_model(model, config.output_dir, resolved.image_shape)
        else:
            export.save_model(model, run_files.path(config.output_dir, run_files.MODEL))
            results["model"] = {"keras": run_files.path(config.output_dir, run_files.MODEL)}
        log(f"wrote {run_files.write_metrics(config.output_dir, results)}")
    return results
