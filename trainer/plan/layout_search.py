"""The layout search: every split of N cores over the spatial dimensions, pruned, compiled and ranked.

`search` compiles each layout that divides the volume at every resolution level
(`compiled_step`) and ranks them by `rank_rows`; `layout_choice.choose_layout`
(what `input_partition_dims = "auto"` runs) takes the first. `layout_measure.lower_bound`
says how much halo each layout needs at least.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from common import sizes
from trainer import config as config_lib
from trainer.models import user_model
from trainer.parallel import device_mesh, partitioning, thin_shards
from trainer.plan import compiled_step, layout_measure, target_compile
from trainer.plan.plan_row import PlanRow


LAYOUT_CHOICES = ("default", "all")

NEAR_TIE = 0.02  # within 2 %: of the least halo, a tie (memory decides); of the least memory, the default budget

@dataclasses.dataclass(frozen=True)
class Search:
    """The outcome of `search` for one N: ranked rows, the layouts pruned before compiling, and those the compiler
    refused for memory (a target's compiler: "needs X of Y")."""

    partitions: int
    rows: list[PlanRow]
    pruned: list[tuple[tuple[int, ...], str]]  # (dims, why it cannot divide)
    seconds: float
    refused: list[target_compile.Refusal] = dataclasses.field(default_factory=list)
    over_estimate: list[tuple[tuple[int, ...], int]] = dataclasses.field(default_factory=list)  # (dims, CPU bytes)
    not_compiled: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # left by the time bound
    replaced: str = ""  # "default" layouts: why the N-way split along the first axis gave way to another layout
    cannot_divide: str = ""  # no layout of this N divides the volume: why (the N has no rows; the plan goes on)
    over_estimate_why: str = ""  # why `over_estimate`'s layouts were not compiled for the target (`target_search`)

@dataclasses.dataclass(frozen=True)
class Candidates:
    """The layouts of one N to compile (`candidates`): kept, pruned with why, and what the plan says of the N."""

    kept: list[tuple[int, ...]]
    pruned: list[tuple[tuple[int, ...], str]]
    replaced: str = ""
    cannot_divide: str = ""

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

def prune(candidates: Sequence[tuple[int, ...]], config: config_lib.TrainConfig, shape: tuple[int, ...],
          builder: Callable[[], compiled_step.StepBuilder] | None = None):
    """(layouts that divide the volume at every resolution level, [(layout, why not)] for the rest); with the
    network's `builder` (`lazy_builder`: called, and the model built, only for a user's network split along two
    or more axes), also those where XLA would compute its gradient wrongly (`thin_shards`) go to the rest."""
    image_shape = (config.batch_size, *shape)
    kept, pruned = [], []
    for dims in candidates:
        try:
            partitioning.validate(partitioning.PartitionConfig(dims), image_shape,
                                  downsampling_levels=config.model.downsampling_levels)
            if (builder is not None and thin_shards.splits_two_axes(dims)
                    and isinstance(config.model, user_model.UserModelConfig)):
                builder().check_thin_shards(dims)
        except partitioning.PartitionError as error:
            pruned.append((dims, str(error)))
        else:
            kept.append(dims)
    return kept, pruned

def candidates(layouts_to_try, count: int, config: config_lib.TrainConfig, shape: tuple[int, ...],
               builder: Callable[[], compiled_step.StepBuilder]) -> Candidates:
    """The layouts of `count` cores to compile: "all" (every split that divides), "default" or given dims.

    "default" is the N-way split along the first spatial dimension; where that cannot divide (64 frames of a clip
    halved 3 times leave 8, which 16 devices cannot share), the split of N that divides with the least halo
    (`layout_measure.lower_bound` of the network's windows, nothing compiled; fewer split axes, then the leading
    ones, break ties) stands in for it, and `replaced` says so. Where no layout of N divides, nothing is kept and
    `cannot_divide` says why: the plan reports that N and goes on with the others.
    """
    spatial = len(shape) - 1
    if layouts_to_try == "all":
        kept, pruned = prune(layouts(count, spatial), config, shape, builder)
        refusal = "" if kept else (f"no layout of {count} cores divides {list(shape[:-1])} at every resolution "
                                   f"level: {pruned[0][1]}")
        return Candidates(kept, pruned, cannot_divide=refusal)
    if layouts_to_try != "default":
        kept, pruned = prune([tuple(layouts_to_try)], config, shape, builder)
        return Candidates(kept, pruned, cannot_divide="" if kept else
                          f"--input-partition-dims {','.join(map(str, layouts_to_try))}: {pruned[0][1]}")
    default = compiled_step.default_partition_dims(count, spatial + 2)
    kept, pruned = prune([default], config, shape, builder)
    if kept:
        return Candidates(kept, [])
    label, why = ",".join(map(str, default)), pruned[0][1]
    others, _ = prune([d for d in layouts(count, spatial) if d != default], config, shape, builder)
    if not others:
        return Candidates([], pruned, cannot_divide=f"--partitions {count} (split {label}): {why} No other split of "
                                                    f"{count} cores divides {list(shape[:-1])} either.")
    found = builder().windows()
    bounds = {d: layout_measure.lower_bound(found, d) for d in others}
    best = min(others, key=lambda d: (bounds[d], sum(p > 1 for p in d), tuple(-p for p in d)))
    splits = f"{len(others)} splits" if len(others) > 1 else "1 split"
    return Candidates([best], pruned, replaced=(
        f"{label} cannot divide: {why} Planned {','.join(map(str, best))} instead: of the {splits} of {count} cores "
        f"that divide, the least halo by its lower bound ({sizes.human_bytes(bounds[best])} per device); --layouts "
        "all compiles and ranks them all."))

def lazy_builder(config: config_lib.TrainConfig, shape: tuple[int, ...]) -> Callable[[], compiled_step.StepBuilder]:
    """The run's `StepBuilder`, built on the first call only: a plan refused outright builds no model."""
    made: list[compiled_step.StepBuilder] = []

    def builder() -> compiled_step.StepBuilder:
        if not made:
            made.append(compiled_step.StepBuilder(config, tuple(shape)))
        return made[0]

    return builder

def every_count_refused(plans: Sequence[tuple[int, Candidates]]) -> None:
    """Raises the first N's reason when no N of the plan can be split at all: there would be nothing to plan.

    Raises:
        partitioning.PartitionError: the first N's `cannot_divide` sentence.
    """
    if plans and all(found.cannot_divide for _, found in plans):
        raise partitioning.PartitionError(plans[0][1].cannot_divide)

def say_refused_and_replaced(plans: Sequence[tuple[int, Candidates]], log: Callable[[str], None]) -> None:
    """One progress line per N that cannot divide or whose default layout gave way, before anything compiles."""
    for count, found in plans:
        for said in (found.cannot_divide, found.replaced):
            if said:
                log(f"N={count}: {said}")

def rank_rows(rows: Sequence[PlanRow], device_memory: int | None = None) -> list[PlanRow]:
    """Best first: fits the memory budget, then least halo and ring attention bytes (`PlanRow.exchange_bytes`, called
    halo below), then least total memory.

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
    least = min((r.exchange_bytes for r in rows if id(r) in fitting), default=0)
    tied = {id(r) for r in rows if id(r) in fitting and r.exchange_bytes <= least * (1 + NEAR_TIE)}

    def key(row):
        leading = tuple(-d for d in row.input_partition_dims)  # exact ties: the split of the leading dims first
        if id(row) in tied:
            return (0, row.total_bytes, row.exchange_bytes, leading)
        if id(row) in fitting:
            return (1, row.exchange_bytes, row.total_bytes, leading)
        return (2, row.total_bytes, row.exchange_bytes, leading)

    ordered = sorted(rows, key=key)
    return [dataclasses.replace(r, rank=i, near_tie=id(r) in tied and len(tied) > 1)
            for i, r in enumerate(ordered, 1)]

def search(config: config_lib.TrainConfig, shape: tuple[int, ...], partitions: Sequence[int], *,
           layouts_to_try: str = "all", devices=None, device_memory: int | None = None, efficiency: bool = True,
           compile_only: bool = False, log: Callable[[str], None] = lambda line: None) -> list[Search]:
    """Compiles the layouts of every N in `partitions` and ranks them (`rank_rows`).

    Args:
        config: the run to size (its own `partition` is replaced by each layout).
        shape: one example, channels last (`example_shape`).
        partitions: core counts N; each layout of N runs on the first N devices.
        layouts_to_try: "all" (every split of N over the spatial dimensions that
            divides at every resolution level) or "default" (N-way along the first).
        devices: defaults to `jax.devices()`; a target's (`targets.devices`) with `compile_only`.
        device_memory: bytes per device; rows say whether they fit.
        efficiency: also compile N = 1 to report E(N) = M(1) / (N · M(N)) of activation memory.
        compile_only: `devices` are a target's; a layout its compiler refuses for memory is a `Refusal`.
        log: progress lines (one per compile).

    Raises:
        ValueError: an N exceeds the devices, or no layout of any N divides the volume (the first N's reason; an N
            that cannot divide beside others that can is a `Search` with its reason in `cannot_divide`).
    """
    import jax

    if layouts_to_try not in LAYOUT_CHOICES:
        raise ValueError(f"--layouts {layouts_to_try!r} is not known; use one of {', '.join(LAYOUT_CHOICES)}.")
    devices = list(jax.devices() if devices is None else devices)
    largest = max(partitions, default=1)
    device_mesh.require_devices(largest, len(devices), f"{largest} partitions")
    spatial = len(shape) - 1
    builder = lazy_builder(config, shape)
    # Every N is sized up before the first compile: one that cannot divide is said at once, not after the others.
    plans = [(count, candidates(layouts_to_try, count, config, shape, builder))
             for count in partitions]
    every_count_refused(plans)
    builder = builder()
    say_refused_and_replaced(plans, log)
    reference = (1,) * (spatial + 2)
    todo = list(dict.fromkeys(([reference] if efficiency else []) + [d for _, found in plans for d in found.kept]))
    measured: dict[tuple[int, ...], PlanRow | target_compile.Refusal] = {}  # this search's compiles, one per layout
    for number, dims in enumerate(todo, 1):
        label = ",".join(map(str, dims))
        started = time.perf_counter()
        log(f"[{number}/{len(todo)}] compiling {label} on {math.prod(dims)} device(s) ...")
        measured[dims] = layout_measure.measure(builder, dims, devices[:math.prod(dims)], device_memory, compile_only)
        row = measured[dims]
        figures = (row.describe() if isinstance(row, target_compile.Refusal) else
                   f"{sizes.human_bytes(row.total_bytes)} per device, halo {sizes.human_bytes(row.halo_bytes)}")
        log(f"[{number}/{len(todo)}] {label}: {figures} ({time.perf_counter() - started:.1f} s)")
    base = measured.get(reference)
    base = base if isinstance(base, PlanRow) else None
    results = []
    for count, found in plans:
        rows = [measured[d] for d in found.kept if isinstance(measured[d], PlanRow)]
        refused = [measured[d] for d in found.kept if isinstance(measured[d], target_compile.Refusal)]
        if base is not None:
            rows = [dataclasses.replace(r, efficiency=round(base.temp_bytes / (r.partitions * r.temp_bytes), 4))
                    for r in rows]
        ranked = rank_rows(rows, device_memory) if layouts_to_try == "all" else rows
        seconds = round(sum(r.compile_seconds for r in [*rows, *refused]), 1)
        results.append(Search(count, ranked, found.pruned, seconds, refused, replaced=found.replaced,
                              cannot_divide=found.cannot_divide))
        if found.pruned and layouts_to_try == "all" and found.kept:
            log(f"N={count}: {pruned_line(found.pruned, '; ')}")
    return results

def pruned_line(pruned: Sequence[tuple[tuple[int, ...], str]], separator: str = " ") -> str:
    """What the plan says of its pruned layouts, by why: those that cannot divide, and those refused because XLA
    would compute the network's gradient wrongly (`thin_shards`), which do divide."""
    thin = [d for d, why in pruned if thin_shards.refused_for_gradient(why)]
    said = []
    for layouts, why in ([d for d, _ in pruned if d not in thin], "they cannot divide at some resolution level"), (
            thin, "XLA would compute their gradient wrongly (a window reaches across a whole shard with two or more "
                  "axes split; docs/your-own-network.md)"):
        if layouts:
            said.append(f"{len(layouts)} layout(s) pruned, {why}: " + separator.join(",".join(map(str, d))
                                                                                   for d in layouts))
    return "; ".join(said)

def plan(config: config_lib.TrainConfig, shape: tuple[int, ...], partitions: Sequence[int], *,
         device_memory: int | None = None, log: Callable[[str], None] = lambda line: None) -> list[PlanRow]:
    """The N-way-along-the-first-dimension row of every N (E(N) when N = 1 is among them)."""
    results = search(config, shape, partitions, layouts_to_try="default", device_memory=device_memory,
                     efficiency=1 in partitions, log=log)
    return [row for result in results for row in result.rows]
