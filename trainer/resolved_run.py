"""A training run resolved and checked before it starts: the one phase of `fullres train` that refuses a run.

`train` runs in four phases: `resolve` (here) → `run_setup.set_up` → `train_loop.loop` → `train._finish`. Everything
a run is checked for before it starts is asked in `resolve`, in this order, each refusal one sentence, every folder
left as it was:

1. the run folder and the devices (`resume_check`): a damaged run, a model without its checkpoints, a split the
   devices present cannot hold (a resume: by the device counts its run fits);
2. the data: records the task can use (`Task.check_data`), held-out data preprocessed as the training data (each
   data set's fingerprint read once: `data_set.fingerprint`);
3. the network: a user's file, function and output, and its measured downsampling;
4. the output: a folder another run is writing (its lock, taken first and held from here to the end), a folder
   fullres did not write or one that overlaps the data (`output_guard`);
5. the partition: "auto" chosen for the devices present and the data's shape (`layout_choice`);
6. the resume: a rerun keeps to what the run means (`run_record.check_rerun`);
7. the partition against the devices and the batch (`replicas.validate`), and the data's shape (`partitioning`).

It returns a `ResolvedRun`: the config with its partition resolved, the task, the shapes, steps and warm-up, and what the
run's record will say. Set-up and the loop trust it and check none of it again; what they can still refuse is
what only the built program shows (a split XLA would differentiate wrongly for a user's network, all-gathered
activations, a checkpoint written by another configuration).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence

from common import output_guard, output_lock
from preprocessing.records import data_set
from trainer import config as config_lib, trained_run
from trainer.engine import program, resume_check, run_data, run_record
from trainer.parallel import partitioning, replicas
from trainer.plan import layout_choice
from trainer.tasks import registry


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """A run as `resolve` checked it: what set-up builds and the loop trains, nothing left to refuse in it."""

    config: config_lib.TrainConfig  # its partition resolved ("auto" chosen)
    task: object  # tasks.base.Task, made for `config`
    num_examples: int
    total_steps: int  # from `steps`, or `epochs` over the examples
    warmup_steps: int  # the warm-up it takes: `config.warmup_steps` cut to end before the last step (`program`)
    image_shape: tuple[int, ...]  # one global batch: (B, D, H, W, C) or (B, H, W, C)
    devices: tuple  # jax.devices(): the run's, all processes'
    choice: layout_choice.LayoutChoice | None  # "auto": the layout chosen and why; None where it was given
    rerun: dict  # the history line `run_record.record` writes once training starts (`run_record.check_rerun`)
    eval_note: str | None  # --eval scored across preprocessings (`run_data.check_eval`), in words
    warnings: tuple[str, ...]  # said once nothing can refuse the run any more (the warm-up cut short)


def resolve(config: config_lib.TrainConfig, held: contextlib.ExitStack, log: Callable[[str], None] = print,
            continue_with_changes: bool = False, eval_across_preprocessings: bool = False,
            class_names: Sequence[str] | None = None) -> ResolvedRun:
    """Checks the run `config` describes and resolves what it leaves open.

    Args:
        config: the run as given; its partition may be "auto".
        held: process 0 takes the output's lock into it once the output is judged safe, and holds it until
            `held` closes (`train` sets the run up and trains it inside).
        log: where the "auto" choice and the settings a resume changes freely are said.
        continue_with_changes: a rerun that changes what the run means goes on (`run_record.check_rerun`).
        eval_across_preprocessings: held-out data preprocessed otherwise are scored, with a note (`run_data`).
        class_names: the classes' names, background first, where the training data's label_map.json names none
            (`registry.make_task`); a resume without them keeps those the run recorded.

    Raises:
        Every refusal `train.train` lists but those of the built program (see above).
    """
    import jax

    if not config.train_data or not config.output_dir:
        raise ValueError("TrainConfig needs train_data (a TFRecord pattern) and output_dir.")
    devices = tuple(jax.devices())
    resume_check.check(config, len(devices))  # the run folder a rerun resumes, and a split the devices cannot hold
    # The data are judged before the output: a run refused for its data leaves no run folder behind.
    task = registry.make_task(config, class_names)
    task.check_data(config.train_data, "--train", training=True)
    trained_on = data_set.fingerprint(config.train_data)  # the data as their preprocessing recorded them, read once
    eval_note = None
    if config.eval_data:
        task.check_data(config.eval_data, "--eval", training=False)
        held_out = data_set.fingerprint(config.eval_data)
        eval_note = run_data.check_eval(trained_on, f"--train {config.train_data}", config.eval_data, held_out,
                                        eval_across_preprocessings)
    # The network's own checks: a user's network is loaded and measured here (its file, its function, its output).
    levels = config.model.downsampling_levels
    if jax.process_index() == 0:  # the lock first, as every command takes it: no other run writes the folder judged
        held.enter_context(output_lock.lock(config.output_dir))
    output_guard.check_run_directory(config.output_dir, {"training data": config.train_data,
                                                         "evaluation data": config.eval_data})
    num_examples = task.num_examples()
    total_steps = config.steps if config.epochs is None else config.epochs * math.ceil(
        num_examples / config.batch_size)
    image_shape = (config.batch_size, *task.example_shape())  # (B, D, H, W, 1) or (B, H, W, 3)
    choice = None
    if config.partition.is_auto:  # chosen now that the devices and the volume are known; cached beside the run
        choice = layout_choice.choose_layout(config, image_shape[1:], devices, cache_dir=config.output_dir,
                                             log=log)
        log(f"input_partition_dims auto: {','.join(map(str, choice.input_partition_dims))}"
            f"{' (as chosen before for this config and these devices)' if choice.cached else ''}, {choice.reason}")
        config = config_lib.with_dims(config, choice.input_partition_dims)
    warmup_steps, warmup = program.warmup_steps_used(config, total_steps), program.warmup_note(config, total_steps)
    # Before the split: a resume on clips of 4 frames is told the run's clip length, not to use "depth 8".
    recorded = trained_run.read_record(config.output_dir)
    rerun = run_record.check_rerun(config, recorded, total_steps, len(devices), warmup_steps, continue_with_changes,
                                   log, trained_on=trained_on)
    named = recorded.info.get("class_names")  # a resume keeps the names the run was given (a pipeline's)
    kept_names = not class_names and named and named != task.class_names
    if choice is not None or kept_names:  # the task of the run as resolved: its chosen split, its names
        task = registry.make_task(config, named if kept_names else class_names)
    dimension_names = registry.dimension_names(task)  # a clip's first axis: its length
    replicas.validate(config.partition, len(devices), config.batch_size)
    partitioning.validate(config.partition, image_shape, downsampling_levels=levels, dimension_names=dimension_names)
    return ResolvedRun(config, task, num_examples, total_steps, warmup_steps, image_shape, devices, choice, rerun,
                       eval_note, () if warmup is None else (warmup,))
