"""Per-device memory and halo traffic of a partitioned training step, read from the ahead-of-time compiled step.

Nothing runs and no input is allocated: the step `fullres train` would run for
a `TrainConfig` (same task, model, loss, labels, optimizer and schedule, built
by `engine.program.build_model` and `jit_step`) is lowered from
`jax.ShapeDtypeStruct`s with the partitioned shardings and compiled; then
`compiled.memory_analysis()` gives the bytes each device needs and the HLO text
shows the communication: `collective-permute` is halo exchange between
neighbours, an `all-gather` of an activation is a layer the compiler could not
partition (it costs a full-resolution copy on every device).

`search` compiles every layout of N cores over the spatial dimensions and
ranks them (`layout_choice.choose_layout`, what `input_partition_dims = "auto"`
runs, takes the first); `halo.lower_bound` says how much halo each layout needs
at least.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence

import numpy as np

from common import parsing, sizes
from trainer import config as config_lib
from trainer.tasks import registry
from trainer.engine import placement, program
from trainer.parallel import halo, partitioning

MODELS = ("unet3d", "unet2d", "retinanet")
LAYOUT_CHOICES = ("default", "all")
NEAR_TIE = 0.02  # within 2 %: of the least halo, a tie (memory decides); of the least memory, the default budget
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}
# `%name = f32[1,2,3]{...} collective-permute(` or the async `-start` form, whose result is a tuple.
_INSTRUCTION = re.compile(r"=\s*\(?([a-z0-9]+)\[([0-9,]*)\][^ ]*\)?.*?\s(collective-permute|all-gather)(-start)?\(")


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """Per-device figures of one layout (bytes).

    `halo_bound_bytes` is `halo_lower_bound` for the layout; `near_tie` marks a
    row whose halo is within 2 % of the best-ranked row of its N (memory
    ordered them); `rank` counts from 1 within its N (0: not ranked).
    """

    partitions: int
    input_partition_dims: tuple[int, ...]
    temp_bytes: int
    argument_bytes: int
    total_bytes: int
    efficiency: float | None
    activation_all_gathers: int
    halo_bytes: int
    fits: bool | None = None
    halo_bound_bytes: int | None = None
    rank: int = 0
    near_tie: bool = False
    compile_seconds: float = 0.0

    @property
    def halo_ratio(self) -> float | None:
        """Measured halo ÷ its lower bound (None where the bound is 0)."""
        return round(self.halo_bytes / self.halo_bound_bytes, 3) if self.halo_bound_bytes else None

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values["input_partition_dims"] = list(self.input_partition_dims)
        values["halo_ratio"] = self.halo_ratio
        return values

    @classmethod
    def from_json(cls, values: dict) -> PlanRow:
        """A row back from `to_json` (e.g. from a benchmark's results)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        row = {k: v for k, v in values.items() if k in fields}
        return cls(**{**row, "input_partition_dims": tuple(row["input_partition_dims"])})


@dataclasses.dataclass(frozen=True)
class Search:
    """The outcome of `search` for one N: ranked rows, and the layouts pruned before compiling."""

    partitions: int
    rows: list[PlanRow]
    pruned: list[tuple[tuple[int, ...], str]]  # (dims, why it cannot divide)
    seconds: float


def default_partition_dims(partitions: int, rank: int) -> tuple[int, ...]:
    """`[1, N, 1, 1(, 1)]`: the usual TPU convention, N-way along the first spatial dimension."""
    dims = [1] * rank
    dims[1] = partitions
    return tuple(dims)


def communication(hlo_text: str, feature_rank: int, replica_batch: int) -> tuple[int, int]:
    """(activation all-gathers, halo bytes per device) in a compiled module's HLO text.

    An all-gather counts as an activation's when its result has the feature
    tensor's rank and the per-replica batch size in front (weights are
    replicated and never gathered; gradients are all-reduced).
    """
    gathers, exchanged = 0, 0
    for match in _INSTRUCTION.finditer(hlo_text):
        dtype, dims, kind = match.group(1), match.group(2), match.group(3)
        shape = parsing.parse_list(dims, int, "HLO shape") or ()
        if kind == "collective-permute":
            exchanged += math.prod(shape) * _DTYPE_BYTES.get(dtype, 4)
        elif len(shape) == feature_rank and shape[0] == replica_batch:
            gathers += 1
    return gathers, exchanged


# ---------------------------------------------------------------- the configuration plan compiles


def plan_config(model: str | None = None, preset: str = "default", overrides: dict | None = None,
                task: str | None = None) -> config_lib.TrainConfig:
    """The `TrainConfig` `fullres plan` sizes, through `config.resolve` like `fullres train`.

    `model` is shorthand: "unet3d" / "unet2d" (segmentation, 3D or 2D UNet) or
    "retinanet" (detection); None takes the task from `task`, else the preset's.
    """
    if model is not None and model not in MODELS:
        raise ValueError(f"--model {model!r} is not known; use one of {', '.join(MODELS)}.")
    if model is not None:
        task = "detection" if model == "retinanet" else "segmentation"
    elif task is None:
        task = config_lib.PRESETS[preset]().task if preset in config_lib.PRESETS else "segmentation"
    settings = dict(overrides or {})
    if model in ("unet3d", "unet2d"):
        spatial_dims = 3 if model == "unet3d" else 2
        settings.setdefault("model.spatial_dims", spatial_dims)
        settings.setdefault("partition.input_partition_dims", ",".join("1" * (spatial_dims + 2)))  # layouts replace it
    return config_lib.resolve(task, preset, overrides=settings)


def with_dims(config: config_lib.TrainConfig, dims: Sequence[int]) -> config_lib.TrainConfig:
    """`config` split by `dims`; labels given as dims (split like the features) follow them."""
    labels = config.partition.label_partition_dims
    if labels is not None:
        labels = tuple(dims) if len(labels) == len(dims) else (1, *dims[1:-1])
    return dataclasses.replace(config, partition=partitioning.PartitionConfig(tuple(dims), labels))


def example_shape(config: config_lib.TrainConfig, spatial_size: Sequence[int] | None) -> tuple[int, ...]:
    """One example's shape, channels last, as the task trains on it: (D, H, W, 1) at `spatial_size`, or (H, W, 3)."""
    return registry.make_task(config).planned_example_shape(None if spatial_size is None else tuple(spatial_size))


class _Builder:
    """One model per config (its variables on one device, shapes are all planning needs), compiled per layout."""

    def __init__(self, config: config_lib.TrainConfig, shape: tuple[int, ...]):
        import jax
        import keras


        self.config, self.example_shape = config, shape
        self.image_shape = (config.batch_size, *shape)
        self.task = registry.make_task(config)
        keras.utils.set_random_seed(config.seed)
        self.model, self.optimizer, _, state = program.build_model(config, self.task, config.steps)
        self.state = jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), state)
        self._windows = None

    def compile(self, dims: tuple[int, ...], devices):
        """Lowers and compiles the train step for `dims` on `devices`; returns (compiled, distribution)."""
        lowered, distribution = self.lower(dims, devices)
        return lowered.compile(), distribution

    def lower(self, dims: tuple[int, ...], devices):
        """Lowers the train step for `dims` on `devices`; returns (lowered, distribution)."""
        import jax


        config = with_dims(self.config, dims)
        partitioning.validate(config.partition, self.image_shape, len(devices), config.model.downsampling_levels,
                              config.batch_size)
        distribution = partitioning.make_distribution(config.partition, devices)
        train_step = program.jit_step(self.task, self.model, self.optimizer, distribution, self.state, len(self.image_shape))
        state = jax.tree_util.tree_map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                                       self.state, placement.state_shardings(self.state, distribution))
        images = jax.ShapeDtypeStruct(self.image_shape, np.float32,
                                      sharding=distribution.get_data_layout(self.image_shape).backend_layout)
        labels = self.task.label_spec(self.image_shape, distribution)
        return train_step.lower(state, images, labels), distribution

    def windows(self) -> list[halo.Window]:
        """The model's convolutions and pooling windows (traced once per config)."""
        if self._windows is None:
            self._windows = halo.windows(self.model, self.state, self.image_shape)
        return self._windows


def compile_step(config: config_lib.TrainConfig, shape: tuple[int, ...], devices):
    """Lowers and compiles the training step `fullres train` runs for `config` on `devices`, without running it.

    Args:
        config: the run; its `partition` says the layout (not "auto").
        shape: one example, channels last, e.g. (D, H, W, 1) (`example_shape`).
        devices: the devices of one replica group (their count divides by the layout's cores).

    Returns:
        (the compiled step, its `partitioning.SpatialParallel`); it takes
        `(TrainState, images, labels)` placed as `placement.place_state` / `place_batch` / the task place them.
    """
    return _Builder(config, tuple(shape)).compile(config.partition.input_partition_dims, devices)


def lower_step(config: config_lib.TrainConfig, shape: tuple[int, ...], devices):
    """`compile_step` before compiling: (the lowered step, its distribution)."""
    return _Builder(config, tuple(shape)).lower(config.partition.input_partition_dims, devices)


# ---------------------------------------------------------------- layouts: enumerate, prune, compile, rank


def layouts(partitions: int, spatial_dims: int) -> list[tuple[int, ...]]:
    """Every split of `partitions` cores over the spatial dimensions, as input_partition_dims (batch, channels 1).

    Example:
        >>> layouts(4, 2)
        [(1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1)]
    """
    def splits(count: int, slots: int):
        if slots == 1:
            yield (count,)
            return
        for first in range(1, count + 1):
            if count % first == 0:
                for rest in splits(count // first, slots - 1):
                    yield (first, *rest)

    return sorted((1, *split, 1) for split in splits(partitions, spatial_dims))


def prune(candidates: Sequence[tuple[int, ...]], config: config_lib.TrainConfig, shape: tuple[int, ...]):
    """(layouts that divide the volume at every resolution level, [(layout, why not)] for the rest)."""
    image_shape = (config.batch_size, *shape)
    kept, pruned = [], []
    for dims in candidates:
        try:
            partitioning.validate(partitioning.PartitionConfig(dims), image_shape, math.prod(dims),
                                  config.model.downsampling_levels, config.batch_size)
        except partitioning.PartitionError as error:
            pruned.append((dims, str(error)))
        else:
            kept.append(dims)
    return kept, pruned


def _measure(builder: _Builder, dims: tuple[int, ...], devices, device_memory: int | None) -> PlanRow:
    started = time.perf_counter()
    compiled, distribution = builder.compile(dims, devices)
    memory = compiled.memory_analysis()
    replica_batch = builder.config.batch_size // distribution.num_replicas
    gathers, halo_bytes = communication(compiled.as_text(), len(dims), replica_batch)
    total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes \
        - memory.alias_size_in_bytes
    bound = halo.lower_bound(builder.windows(), dims, distribution.num_replicas)
    return PlanRow(math.prod(dims), tuple(dims), memory.temp_size_in_bytes, memory.argument_size_in_bytes, total,
                   None, gathers, halo_bytes, None if device_memory is None else total <= device_memory, bound,
                   compile_seconds=round(time.perf_counter() - started, 2))


def rank_rows(rows: Sequence[PlanRow], device_memory: int | None = None) -> list[PlanRow]:
    """Best first: fits the memory budget, then least halo bytes, then least total memory.

    The budget is `device_memory`; without one it is the leanest layout's total
    plus 2 % (memory decides whether a run fits at all, so a layout that needs
    more of it than another must buy that with something the plan cannot see).
    Among the rows within the budget, those whose halo is within 2 % of the least
    are near-ties: they come first, ordered by total memory, marked `near_tie`;
    the other fitting rows follow by halo, then the rest by total memory.
    """
    if not rows:
        return []
    budget = device_memory if device_memory is not None else min(r.total_bytes for r in rows) * (1 + NEAR_TIE)
    fitting = {id(r) for r in rows if r.total_bytes <= budget}
    least = min((r.halo_bytes for r in rows if id(r) in fitting), default=0)
    tied = {id(r) for r in rows if id(r) in fitting and r.halo_bytes <= least * (1 + NEAR_TIE)}

    def key(row):
        leading = tuple(-d for d in row.input_partition_dims)  # exact ties: the split of the leading dims first
        if id(row) in tied:
            return (0, row.total_bytes, row.halo_bytes, leading)
        if id(row) in fitting:
            return (1, row.halo_bytes, row.total_bytes, leading)
        return (2, row.total_bytes, row.halo_bytes, leading)

    ordered = sorted(rows, key=key)
    return [dataclasses.replace(r, rank=i, near_tie=id(r) in tied and len(tied) > 1)
            for i, r in enumerate(ordered, 1)]


def search(config: config_lib.TrainConfig, shape: tuple[int, ...], partitions: Sequence[int], *,
           layouts_to_try: str = "all", devices=None, device_memory: int | None = None, efficiency: bool = True,
           log: Callable[[str], None] = lambda line: None) -> list[Search]:
    """Compiles the layouts of every N in `partitions` and ranks them (`rank_rows`).

    Args:
        config: the run to size (its own `partition` is replaced by each layout).
        shape: one example, channels last (`example_shape`).
        partitions: core counts N; each layout of N runs on the first N devices.
        layouts_to_try: "all" (every split of N over the spatial dimensions that
            divides at every resolution level) or "default" (N-way along the first).
        devices: defaults to `jax.devices()`.
        device_memory: bytes per device; rows say whether they fit.
        efficiency: also compile N = 1 to report E(N) = M(1) / (N · M(N)) of activation memory.
        log: progress lines (one per compile).

    Raises:
        ValueError: an N exceeds the devices, or no layout of an N divides the volume (the reasons named).
    """
    import jax

    if layouts_to_try not in LAYOUT_CHOICES:
        raise ValueError(f"--layouts {layouts_to_try!r} is not known; use one of {', '.join(LAYOUT_CHOICES)}.")
    devices = list(jax.devices() if devices is None else devices)
    largest = max(partitions, default=1)
    partitioning.require_devices(largest, len(devices), f"{largest} partitions")
    spatial = len(shape) - 1
    plans = []
    for count in partitions:
        if layouts_to_try == "all":
            kept, pruned = prune(layouts(count, spatial), config, shape)
        else:
            kept, pruned = [default_partition_dims(count, spatial + 2)], []
        if not kept:
            raise partitioning.PartitionError(f"no layout of {count} cores divides {list(shape[:-1])} at every "
                                              f"resolution level: {pruned[0][1]}")
        plans.append((count, kept, pruned))
    reference = (1,) * (spatial + 2)
    todo = list(dict.fromkeys(([reference] if efficiency else []) + [d for _, kept, _ in plans for d in kept]))
    builder = _Builder(config, tuple(shape))
    measured: dict[tuple[int, ...], PlanRow] = {}  # the compile cache of this search: one compile per layout
    for number, dims in enumerate(todo, 1):
        label = ",".join(map(str, dims))
        started = time.perf_counter()
        log(f"[{number}/{len(todo)}] compiling {label} on {math.prod(dims)} device(s) ...")
        measured[dims] = _measure(builder, dims, devices[:math.prod(dims)], device_memory)
        row = measured[dims]
        log(f"[{number}/{len(todo)}] {label}: {sizes.human_bytes(row.total_bytes)} per device, halo {sizes.human_bytes(row.halo_bytes)} "
            f"({time.perf_counter() - started:.1f} s)")
    base = measured.get(reference)
    results = []
    for count, kept, pruned in plans:
        rows = [measured[d] for d in kept]
        if base is not None:
            rows = [dataclasses.replace(r, efficiency=round(base.temp_bytes / (r.partitions * r.temp_bytes), 4))
                    for r in rows]
        ranked = rank_rows(rows, device_memory) if layouts_to_try == "all" else rows
        results.append(Search(count, ranked, pruned, round(sum(r.compile_seconds for r in rows), 1)))
        if pruned:
            log(f"N={count}: {len(pruned)} layout(s) pruned (cannot divide at some resolution level): "
                + "; ".join(",".join(map(str, d)) for d, _ in pruned))
    return results


def plan(config: config_lib.TrainConfig, shape: tuple[int, ...], partitions: Sequence[int], *,
         device_memory: int | None = None, log: Callable[[str], None] = lambda line: None) -> list[PlanRow]:
    """The N-way-along-the-first-dimension row of every N (E(N) when N = 1 is among them)."""
    results = search(config, shape, partitions, layouts_to_try="default", device_memory=device_memory,
                     efficiency=1 in partitions, log=log)
    return [row for result in results for row in result.rows]


# ---------------------------------------------------------------- the table


def table(results: Sequence[Search], header: str, device_memory: str | None = None) -> list[str]:
    """The plan as text lines: one block per N, rows best first (≈ marks near-ties), what was pruned, the pick."""
    lines = [header]
    lines.append(f"{'rank':>4} {'N':>4} {'dims':<16} {'activations':>12} {'arguments':>10} {'total':>10} {'E(N)':>6} "
                 f"{'all-gathers':>11} {'halo/step':>10} {'÷ bound':>8}  fits")
    for result in results:
        for r in result.rows:
            efficiency = "" if r.efficiency is None else f"{r.efficiency:.3f}"
            ratio = "" if r.halo_ratio is None else f"{r.halo_ratio:.2f}"
            fits = "" if r.fits is None else ("yes" if r.fits else "no")
            mark = f"{r.rank}{'≈' if r.near_tie else ''}" if r.rank else ""
            lines.append(f"{mark:>4} {r.partitions:>4} {','.join(map(str, r.input_partition_dims)):<16} "
                         f"{sizes.human_bytes(r.temp_bytes):>12} {sizes.human_bytes(r.argument_bytes):>10} {sizes.human_bytes(r.total_bytes):>10} "
                         f"{efficiency:>6} {r.activation_all_gathers:>11} {sizes.human_bytes(r.halo_bytes):>10} {ratio:>8}  {fits}")
        if result.pruned:
            lines.append(f"     N={result.partitions}: {len(result.pruned)} layout(s) pruned, they cannot divide at "
                         f"some resolution level: {' '.join(','.join(map(str, d)) for d, _ in result.pruned)}")
        if len(result.rows) > 1 and result.rows[0].rank:
            best = result.rows[0]
            if device_memory is None:
                leanest = min(r.total_bytes for r in result.rows)
                lines.append(f"     N={result.partitions}: no --device-memory, so layouts within 2 % of the leanest "
                             f"({sizes.human_bytes(leanest)}) rank first, by halo; give --device-memory to rank all that fit by halo")
            ties = [r for r in result.rows if r.near_tie and r is not best]
            lines.append(f"     N={result.partitions}: best {','.join(map(str, best.input_partition_dims))} "
                         f"({sizes.human_bytes(best.halo_bytes)} halo, {sizes.human_bytes(best.total_bytes)} per device; "
                         f"{len(result.rows)} layouts compiled in {result.seconds:.0f} s)"
                         + (f"; within 2 % on halo: {' '.join(','.join(map(str, r.input_partition_dims)) for r in ties)}"
                            if ties else ""))
    rows = [r for result in results for r in result.rows]
    if device_memory is not None:
        fitting = [r for r in rows if r.fits]
        if fitting:
            smallest = min(fitting, key=lambda r: (r.partitions, r.rank or 0))
            lines.append(f"smallest partitioning that fits {device_memory} per device: {smallest.partitions} "
                         f"(input_partition_dims {list(smallest.input_partition_dims)}, {sizes.human_bytes(smallest.total_bytes)})")
        else:
            lines.append(f"none of {sorted({r.partitions for r in rows})} fits {device_memory} per device; try more "
                         "partitions, bfloat16 or --remat")
    return lines


def run(*, model: str | None = None, preset: str = "default", settings: dict | None = None,
        image_size: Sequence[int] | None = None, partitions: Sequence[int] = (1, 2, 4, 8, 16),
        layouts_to_try: str = "default", device_memory: str | None = None,
        log: Callable[[str], None] = lambda line: None) -> tuple[list[Search], str]:
    """`fullres plan`: resolves the config as `fullres train` would, compiles, ranks; returns (results, header line).

    Args:
        model: shorthand for the task and the UNet's dimensionality (`plan_config`).
        preset, settings: as `fullres train --preset ... --set key=value` (dotted keys).
        image_size: the spatial size of one example (segmentation: D,H,W or H,W;
            detection: the canvas, `image_size`, which it sets).
        partitions: core counts N to compare.
        layouts_to_try: "default" (N-way along the first spatial dimension) or "all" (every layout that divides).
        device_memory: e.g. "16GiB": rows say whether they fit, and ranking puts the fitting first.
    """
    settings = dict(settings or {})
    if image_size is not None and len(image_size) == 2:
        settings.setdefault("image_size", ",".join(map(str, image_size)))  # the detection canvas (2D UNets ignore it)
    config = plan_config(model, preset, settings)
    if config.partition.is_auto:  # the layouts are what is being compared
        config = with_dims(config, default_partition_dims(1, config.model.spatial_dims + 2))
    shape = example_shape(config, image_size)
    limit = sizes.parse_bytes(device_memory) if device_memory else None
    started = time.perf_counter()
    results = search(config, shape, list(partitions), layouts_to_try=layouts_to_try, device_memory=limit,
                     efficiency=layouts_to_try == "all" or 1 in partitions, log=log)
    header = (f"{config.task} {type(config.model).__name__} {list(shape[:-1])}, batch {config.batch_size} per "
              f"replica, {config.precision}{', remat' if config.remat else ''}; per device "
              f"({time.perf_counter() - started:.0f} s):")
    return results, header

