"""`fullres plan`: the run resolved as `fullres train` resolves it, its layouts compiled and ranked, the table.

Nothing runs: `compiled_step` compiles the training step ahead of time for each
layout and reads the compiler's per-device memory and halo traffic;
`layout_search` enumerates, prunes and ranks the layouts; this module runs
them for the command and holds what they found (`Plan`); `plan_text` turns
that into what the command prints.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from common import sizes
from trainer import config as config_lib
from trainer.engine import recorded_settings
from trainer.models import user_model
from trainer.tasks import registry
from trainer.plan import (compiled_step, device_bytes, input_plan, launch, layout_measure, layout_search, plan_text,
                          target_compile, target_search, targets)

AXES = {2: ("height", "width"), 3: ("depth", "height", "width")}


def check_sizes(image_size: Sequence[int] | None, partitions: Sequence[int]) -> None:
    """Refuses a size or a core count that no model can be built for, before anything is compiled.

    (How many sizes a model takes is its task's to say: `planned_example_shape`.)

    Raises:
        ValueError: one sentence naming the option, the value and the fix.
    """
    if image_size is not None:
        given = ",".join(map(str, image_size))
        axes = AXES.get(len(image_size), tuple(f"dimension {i}" for i in range(len(image_size))))
        for axis, value in zip(axes, image_size):
            if value < 1:
                fill = max(image_size) if max(image_size) >= 1 else 256
                example = ",".join(str(v if v >= 1 else fill) for v in image_size)
                raise ValueError(f"--image-size {given} gives the {axis} as {value}; every size is a number of "
                                 f"voxels and must be 1 or more, e.g. --image-size {example}.")
    bad = [n for n in partitions if n < 1]
    if bad:
        raise ValueError(f"--partitions {','.join(map(str, partitions))} asks for {bad[0]} cores; each entry is a "
                         "number of cores per replica and must be 1 or more, e.g. --partitions 1,2,4,8.")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `run` found: per N its `layout_search.Search`, the table's header, and (on a target) what to launch."""

    results: list
    header: str
    target: str
    device_memory: int | None
    launch: dict | None  # `launch.launch` for the best layout of the smallest N that fits (None on `cpu`)
    compiler: dict | None = None  # on a target: `device_bytes.plan_json` (versions modelled, terms, margin)
    input: dict | None = None  # with --data: this host's input rate beside the step's (`input_plan.plan_input`)
    receptive_field: object = None  # `models.receptive_field.ReceptiveField` of the network at the planned size

    def to_json(self) -> dict:
        """The plan's JSON (`fullres plan --json`): rows, refusals, what was left out, and the launch."""
        return {"header": self.header, "target": self.target, "device_memory_bytes": self.device_memory,
                "rows": [r.to_json() for result in self.results for r in result.rows],
                "refused": [r.to_json() for result in self.results for r in result.refused],
                "pruned": [{"input_partition_dims": list(d), "why": why} for result in self.results
                           for d, why in result.pruned],
                "over_cpu_estimate": [{"input_partition_dims": list(d), "cpu_total_bytes": b,
                                       "why": result.over_estimate_why}
                                      for result in self.results for d, b in result.over_estimate],
                "not_compiled": [list(d) for result in self.results for d in result.not_compiled],
                "cannot_divide": [{"partitions": result.partitions, "why": result.cannot_divide}
                                  for result in self.results if result.cannot_divide],
                "replaced": [{"partitions": result.partitions, "why": result.replaced}
                             for result in self.results if result.replaced],
                "launch": self.launch, "input": self.input, "compiler": self.compiler,
                "receptive_field": None if self.receptive_field is None else self.receptive_field.to_json()}

    def __str__(self) -> str:
        """The table `fullres plan` prints (`plan_text.table`, then `plan_text.launch_lines`)."""
        budget = None if self.device_memory is None else sizes.human_bytes(self.device_memory)
        return "\n".join([*plan_text.table(self.results, self.header, budget), *plan_text.launch_lines(self)])


def check_compiled(results, target: targets.Target, max_minutes: float | None, seconds: float) -> None:
    """Refuses a plan in which `max_minutes` left every layout uncompiled for the target: there is nothing to rank,
    and "none fits" would send the user after more partitions instead of more time."""
    tried = [r for result in results for r in [*result.rows, *result.refused]]
    left = [d for result in results for d in result.not_compiled]
    if tried or not left:
        return
    raise ValueError(f"--max-minutes {max_minutes:g} ran out after the CPU estimates ({seconds:.0f} s), before any of "
                     f"the {len(left)} layout(s) was compiled for {target.name}, so nothing was planned on it; give it "
                     f"more time (a {target.name} compile takes about a minute here), e.g. --max-minutes 30, or leave "
                     "--max-minutes out.")


def _chosen(results, device_memory: int | None):
    """The best-ranked row of the smallest N that fits (that compiled at all, when none fits)."""
    rows = [r for result in results for r in result.rows]
    fitting = [r for r in rows if r.fits] or rows
    return min(fitting, key=lambda r: (r.partitions, r.rank or 0)) if fitting else None


def run(*, model: str | None = None, preset: str = "default", settings: dict | None = None,
        image_size: Sequence[int] | None = None, partitions: Sequence[int] | None = None,
        layouts_to_try="default", device_memory: str | None = None, target: str = "cpu",
        max_minutes: float | None = None, cache_dir: str | None = None, use_cache: bool = True,
        data: str | None = None, set_pairs: dict | None = None, typed: dict | None = None,
        log: Callable[[str], None] = lambda line: None) -> Plan:
    """`fullres plan`: resolves the config as `fullres train` would, compiles, ranks; returns the `Plan`.

    Args:
        model: shorthand for the task and the UNet's dimensionality (`plan_config`).
        preset, settings: as `fullres train --preset ... --set key=value` (dotted keys); `set_pairs`: those
            that came from `--set`, as typed, for the sentences (`recorded_settings.typed_as`); `typed`: how the
            command line gave each setting, its options too (default: `set_pairs` as `--set KEY=VALUE`).
        image_size: the spatial size of one example (segmentation: D,H,W or H,W;
            detection: the canvas, `image_size`, which it sets). With a `patch_size` setting, the volumes' size:
            the step is then sized on the patch, as `fullres train --patch-size` compiles it.
        partitions: core counts N to compare (with given dims: their product); None: `targets.default_partitions`
            (1, 2, 4, 8, 16, on a TPU slice or GPUs those that divide its devices).
        layouts_to_try: "default" (N-way along the first spatial dimension, or where that cannot divide a stand-in:
            `layout_search.candidates`), "all" (every layout that divides) or one layout's input_partition_dims.
        device_memory: e.g. "16GiB": rows say whether they fit, and ranking puts the fitting first
            (default on a TPU or GPU target: the memory of one of its devices, `targets.memory_per_device`).
        target: "cpu" (this machine's devices), a TPU slice ("v5e:2x2") or GPUs ("h100x8"): the
            step is compiled by that target's compiler, whose figures the rows then are (`target_search`).
        max_minutes: on a target, start no compile after this long.
        cache_dir, use_cache: on a target, where compiled figures are kept (`target_compile.PlanCache`).
        data: the training records: this host's input rate for one process of the chosen layout is measured
            and set beside the step (`input_plan`).

    Raises:
        ValueError: a bad name, layout or size, or a `max_minutes` that ran out before anything was compiled for
            the target (one sentence).
        targets.MissingCompiler: the target's compiler is not installed (one sentence: how to install it).
    """
    on = targets.parse(target)
    if partitions is None and on.device_count is not None:
        partitions = targets.default_partitions(on)
        log(f"planning {', '.join(map(str, partitions))} cores per replica: those of "
            f"{', '.join(map(str, targets.DEFAULT_PARTITIONS))} that divide the {on.device_count} devices of "
            f"{on.name} (--partitions chooses others)")
    partitions = targets.DEFAULT_PARTITIONS if partitions is None else tuple(partitions)
    check_sizes(image_size, partitions)
    settings = dict(settings or {})
    if image_size is not None and len(image_size) == 2:
        settings.setdefault("image_size", ",".join(map(str, image_size)))  # the detection canvas (2D UNets ignore it)
    if image_size is not None and user_model.is_source(model):
        settings.setdefault("model.spatial_dims", len(image_size))  # a user's network: 2D or 3D as the size says
    config = compiled_step.plan_config(model, preset, settings, given=typed or recorded_settings.typed_as(
        {}, set_pairs or {}), train_data=data or "")  # --data: read as fullres train reads its --train
    if config.partition.is_auto:  # the layouts are what is being compared
        config = config_lib.with_dims(config, compiled_step.default_partition_dims(1, config.model.spatial_dims + 2))
    volume = shape = compiled_step.example_shape(config, image_size)
    if config.patch_size is not None:  # the step fullres train compiles takes crops: it is sized on them
        from trainer.data import patches

        patches.check_fits(config.patch_size, volume[:-1], f"--image-size {','.join(map(str, volume[:-1]))}")
        shape = (*config.patch_size, volume[-1])
        log(f"patches: sizing the step for {'x'.join(map(str, config.patch_size))} crops of the "
            f"{'x'.join(map(str, volume[:-1]))} volumes, the step fullres train --patch-size compiles")
    if isinstance(layouts_to_try, tuple) and len(layouts_to_try) != len(shape) + 1:
        raise ValueError(f"--input-partition-dims {','.join(map(str, layouts_to_try))} has {len(layouts_to_try)} "
                         f"entries; this model's inputs have {len(shape) + 1} (batch, {len(shape) - 1} spatial, "
                         f"channels), e.g. {','.join(map(str, compiled_step.default_partition_dims(4, len(shape) + 1)))}.")
    kind = None
    if data is not None:  # named before the first compile, as every other argument (it is read after them)
        kind = input_plan.check_kind(data)  # CT or clip records: the input this plan measures
        input_plan.check_shape(data, volume[:-1], kind)  # the records' size too: found after every compile, it was
    limit = sizes.parse_bytes(device_memory) if device_memory else targets.memory_per_device(on)
    started = time.perf_counter()
    if on.platform == "cpu":
        if isinstance(layouts_to_try, tuple):
            config = config_lib.with_dims(config, layouts_to_try)
            row = layout_measure.compile_layout(config, shape, on)
            results = [layout_search.Search(row.partitions, [dataclasses.replace(row, fits=None if limit is None
                                                                                 else row.total_bytes <= limit)],
                                            [], row.compile_seconds)]
        else:
            results = layout_search.search(config, shape, list(partitions), layouts_to_try=layouts_to_try,
                                           device_memory=limit, efficiency=layouts_to_try == "all" or 1 in partitions,
                                           log=log)
    else:
        targets.check_devices(on, partitions, layouts_to_try if isinstance(layouts_to_try, tuple) else None)
        cache = target_compile.PlanCache(cache_dir) if use_cache else None
        results = target_search.search(config, shape, list(partitions), on, layouts_to_try=layouts_to_try,
                                       device_memory=limit, max_minutes=max_minutes, cache=cache, log=log)
        check_compiled(results, on, max_minutes, time.perf_counter() - started)
    where = "" if on.platform == "cpu" else (
        f" on {on.name} ({targets.hardware(on.kind)['device_kind']}, "
        f"{targets.memory_words(on, limit if device_memory else None)}), "
        f"that compiler's figures and what the device adds (below); step times are roofline estimates;")
    network = (os.path.basename(config.model.source) if isinstance(config.model, user_model.UserModelConfig)
               else type(config.model).__name__)
    crops = f" patches of {list(volume[:-1])} volumes" if shape != volume else ""
    header = (f"{config.task} {network} {list(shape[:-1])}{crops}, {shape[-1]} channel{'s' * (shape[-1] > 1)}, "
              f"batch {config.batch_size} per replica, {config.precision}{', remat' if config.remat else ''};{where} "
              f"per device ({time.perf_counter() - started:.0f} s):")
    chosen = _chosen(results, limit) if on.platform != "cpu" else None
    found = None
    if chosen is not None and on.device_count % chosen.partitions == 0:
        found = launch.launch(on, chosen.input_partition_dims, config.batch_size, config.precision, preset,
                              {k: v for k, v in settings.items() if k not in ("precision", "batch_size",
                                                                             "partition.input_partition_dims")})
        if isinstance(config.model, user_model.UserModelConfig):  # submit passes the network's file as it is
            found["model"] = config.model.source
    planned_input = None
    row = _chosen(results, limit)
    if data is not None and row is not None:
        processes = found["processes"] if found else 1
        devices = found["devices"] if found else row.partitions
        step_seconds = (row.estimate or {}).get("seconds")
        planned_input = input_plan.plan_input(data, row.input_partition_dims, (devices // row.partitions
                                              * config.batch_size, *shape), devices, processes, step_seconds, log,
                                              volume=volume[:-1], kind=kind)
        if found is not None:
            found = {**found, "host": planned_input["host"]}
    compiler = None if on.platform == "cpu" else device_bytes.plan_json(on.platform, target_compile.compiler_versions(),
                                                                         device_bytes.autotunes())
    return Plan(results, header, on.name, limit, found, compiler, planned_input, _receptive_field(config, volume, log))


def _receptive_field(config: config_lib.TrainConfig, shape: tuple[int, ...], log: Callable[[str], None]):
    """The network's measured receptive field at the planned size, on this host's CPU (`task.receptive_field`); None,
    said in the log, where the probe cannot run here (a network of a fixed input size larger than this host holds)."""
    import jax

    task = registry.make_task(config)
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            return task.receptive_field(task.build_model(), tuple(shape[:-1]))
    except (jax.errors.JaxRuntimeError, MemoryError) as error:
        if not isinstance(error, MemoryError) and "RESOURCE_EXHAUSTED" not in str(error):
            raise
        log(f"receptive field: not measured: probing it at {list(shape[:-1])} needs more memory than this host has")
        return None
