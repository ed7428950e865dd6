"""The trainer's commands (`fullres train`); `pipelines/cli.py` adds them to the `fullres` command line.

Commands import their heavy libraries (JAX, Keras, TensorFlow) only when they
run, so `--help` is instant and `--virtual-devices` can still set `XLA_FLAGS`
before JAX starts. The helpers here (one-sentence errors, progress lines,
virtual devices) serve every layer's commands.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(rich_markup_mode=None,
    name="fullres",
    help="Train a UNet or a RetinaNet, spatially partitioned over all devices present.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PRESET_NAMES = ("default", "demo", "smoke", "ct_256", "detection", "detection_2560", "detection_demo")


@app.callback()
def global_options(
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the traceback behind an error (e.g. fullres --verbose train ...; or set FULLRES_VERBOSE=1).")] = False,
) -> None:
    if verbose:
        os.environ["FULLRES_VERBOSE"] = "1"  # read by _fail, here and in the processes a command starts

def _fail(message: str) -> None:
    """One sentence on stderr and exit 2; with `fullres --verbose`, the traceback of the error being handled first."""
    if os.environ.get("FULLRES_VERBOSE") == "1" and sys.exc_info()[1] is not None:
        traceback.print_exc()
    typer.echo(f"fullres: error: {message}", err=True)
    raise typer.Exit(code=2)


def _fail_if_write_error(error: Exception, output) -> None:
    """Disk full or permission denied while writing `output` becomes one sentence; other errors propagate."""
    from preprocessing import output_guard

    sentence = output_guard.write_failure(error, str(output))
    if sentence is None:
        raise error
    _fail(sentence)


def _jax_backend_started() -> bool:
    """True once XLA has created its devices; XLA_FLAGS are read then, not when JAX is imported."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # no public JAX API tells whether the backend has started

    return xla_bridge.backends_are_initialized()


def _use_virtual_devices(count: int | None) -> None:
    """Makes XLA present the CPU as `count` devices (must run before JAX is imported)."""
    if not count:
        return
    if _jax_backend_started():
        _fail("--virtual-devices must be applied before JAX starts; pass it on the command line, not from Python.")
    _set_host_device_count(count)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _set_host_device_count(count: int) -> None:
    """Sets XLA's CPU device count (read when the backend starts; other platforms ignore it)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])


def _print(message: str) -> None:
    """Progress lines, flushed at once: logs piped to a file or a pipeline runner show them as they happen."""
    typer.echo(message)
    sys.stdout.flush()


@app.command()
def train(
    train_data: Annotated[str, typer.Option("--train", help="TFRecord pattern of the training cases, e.g. 'data/train-*.tfrecord'.")],
    output: Annotated[Path, typer.Option(help="Output directory; a rerun into it resumes from the newest checkpoint.")],
    eval_data: Annotated[str | None, typer.Option("--eval", help="TFRecord pattern of held-out data, scored at the end (Dice, or COCO mAP).")] = None,
    task: Annotated[str, typer.Option(help="segmentation (3D/2D UNet on CT records) or detection (RetinaNet on image records).")] = "segmentation",
    preset: Annotated[str, typer.Option(help=f"Starting configuration: one of {', '.join(PRESET_NAMES)}; 'default' is the task's default.")] = "default",
    steps: Annotated[int | None, typer.Option(help="Optimizer steps in total.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Train this many passes over the data instead of --steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Global batch size, split over the replicas.")] = None,
    learning_rate: Annotated[float | None, typer.Option(help="Peak learning rate (Adam).")] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="Linear warm-up steps.")] = None,
    schedule: Annotated[str | None, typer.Option(help="Learning-rate schedule after warm-up: cosine or constant.")] = None,
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
    normalization: Annotated[str | None, typer.Option(help="instance, group, batch or none.")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Save a checkpoint every N steps.")] = None,
    log_every: Annotated[int | None, typer.Option(help="Log the loss every N steps.")] = None,
    augment: Annotated[bool | None, typer.Option("--augment/--no-augment", help="Segmentation: random flips along every axis. Detection: scale jitter and left-right flips.")] = None,
    image_size: Annotated[str | None, typer.Option(help="Detection: the H,W canvas every image is fitted to, e.g. 2560,2560.")] = None,
    max_boxes: Annotated[int | None, typer.Option(help="Detection: boxes kept per training image.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for weights, data order and augmentation.")] = None,
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
    context: typer.Context = None,
) -> None:
    """Train a UNet (segmentation) or a RetinaNet (detection), spatially partitioned over all devices present.

    Exits with status 75 ("preempted, resume me") after a SIGTERM made it checkpoint and stop.
    """
    if local_processes:
        from trainer import local_launcher

        if coordinator_address or num_processes or process_id is not None:
            _fail("--local-processes starts the processes itself; leave out --coordinator-address, --num-processes "
                  "and --process-id.")
        raise typer.Exit(code=local_launcher.launch(_options_without(context, "local_processes"), local_processes,
                                                    log=_print))
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        _fail("a multi-process run needs all of --coordinator-address, --num-processes and --process-id.")
    _use_virtual_devices(virtual_devices)
    if task not in ("segmentation", "detection"):
        _fail(f"--task {task!r} is not known; use segmentation or detection.")
    if preset not in PRESET_NAMES:
        _fail(f"--preset {preset!r} is not known; use one of {', '.join(PRESET_NAMES)}.")
    size = None
    if image_size is not None:
        try:
            size = tuple(int(p) for p in image_size.split(",") if p.strip())
        except ValueError:
            size = ()
        if len(size) != 2:
            _fail(f"--image-size {image_size!r} is not valid; write it like 1024,1024 (height,width).")
    from trainer import config as config_lib, distributed, train as train_lib

    try:
        distributed.initialize(
            distributed.ProcessGroup(coordinator_address, num_processes, process_id) if all(given) else None
        )
        if preset != "default" and config_lib.PRESETS[preset]().task != task:
            _fail(f"--preset {preset} is a {config_lib.PRESETS[preset]().task} preset but --task is {task}; pass "
                  f"--task {config_lib.PRESETS[preset]().task} or another preset.")
        unet_only = {"num_levels": num_levels, "base_filters": base_filters, "normalization": normalization}
        given_unet = [f"--{k.replace('_', '-')}" for k, v in unet_only.items()
                      if v is not None and f"model.{k}" not in config_lib.setting_types(task)]
        if given_unet:
            _fail(f"{', '.join(given_unet)} configure the UNet; they do not apply to --task {task}.")
        flags = {
            "steps": steps, "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
            "warmup_steps": warmup_steps, "schedule": schedule, "precision": precision, "remat": remat,
            "checkpoint_every": checkpoint_every, "log_every": log_every, "augment": augment, "seed": seed,
            "image_size": size, "max_boxes": max_boxes, "model.num_classes": num_classes,
            "partition.input_partition_dims": input_partition_dims,
            "partition.label_partition_dims": label_partition_dims,
            **{f"model.{k}": v for k, v in unet_only.items()},
        }
        config = config_lib.resolve(task, preset, train_data, str(output), eval_data,
                                    overrides={**flags, **config_lib.parse_settings(settings or [])})
        train_lib.train(config, log=_print)
    except distributed.Preempted as preempted:
        _print(f"fullres: {preempted}")
        raise typer.Exit(code=distributed.PREEMPTED_EXIT_CODE) from None
    except (ValueError, FileNotFoundError, FloatingPointError) as error:  # PartitionError, OutputRefused: ValueErrors
        _fail(str(error))
    except Exception as error:  # OSError, or TensorFlow's own error for a full disk (ResourceExhaustedError)
        _fail_if_write_error(error, output)


def _options_without(context: typer.Context, *left_out: str) -> list[str]:
    """The command's options as given (defaults left out), except `left_out`: the arguments to pass on."""
    arguments = []
    for parameter in context.command.params:
        value = context.params.get(parameter.name)
        if parameter.name in left_out or value is None:
            continue
        if parameter.is_flag and parameter.secondary_opts:
            arguments.append(parameter.opts[0] if value else parameter.secondary_opts[0])
        elif isinstance(value, (list, tuple)):
            arguments += [part for item in value for part in (parameter.opts[0], str(item))]
        else:
            arguments += [parameter.opts[0], str(value)]
    return arguments



def main(argv: list[str] | None = None) -> None:
    """`python -m trainer.train ...`: the train command without the rest of the `fullres` command line."""
    app(args=argv, prog_name="fullres")
