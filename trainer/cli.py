"""The trainer's commands (`fullres train`, `fullres plan`); `pipelines/cli.py` adds them, and `fullres predict`
(`cli_predict`), to the `fullres` command line.

Commands import their heavy libraries (JAX, Keras, TensorFlow) only when they
run, so `--help` is instant and `--virtual-devices` can still set `XLA_FLAGS`
before JAX starts (`cli_options`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from common import console, parsing
from trainer import cli_help, cli_rent, cli_options

app = typer.Typer(
    rich_markup_mode=None,
    name="fullres",
    help="Train a UNet or a RetinaNet, spatially partitioned over all devices present.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PRESET_NAMES = ("default", "demo", "smoke", "ct_256", "nnunet", "detection", "detection_2560", "detection_demo", "video")


@app.callback()
def global_options(
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the traceback behind an error (e.g. fullres --verbose train ...; or set FULLRES_VERBOSE=1).")] = False,
) -> None:
    if verbose:
        os.environ["FULLRES_VERBOSE"] = "1"  # read by console.fail, here and in the processes a command starts


@app.command()
def train(
    output: Annotated[Path, typer.Option(help="Output directory; a rerun into it resumes from the newest checkpoint, with the run's recorded settings for every option it leaves out.")],
    train_data: Annotated[str | None, typer.Option("--train", help="The training data set: its folder (the --output of fullres preprocess) or a pattern of its records, e.g. 'data/ct' or 'out/*/data-*'; several separated by commas, e.g. data/a,data/b. A resume (--output holds a run) may leave it out, as any option: the run's recorded value is used.")] = None,
    eval_data: Annotated[str | None, typer.Option("--eval", help="Held-out data set (a folder or a pattern of records, as --train), scored at the end (Dice, or COCO mAP).")] = None,
    task: Annotated[str, typer.Option(help="segmentation (3D/2D UNet on CT records) or detection (RetinaNet on image records).")] = "segmentation",
    model: Annotated[str | None, typer.Option(help="Your own network instead of fullres's UNet: FILE.py:FUNCTION, where FUNCTION(num_classes=..., in_channels=...) returns an uncompiled keras.Model (channels-last in, num_classes logits out at the input's resolution); the run keeps a copy of the file.")] = None,
    allow_gathers: Annotated[bool | None, typer.Option("--allow-gathers/--no-allow-gathers", help="Train even when the compiled step all-gathers whole activations (the layers are named; without this, training refuses to start).")] = None,
    preset: Annotated[str, typer.Option(help=f"Starting configuration: one of {', '.join(PRESET_NAMES)}; 'default' is the task's default.")] = "default",
    steps: Annotated[int | None, typer.Option(help="Optimizer steps in total.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Train this many passes over the data instead of --steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Global batch size, split over the replicas.")] = None,
    learning_rate: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="Linear warm-up steps.")] = None,
    schedule: Annotated[str | None, typer.Option(help="Learning-rate schedule after warm-up: cosine, poly (nnU-Net's: (1 - step/steps)^0.9) or constant.")] = None,
    optimizer: Annotated[str | None, typer.Option(help="adam, or sgd (Nesterov momentum 0.99, as nnU-Net; --set momentum=... to change it).")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="Weight decay per step, times the learning rate (nnU-Net: 3e-5); 0 turns it off.")] = None,
    precision: Annotated[str | None, typer.Option(help="float32, or bfloat16 (mixed: bfloat16 compute, float32 weights).")] = None,
    remat: Annotated[bool | None, typer.Option("--remat/--no-remat", help="Recompute activations in the backward pass to save memory.")] = None,
    input_partition_dims: Annotated[
        str | None,
        typer.Option(help="Split of each input across cores, one entry per NDHWC dimension, e.g. 1,4,1,1,1; auto: the split of all devices with the least halo traffic among the leanest (fullres plan --layouts all)."),
    ] = None,
    label_partition_dims: Annotated[
        str | None, typer.Option(help="'none' keeps labels whole within a replica; dims split them like the features.")
    ] = None,
    num_classes: Annotated[int | None, typer.Option(help="Segmentation: classes including background. Detection: object classes (default: from label_map.json beside the data).")] = None,
    num_levels: Annotated[int | None, typer.Option(help="UNet resolution levels (depth of the UNet).")] = None,
    base_filters: Annotated[int | None, typer.Option(help="Filters at the first UNet level.")] = None,
    stem: Annotated[str | None, typer.Option(help=cli_help.STEM_HELP)] = None,
    normalization: Annotated[str | None, typer.Option(help="instance, group, batch or none.")] = None,
    encoder: Annotated[str | None, typer.Option(help=cli_help.ENCODER_HELP)] = None,
    deep_supervision: Annotated[bool | None, typer.Option("--deep-supervision/--no-deep-supervision", help=cli_help.DEEP_SUPERVISION_HELP)] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Save a checkpoint every N steps.")] = None,
    log_every: Annotated[int | None, typer.Option(help="Log the loss every N steps.")] = None,
    augment: Annotated[bool | None, typer.Option("--augment/--no-augment", help="Segmentation: the --augmentation set (off: none). Detection: scale jitter and left-right flips.")] = None,
    augmentation: Annotated[str | None, typer.Option(help=cli_help.AUGMENTATION_HELP)] = None,
    input_cache: Annotated[str | None, typer.Option(help="Segmentation: keep this process's share of the decoded training data in memory after its first read: auto (when it fits half the memory available; the log says which was chosen and why), on or off.")] = None,
    image_size: Annotated[str | None, typer.Option(help="Detection: the H,W canvas every image is fitted to, e.g. 2560,2560.")] = None,
    max_boxes: Annotated[int | None, typer.Option(help="Detection: boxes kept per training image.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for weights, data order and augmentation.")] = None,
    patch_size: Annotated[str | None, typer.Option(help="Segmentation: train on random D,H,W crops of the volumes instead of whole volumes, a third centred on a foreground voxel (nnU-Net's patches, e.g. 128,128,128); predict and evaluation then use a sliding window of that size.")] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Any setting as a dotted key, e.g. --set model.num_levels=5 --set partition.input_partition_dims=1,4,1,1,1 (repeatable; the flags above are shorthands for these)."),
    ] = None,
    virtual_devices: Annotated[
        int | None, typer.Option(help="On a CPU, present it as this many devices (to try partitioning without accelerators).")
    ] = None,
    coordinator_address: Annotated[
        str | None, typer.Option(help="Multi-process run: HOST:PORT of process 0 (the same on every process).")
    ] = None,
    num_processes: Annotated[int | None, typer.Option(help="Multi-process run: how many processes in all.")] = None,
    process_id: Annotated[int | None, typer.Option(help="Multi-process run: this process's number, 0 to N-1.")] = None,
    local_processes: Annotated[
        int | None,
        typer.Option(help="Start this many processes here, one global mesh (with --virtual-devices K: K CPU devices each)."),
    ] = None,
    saved_model: Annotated[
        bool, typer.Option("--saved-model/--no-saved-model", help="At the end, export the TensorFlow SavedModel into OUTPUT/saved_model (--no-saved-model: model.keras only, as the pipeline's train step leaves it to its export step; a run that never exports never imports TensorFlow).")
    ] = True,
    eval_across_preprocessings: Annotated[bool, typer.Option("--eval-across-preprocessings", help="Score --eval data preprocessed otherwise than --train (another spacing, window, orientation, modality or label map); without this they are refused, and with it metrics.json says so.")] = False,
    continue_with_changes: Annotated[bool, typer.Option("--continue-with-changes", help="Rerun into an earlier run's --output with a setting that defines it changed (data preprocessing, model, patches, augmentation, partition, schedule): go on from its checkpoint under the new meaning, recorded in its run_record.json (without this, such a rerun is refused).")] = False,
    context: typer.Context = None,
) -> None:
    """Train a UNet (segmentation), a RetinaNet (detection) or your own network (--model FILE.py:FUNCTION), spatially
    partitioned over all devices present.

    Exits with status 75 ("preempted, resume me") after a SIGTERM made it checkpoint and stop.
    """
    if local_processes:
        from trainer.parallel import local_launcher

        if coordinator_address or num_processes or process_id is not None:
            console.fail("--local-processes starts the processes itself; leave out --coordinator-address, --num-processes "
                  "and --process-id.")
        raise typer.Exit(code=local_launcher.launch(cli_options.options_without(context, "local_processes"), local_processes,
                                                    log=console.say))
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        console.fail("a multi-process run needs all of --coordinator-address, --num-processes and --process-id.")
    cli_options.use_virtual_devices(virtual_devices)
    if task not in ("segmentation", "detection"):
        console.fail(f"--task {task!r} is not known; use segmentation or detection.")
    if preset not in PRESET_NAMES:
        console.fail(f"--preset {preset!r} is not known; use one of {', '.join(PRESET_NAMES)}.")
    size = None
    if image_size is not None:
        try:
            size = parsing.parse_list(image_size, int, "--image-size") or ()
        except ValueError:
            size = ()
        if len(size) != 2:
            console.fail(f"--image-size {image_size!r} is not valid; write it like 1024,1024 (height,width).")
    from trainer import config as config_lib, option_conflicts, train as train_lib
    from trainer import config_resolution
    from trainer import presets
    from trainer.engine import recorded_settings
    from trainer.parallel import distributed

    try:
        # A resume: what the command line leaves out is the run's (its data included).
        rerun = recorded_settings.fill(str(output), console.given(context), task, train_data, eval_data)
        task, train_data, eval_data, network = rerun.task, rerun.train_data, rerun.eval_data, model or rerun.network
        distributed.initialize(
            distributed.ProcessGroup(coordinator_address, num_processes, process_id) if all(given) else None
        )
        if preset != "default" and presets.PRESETS[preset]().task != task:
            console.fail(f"--preset {preset} is a {presets.PRESETS[preset]().task} preset but --task is {task}; pass "
                  f"--task {presets.PRESETS[preset]().task} or another preset.")
        unet_only = {"num_levels": num_levels, "base_filters": base_filters, "stem": stem,
                     "normalization": normalization, "encoder": encoder, "deep_supervision": deep_supervision}
        given_unet = [f"--{k.replace('_', '-')}" for k, v in unet_only.items()
                      if v is not None and f"model.{k}" not in config_lib.setting_types(task, network is not None)]
        if given_unet:
            console.fail(f"{', '.join(given_unet)} configure the UNet; they do not apply to "
                         f"{f'--model {network}' if network else f'--task {task}'}.")
        if (conflict := option_conflicts.augmentation(task, augment, augmentation, settings or [])) is not None:
            console.fail(conflict)  # an option another switches off, or one that is not the task's
        flags = {
            "steps": steps, "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
            "warmup_steps": warmup_steps, "schedule": schedule, "optimizer": optimizer, "weight_decay": weight_decay,
            "precision": precision, "remat": remat,
            "checkpoint_every": checkpoint_every, "log_every": log_every, "augment": augment,
            "augmentation": augmentation, "seed": seed,
            "input_cache": input_cache, "patch_size": patch_size,
            "image_size": size, "max_boxes": max_boxes, "model.num_classes": num_classes, "allow_gathers": allow_gathers,
            "partition.input_partition_dims": input_partition_dims,
            "partition.label_partition_dims": label_partition_dims,
            **{f"model.{k}": v for k, v in unet_only.items()},
        }
        overrides = {**flags, **(pairs := parsing.parse_settings(settings or []))}
        config = config_resolution.resolve(task, preset, train_data, str(output), eval_data, overrides=overrides, model_source=model,
                                    recorded=rerun.base, given=recorded_settings.typed_as(flags, pairs))
        recorded_settings.log_taken(rerun, overrides, model is not None, log=console.say, preset=preset)
        train_lib.train(config, log=console.say, export_saved_model=saved_model, continue_with_changes=continue_with_changes,
                        eval_across_preprocessings=eval_across_preprocessings)
    except distributed.Preempted as preempted:
        console.say(f"fullres: {preempted}")
        raise typer.Exit(code=distributed.PREEMPTED_EXIT_CODE) from None
    except (ValueError, FileNotFoundError, FloatingPointError) as error:  # PartitionError, OutputRefused: ValueErrors
        console.fail(str(error))
    except Exception as error:  # OSError, or TensorFlow's own error for a full disk (ResourceExhaustedError)
        console.fail_if_write_error(error, output)


@app.command(cls=cli_rent.PlanCommand)
def plan(
    model: Annotated[str | None, typer.Option(help="Shorthand: unet3d, unet2d (segmentation) or retinanet (detection), or your own network as FILE.py:FUNCTION (as for fullres train; 2D or 3D from --image-size); default: the preset's task.")] = None,
    preset: Annotated[str, typer.Option(help="The training preset to size, as for fullres train (default: the task's default).")] = "default",
    image_size: Annotated[str | None, typer.Option(help="Spatial size of one input, e.g. 256,256,256 (D,H,W; the default) or 2560,2560 (the detection canvas).")] = None,
    partitions: Annotated[str | None, typer.Option(help="Core counts N to compare, e.g. 1,2,4,8,16 or 64 (default 1,2,4,8,16; on a --target, those that divide its devices).")] = None,
    layouts: Annotated[str | None, typer.Option(help="default: N-way along the first spatial dimension (where that cannot divide, the dividing split of least halo, said in its row); all: every split of N over the spatial dimensions that divides, ranked (the default of --largest and of a --target generation).")] = None,
    precision: Annotated[str | None, typer.Option(help="float32 or bfloat16.")] = None,
    remat: Annotated[bool | None, typer.Option("--remat/--no-remat", help="Recompute activations in the backward pass.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Examples per replica.")] = None,
    num_levels: Annotated[int | None, typer.Option(help="UNet resolution levels (default: the preset's).")] = None,
    base_filters: Annotated[int | None, typer.Option(help="UNet filters at the first level.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels: 1 (CT, the default), 3 (RGB video clips: T,H,W as --image-size).")] = None,
    stem: Annotated[str | None, typer.Option(help=cli_help.STEM_HELP)] = None,
    encoder: Annotated[str | None, typer.Option(help=cli_help.ENCODER_HELP)] = None,
    deep_supervision: Annotated[bool | None, typer.Option("--deep-supervision/--no-deep-supervision", help=cli_help.DEEP_SUPERVISION_HELP)] = None,
    augmentation: Annotated[str | None, typer.Option(help=cli_help.AUGMENTATION_HELP)] = None,
    patch_size: Annotated[str | None, typer.Option(help="Segmentation: size the step for D,H,W crops, as fullres train --patch-size compiles it (--image-size is then the volumes' size, and --data is read as crops).")] = None,
    settings: Annotated[list[str] | None, typer.Option("--set", help="Any training setting as a dotted key, as for fullres train (repeatable).")] = None,
    device_memory: Annotated[str | None, typer.Option(help="Memory of one device, e.g. 16GiB: layouts that fit rank first, and the smallest N that fits is named.")] = None,
    target: Annotated[str, typer.Option(help="Compile for this hardware with its own compiler, without it: cpu (this machine), a TPU slice (v5e:2x2, v4:2x2x1, v5p:2x2x4, v6e:4x4, tpu7x:2x2x1) or GPUs (h100x8, h100x8x2; a100, h200, b200); TPUs need `uv sync --group tpu`, GPUs `uv sync --group cuda`. A generation alone (v5e, v5p, h100) finds its smallest slice that trains --image-size whole.")] = "cpu",
    input_partition_dims: Annotated[str | None, typer.Option(help="Plan this one layout instead of comparing, e.g. 1,8,8,1 (N is its product; --partitions is then ignored).")] = None,
    max_minutes: Annotated[float | None, typer.Option(help="On a TPU or GPU target: start no compile for it after this many minutes (the layouts left are listed).")] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="On a target: reuse figures the same compiler gave for the same step before ($FULLRES_PLAN_CACHE, default ~/.cache/fullres/target-plans).")] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print the plan as JSON: rows (input_partition_dims, rank, halo bound, estimated step time), refusals, and on a target what to launch (`launch.parameters`, which `fullres pipeline submit --plan` reads).")] = False,
    largest: Annotated[str | None, typer.Option(help=cli_help.LARGEST_HELP)] = None,
    max_seconds: Annotated[float | None, typer.Option(help=cli_help.MAX_SECONDS_HELP)] = None,
    data: Annotated[str | None, typer.Option("--data", help="Your training records (a data set folder or a pattern of its records): measure how fast this host reads one process's share of them for the chosen layout, beside the step's estimate on a --target, and say whether the input keeps up.")] = None,
) -> None:
    """Size a run before renting accelerators: per-device memory and halo traffic of the step fullres train compiles.

    With --target, the step is compiled by that hardware's own compiler (a TPU slice's libtpu, or JAX's CUDA
    plug-in) on this machine: each layout is first sized on the CPU, layouts whose CPU figure already exceeds
    the target's memory are not compiled for it, and the plan ends with what to launch.

    --largest finds the largest volume a target trains whole; --target with a generation alone (v5e, v5p, h100)
    the smallest slice of it that trains --image-size whole (compiler figures, not device measurements).
    """
    from common import sizes
    from trainer.plan import targets

    if largest is not None or max_seconds is not None or cli_rent.is_generation(target):
        flags = {"precision": precision, "remat": remat, "batch_size": batch_size, "model.num_levels": num_levels,
                 "model.base_filters": base_filters, "model.in_channels": in_channels, "model.stem": stem,
                 "model.encoder": encoder, "model.deep_supervision": deep_supervision}
        cli_rent.rent(largest=largest, target=target, model=model, preset=preset, flags=flags, settings=settings,
                      image_size=image_size, partitions=partitions, layouts=layouts, device_memory=device_memory,
                      max_seconds=max_seconds, cache=cache, json_output=json_output)
        return

    try:
        on = targets.parse(target)  # an unknown target or slice is named before anything is built
        targets.memory_per_device(on)  # as is a GPU's share that XLA_PYTHON_CLIENT_MEM_FRACTION cannot give
        asked = (parsing.parse_list(partitions, int, "--partitions", "1,2,4,8") or ()) if partitions is not None else None
        repeated = sorted({n for n in asked or () if asked.count(n) > 1})
        if repeated:  # a count given twice is planned, and shown, once
            typer.echo(f"--partitions {partitions} names {', '.join(map(str, repeated))} more than once; each count "
                       "is planned once", err=True)
            asked = tuple(dict.fromkeys(asked))
        counts = asked if asked is not None else targets.default_partitions(on)
        size = parsing.parse_list(image_size, int, "--image-size", "64,128,128") if image_size else None
        given = parsing.parse_settings(settings or [])
        dims = tuple(parsing.parse_list(input_partition_dims, int, "--input-partition-dims")) \
            if input_partition_dims else None
        if dims is not None:
            if min(dims) < 1:
                raise ValueError(f"--input-partition-dims {input_partition_dims} has an entry below 1; each is how "
                                 "many parts an axis is cut into, e.g. 1,4,1,1,1.")
            counts = asked = (math.prod(dims),)
        if max_minutes is not None and max_minutes <= 0:
            raise ValueError(f"--max-minutes {max_minutes:g} must be more than 0, e.g. --max-minutes 30.")
        if device_memory is not None:
            if sizes.parse_bytes(device_memory, "--device-memory") <= 0:
                raise ValueError(f"--device-memory {device_memory} must be more than 0, e.g. --device-memory 16GiB.")
    except ValueError as error:
        console.fail(str(error))
    if not cli_options.jax_backend_started():
        # Only the CPU platform reads this flag: on a TPU or GPU host the plan uses the
        # real devices; without an accelerator the CPU poses as enough devices.
        cli_options.set_host_device_count(max(counts, default=1))
        if target.strip().lower() != "cpu":  # the model is built on the CPU; the target's devices are compile-only
            import jax  # (JAX reads JAX_PLATFORMS when it is imported, which `trainer` may have done)

            jax.config.update("jax_platforms", "cpu")
    from trainer.engine import recorded_settings
    from trainer.plan import memory_plan, plan_text

    flags = {"precision": precision, "remat": remat, "batch_size": batch_size, "model.num_levels": num_levels,
             "model.base_filters": base_filters, "model.in_channels": in_channels, "model.stem": stem, "model.encoder": encoder,
             "model.deep_supervision": deep_supervision, "augmentation": augmentation, "patch_size": patch_size}
    # The sentences name the options as typed (`--batch-size 0`), and `--in-channels`, which fullres train lacks.
    typed = recorded_settings.typed_as({k: v for k, v in flags.items() if k != "model.in_channels"}, given)
    if in_channels is not None:
        typed.setdefault("model.in_channels", f"--in-channels {in_channels}")
    try:
        plan = memory_plan.run(
            model=model, preset=preset, settings={**{k: v for k, v in flags.items() if v is not None}, **given},
            image_size=size, partitions=asked, layouts_to_try=dims or layouts or "default", device_memory=device_memory,
            target=target, max_minutes=max_minutes, use_cache=cache, data=data, set_pairs=given, typed=typed,
            log=lambda line: typer.echo(line, err=True))
        memory = targets.memory_per_device(on)  # a target's own, unless --device-memory says
        budget = device_memory or (sizes.human_bytes(memory) if memory else None)
    except (ValueError, FileNotFoundError, targets.MissingCompiler) as error:
        console.fail(str(error))
    if json_output:
        typer.echo(json.dumps(plan.to_json(), indent=2))
        return
    typer.echo("\n".join([*plan_text.table(plan.results, plan.header, budget), *plan_text.launch_lines(plan)]))


def main(argv: list[str] | None = None) -> None:
    """`python -m trainer train ...` (`trainer/__main__.py`): the trainer's commands without the rest of the `fullres`
    command line."""
    app(args=argv, prog_name="fullres")
