"""`fullres plan --largest`: the largest volume one replica over all of a target's devices trains whole.

The sizes searched are those the network takes: each grown axis a multiple of `2 ** downsampling_levels` at which
some split of the devices divides every resolution level (`sizes_taken`; nothing is compiled at any other size). At
each size `SizeProbe`:

1. keeps the layouts that divide (`layout_search.candidates`, as `fullres plan --layouts` says) and orders them by
   the halo any correct step must exchange (`layout_measure.lower_bound`, nothing compiled);
2. compiles the `CPU_LAYOUTS` of least halo for this machine's CPU, the pre-filter: a layout whose CPU figure times
   `target_search.LEAST_SHARE_OF_CPU` exceeds the device's memory is not compiled for the target;
3. compiles the rest for the target, leanest CPU figure first, and stops at the first that fits (the device's bytes:
   `target_search.with_device_terms`); after a miss, a layout whose CPU figure times the least target ÷ CPU ratio
   this size has shown still exceeds the memory is not compiled either.

`edge_search.find_edge` picks the sizes: first the start, then the size the start's bytes scale to (activations
grow with the voxels), then steps doubling away until the answer changes, then bisection. Every compile is read back
from the plan cache when the same step was compiled before (`target_compile.PlanCache`). A size the time bound
(`max_seconds`) did not reach is said as not searched.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from common import sizes
from trainer.parallel import partitioning
from trainer.plan import (edge_search, layout_measure, layout_search, plan_row, target_compile, target_search,
                          targets)

CPU_LAYOUTS = 4  # layouts of least halo bound estimated on the CPU at each size (each is one CPU compile)
MAX_SIDE = 4096  # the largest side searched, voxels
AXES = {2: ("height", "width"), 3: ("depth", "height", "width")}


@dataclasses.dataclass(frozen=True)
class Point:
    """One size's answer: `fits` True/False, or None where the time bound stopped it (not searched).

    `row`: the layout that fits (or the leanest the target compiled); `refused`: the leanest refusal of the target's
    compiler; `why`: for a miss or an unsearched size, in words; `seconds`: what the size took here.
    """

    size: tuple[int, ...]
    fits: bool | None
    row: plan_row.PlanRow | None = None
    refused: target_compile.Refusal | None = None
    why: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"size": list(self.size), "fits": self.fits, "why": self.why, "seconds": round(self.seconds, 1),
                "row": None if self.row is None else self.row.to_json(),
                "refused": None if self.refused is None else self.refused.to_json()}


def parse_axes(text: str, spatial: int) -> tuple[int, ...]:
    """`cube` (every spatial axis) or axis names (`depth`, `depth,height`) -> the indices of the axes that grow.

    Example:
        >>> parse_axes("cube", 3), parse_axes("depth", 3), parse_axes("height,width", 2)
        ((0, 1, 2), (0,), (0, 1))
    """
    names = AXES[spatial]
    if text.strip().lower() in ("cube", "square", "all"):
        return tuple(range(spatial))
    chosen = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in names]
    if unknown or not chosen:
        raise ValueError(f"--largest {text}: {unknown[0] if unknown else 'nothing'} is no axis of a {spatial}-D "
                         f"input; name the axes that grow ({', '.join(names)}), e.g. --largest {names[0]}, or "
                         "--largest cube.")
    return tuple(sorted({names.index(part) for part in chosen}))


def sizes_taken(config, base: Sequence[int], axes: Sequence[int], count: int, channels: int,
                limit: int = MAX_SIDE) -> list[tuple[int, ...]]:
    """The spatial sizes searched: `base` with the `axes` grown together to each multiple of the network's
    divisor (`2 ** downsampling_levels` of those axes) up to `limit`, where some split of `count` devices divides
    every resolution level."""
    levels = partitioning.per_axis(config.model.downsampling_levels, len(base))
    step = math.lcm(*(2 ** levels[axis] for axis in axes))
    splits = layout_search.layouts(count, len(base))
    found = []
    for side in range(step, limit + 1, step):
        size = tuple(side if axis in axes else value for axis, value in enumerate(base))
        kept, _ = layout_search.prune(splits, config, (*size, channels))
        if kept:
            found.append(size)
    return found


class SizeProbe:
    """Does one size train whole on `target` (all its devices one replica)? See the module's docstring."""

    def __init__(self, config, target: targets.Target, count: int, layouts_to_try, device_memory: int,
                 cache: target_compile.PlanCache | None, deadline: float, log: Callable[[str], None], channels: int):
        import jax

        self.config, self.target, self.count, self.layouts_to_try = config, target, count, layouts_to_try
        self.memory, self.cache, self.deadline, self.log = device_memory, cache, deadline, log
        self.cpu_devices = jax.devices("cpu")
        self.target_devices = None if target.platform == "cpu" else targets.devices(target)
        self.channels = channels

    def _late(self) -> bool:
        return time.perf_counter() > self.deadline

    def __call__(self, size: tuple[int, ...]) -> Point:
        started = time.perf_counter()
        point = self._probe(tuple(size))
        point = dataclasses.replace(point, seconds=time.perf_counter() - started)
        label = "x".join(map(str, size))
        verdict = {True: "fits", False: "does not fit", None: "not searched"}[point.fits]
        self.log(f"[{self.target.name}] {label}: {verdict}"
                 + (f", {point.why}" if point.why else "")
                 + ("" if point.fits is None else " (from the plan cache)" if point.row is not None and point.row.cached
                    else f" ({point.seconds:.0f} s)"))
        return point

    def _probe(self, size: tuple[int, ...]) -> Point:
        if self._late():
            return Point(size, None, why="the time bound was reached before it")
        shape = (*size, self.channels)
        builder = layout_search.lazy_builder(self.config, shape)
        found = layout_search.candidates(self.layouts_to_try, self.count, self.config, shape, builder)
        if not found.kept:
            return Point(size, False, why=found.cannot_divide)
        built = builder()
        windows = built.windows()
        order = sorted(found.kept, key=lambda dims: (layout_measure.lower_bound(windows, dims), dims))[:CPU_LAYOUTS]
        cpu = []
        for dims in order:
            if self._late():
                return Point(size, None, why="the time bound was reached during its CPU estimates")
            cpu.append(layout_measure.measure(built, dims, self.cpu_devices[:self.count], self.memory,
                                              cache=self.cache))
        cpu.sort(key=lambda row: row.total_bytes)
        if self.target.platform == "cpu":
            fitting = [row for row in cpu if row.total_bytes <= self.memory]
            return Point(size, bool(fitting), (fitting or cpu)[0],
                         why="" if fitting else f"its leanest layout needs {sizes.human_bytes(cpu[0].total_bytes)}")
        ratios = []  # the target's bytes ÷ the CPU's, of this size's layouts compiled so far
        best = refused = None
        for row in cpu:
            share = min(ratios) if ratios else target_search.LEAST_SHARE_OF_CPU[self.target.platform]
            if row.total_bytes * share > self.memory:
                continue
            if self._late():
                return Point(size, None, best, refused, why="the time bound was reached during its target compiles")
            measured = layout_measure.measure(built, row.input_partition_dims, self.target_devices[:self.count],
                                              self.memory, compile_only=True, cache=self.cache)
            if isinstance(measured, target_compile.Refusal):
                refused = refused or measured
                ratios.append(measured.needed_bytes / row.total_bytes)
                continue
            measured = target_search.with_device_terms(
                target_search._with_estimate(measured, row, self.target, self.config.precision), built, self.target,
                self.memory)
            if measured.fits:
                return Point(size, True, measured)
            best = best or measured
            ratios.append(measured.total_bytes / row.total_bytes)
        if best is None and refused is None:
            return Point(size, False, why=f"the CPU figure of its leanest layout, {sizes.human_bytes(cpu[0].total_bytes)}"
                         f" per device, {target_search._why_not_compiled(self.target, self.memory)}")
        needed = best.total_bytes if best is not None else refused.needed_bytes
        return Point(size, False, best, refused, why=f"needs {sizes.human_bytes(needed)} of "
                                                     f"{sizes.human_bytes(self.memory)} per device")


@dataclasses.dataclass(frozen=True)
class Largest:
    """What `search` found: the largest size that fits (None: none searched fits), the next size searched that
    does not, the sizes not searched (first and last of them), every point, the time taken and the bound."""

    best: Point | None
    miss: Point | None
    unsearched: tuple[tuple[int, ...], tuple[int, ...]] | None
    points: list[Point]
    seconds: float
    max_seconds: float
    searched_up_to: int


def _guess(sizes_list: list[tuple[int, ...]], axes: Sequence[int], memory: int) -> Callable[[int, Point], int]:
    """From one size's bytes, the index of the size its activations scale to at `memory` (they grow with the voxels;
    the arguments do not)."""
    def guess(index: int, point: Point) -> int:
        used = point.row.total_bytes if point.row is not None else (
            point.refused.needed_bytes if point.refused is not None else None)
        if used is None:
            return index - 1 if point.fits is False else index + 1
        fixed = point.row.argument_bytes if point.row is not None else 0
        grow = max(memory - fixed, 1) / max(used - fixed, 1)
        side = sizes_list[index][axes[0]] * grow ** (1 / len(axes))
        below = [i for i, size in enumerate(sizes_list) if size[axes[0]] <= side]
        return below[-1] if below else 0
    return guess


def search(probe: Callable[[tuple[int, ...]], Point], sizes_list: list[tuple[int, ...]], axes: Sequence[int],
           start: tuple[int, ...] | None, memory: int, max_seconds: float, started: float) -> Largest:
    """The largest of `sizes_list` that `probe` says fits (`edge_search.find_edge`), starting at `start` (or the
    nearest size below it)."""
    first = 0
    if start is not None:
        below = [i for i, size in enumerate(sizes_list) if size[axes[0]] <= start[axes[0]]]
        first = below[-1] if below else 0
    edge = edge_search.find_edge(len(sizes_list), lambda i: probe(sizes_list[i]), lambda p: p.fits, first,
                                 _guess(sizes_list, axes, memory))
    unsearched = None
    if edge.unsearched:
        unsearched = (sizes_list[edge.unsearched[0]], sizes_list[edge.unsearched[-1]])
    return Largest(None if edge.last_fit is None else edge.points[edge.last_fit],
                   None if edge.first_miss is None else edge.points[edge.first_miss], unsearched,
                   list(edge.points.values()), time.perf_counter() - started, max_seconds,
                   sizes_list[-1][axes[0]] if sizes_list else 0)
