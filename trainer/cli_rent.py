"""`fullres plan --largest` and `fullres plan --target GENERATION` (what to rent): options read, the search run
(`trainer.plan.rent`), the answer printed."""

from __future__ import annotations

import json

import typer
import typer.core

from common import console, parsing


class PlanCommand(typer.core.TyperCommand):
    """`fullres plan`, whose `--largest` takes its axes or none: a bare `--largest` (last, or before another option)
    grows a cube (Typer has no option whose value may be left out)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        args = list(args)
        for index, arg in enumerate(args):
            if arg == "--largest" and (index + 1 == len(args) or args[index + 1].startswith("-")):
                args.insert(index + 1, "cube")
                break
        return super().parse_args(ctx, args)


def is_generation(target: str) -> bool:
    """Whether `--target` names a generation alone (`v5e`, `h100`); an unknown one is refused in one sentence."""
    from trainer.plan import smallest_slice

    try:
        return smallest_slice.generation(target) is not None
    except ValueError as error:
        console.fail(str(error))


def rent(*, largest: str | None, target: str, model, preset, flags: dict, settings, image_size, partitions, layouts,
         device_memory, max_seconds, cache: bool, json_output: bool) -> None:
    """Runs the search `--largest` or a generation `--target` asks for and prints it (see `trainer.plan.rent`)."""
    from trainer import cli_options
    from trainer.plan import rent as rent_plan, smallest_slice, targets

    try:
        kind = smallest_slice.generation(target)
        if kind is not None and largest is not None:
            raise ValueError(f"--largest needs a whole target, e.g. --target {smallest_slice.slices(kind)[-1].name}; "
                             f"--target {target} alone finds the smallest {kind} slice for --image-size.")
        if kind is None and largest is None:
            raise ValueError(f"--max-seconds bounds --largest or the smallest-slice search (--target v5e); "
                             f"--target {target} plans one size: bound it with --max-minutes.")
        if kind is not None and not image_size:
            raise ValueError(f"--target {target} finds the smallest {kind} slice that trains a volume whole; give "
                             "the volume, e.g. --image-size 512,512,1024.")
        if max_seconds is not None and max_seconds <= 0:
            raise ValueError(f"--max-seconds {max_seconds:g} must be more than 0, e.g. --max-seconds 900.")
        on = None if kind else targets.parse(target)
        counts = parsing.parse_list(partitions, int, "--partitions", "4") if partitions else None
        size = parsing.parse_list(image_size, int, "--image-size", "64,128,128") if image_size else None
        given = parsing.parse_settings(settings or [])
        if device_memory is not None and on is not None and on.platform != "cpu":
            raise ValueError(f"--device-memory is the target's own on {on.name}; leave it out (it sizes the CPU "
                             "search of --largest without --target).")
        if on is not None and on.platform == "cpu" and not device_memory:
            raise ValueError("--largest without a --target sizes on this machine's CPU and needs the memory of one "
                             "device to search against, e.g. --device-memory 16GiB (or give --target v5e:2x2).")
        if on is not None and on.platform == "cpu" and counts is not None and len(counts) != 1:
            raise ValueError(f"--largest on the CPU takes one --partitions N (the devices of one replica), not "
                             f"{partitions}.")
        if layouts not in (None, "all", "default"):
            raise ValueError(f"--layouts {layouts} is not known; use all or default.")
    except ValueError as error:
        console.fail(str(error))
    if not cli_options.jax_backend_started():
        devices = (max(t.device_count for t in smallest_slice.slices(kind)) if kind else
                   on.device_count or max(counts or [1]))
        cli_options.set_host_device_count(devices)
        import jax

        jax.config.update("jax_platforms", "cpu")  # the target's devices are compile-only
    common = {"model": model, "preset": preset, "settings": {**{k: v for k, v in flags.items() if v is not None},
                                                             **given},
              "set_pairs": given, "image_size": size, "layouts_to_try": layouts or "all", "use_cache": cache,
              "max_seconds": rent_plan.DEFAULT_MAX_SECONDS if max_seconds is None else max_seconds,
              "log": lambda line: typer.echo(line, err=True)}
    try:
        if kind is not None:
            result = rent_plan.smallest(kind=kind, **common)
        else:
            result = rent_plan.largest(axes_text=largest, target=target, partitions=counts,
                                       device_memory=device_memory, **common)
    except (ValueError, FileNotFoundError, targets.MissingCompiler) as error:
        console.fail(str(error))
    if json_output:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo("\n".join(rent_plan.lines(result)))
