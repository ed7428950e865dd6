"""What to rent: `fullres plan --largest` (the largest volume a target trains whole) and `fullres plan --target v5e`
(the smallest slice of a generation that trains a volume whole), run and said in words or JSON.

Both resolve the run as `fullres train` would (`compiled_step.plan_config`), put one replica over all of a
slice's devices (batch as the preset says, per replica), and ask `largest_volume.SizeProbe` per size or slice:
the CPU's figures as the pre-filter, then the target's own compiler, the device's bytes (`device_bytes`). These are
compiler figures, not device measurements. `max_seconds` bounds the whole search; what it did not reach is said
as not searched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from common import sizes
from trainer import config as config_lib
from trainer.engine import recorded_settings
from trainer.plan import (compiled_step, device_bytes, edge_search, largest_volume, layout_search, smallest_slice,
                          target_compile, targets)

DEFAULT_MAX_SECONDS = 900.0  # 15 minutes: about ten target compiles of a 3D UNet on a 2-core machine


def _config(model, preset, settings, set_pairs, image_size):
    """The run and one example's shape (channels last), as `fullres plan` resolves them."""
    settings = dict(settings or {})
    config = compiled_step.plan_config(model, preset, settings, given=recorded_settings.typed_as({}, set_pairs or {}))
    config = config_lib.with_dims(config, compiled_step.default_partition_dims(1, config.model.spatial_dims + 2))
    return config, compiled_step.example_shape(config, image_size)


def _network(config) -> str:
    source = getattr(config.model, "source", None)
    return source.rsplit("/", 1)[-1] if source else type(config.model).__name__


def _terms(target: targets.Target) -> tuple[str, dict | None]:
    """The compiler's name and versions for the text, and `device_bytes.plan_json` (None on the CPU)."""
    versions = target_compile.compiler_versions()
    if target.platform == "cpu":
        return f"XLA:CPU (jaxlib {versions.get('jaxlib')})", None
    name = (f"libtpu {versions.get('libtpu')}" if target.platform == "tpu"
            else f"XLA's CUDA compiler (jax-cuda12-plugin {versions.get('jax-cuda12-plugin')})")
    return f"{name}, jax {versions.get('jax')}", device_bytes.plan_json(target.platform, versions)


def step_time(row) -> dict | None:
    """The step time the target's compiler estimates: the TPU compiler's `optimal_seconds`, else the roofline.

    An `optimal_seconds` that is no time (libtpu 0.0.42.1 said -83.8 s for 1024³ over v5e:16x16) gives way to the
    roofline, and the source says so.
    """
    if row is None:
        return None
    compiler = row.compiler_seconds
    if compiler is not None and compiler > 0:
        return {"seconds": compiler, "source": "the TPU compiler's optimal_seconds"}
    seconds = (row.estimate or {}).get("seconds")
    if seconds is None:
        return None
    source = f"roofline ({row.estimate.get('bound')}-bound)"
    if compiler:
        source += f"; the TPU compiler's optimal_seconds, {compiler:.3g} s, is no time"
    return {"seconds": seconds, "source": source}


def point_line(point: largest_volume.Point, memory: int) -> str:
    """'1024x1024x1024 fits, layout 1,4,4,4,1: 80 GiB per device (...), halo ..., step ~3.2 s (...)'."""
    size = "x".join(map(str, point.size))
    if point.fits is None:
        return f"{size}: not searched ({point.why})"
    if not point.fits:
        return f"{size} does not fit: {point.why}"
    row = point.row
    compiler = ("" if row.compiler_total_bytes is None else
                f"; its compiler {sizes.human_bytes(row.compiler_total_bytes)}")
    timed = step_time(row)
    return (f"{size} fits, layout {','.join(map(str, row.input_partition_dims))}: "
            f"{sizes.human_bytes(row.total_bytes)} per device of {sizes.human_bytes(memory)}{compiler}, "
            f"{sizes.human_bytes(memory - row.total_bytes)} free; halo {sizes.human_bytes(row.halo_bytes)} per step"
            + ("" if timed is None else f"; step ~{timed['seconds']:.3g} s ({timed['source']})"))


def largest(*, model=None, preset="default", settings=None, set_pairs=None, image_size=None, axes_text="cube",
            target="cpu", layouts_to_try="all", partitions: Sequence[int] | None = None, device_memory=None,
            max_seconds: float = DEFAULT_MAX_SECONDS, cache_dir=None, use_cache=True,
            log: Callable[[str], None] = lambda line: None) -> dict:
    """`fullres plan --largest`: the result as JSON (`lines` says it in words).

    On a TPU slice or GPUs, one replica over all its devices, sized by its compiler; on `cpu`, `partitions` (one
    N, default 1) devices of this machine against `device_memory` (which the CPU needs: `cli_rent` says so).

    Raises:
        ValueError: a bad axis, or no size the network takes (one sentence).
        targets.MissingCompiler: the target's compiler is not installed.
    """
    started = time.perf_counter()
    on = targets.parse(target)
    count = (partitions[0] if partitions else 1) if on.platform == "cpu" else on.device_count
    memory = sizes.parse_bytes(device_memory) if device_memory else targets.memory_per_device(on)
    config, shape = _config(model, preset, settings, set_pairs, image_size)
    axes = largest_volume.parse_axes(axes_text, len(shape) - 1)
    found = largest_volume.sizes_taken(config, shape[:-1], axes, count, shape[-1])
    if not found:
        raise ValueError(f"no size up to {largest_volume.MAX_SIDE} voxels along the grown axes can be split over "
                         f"{count} devices at every resolution level of this network; try fewer devices.")
    step = found[0][axes[0]]
    cache = target_compile.PlanCache(cache_dir) if use_cache else None
    probe = largest_volume.SizeProbe(config, on, count, layouts_to_try, memory, cache, started + max_seconds, log,
                                     shape[-1])
    log(f"searching {len(found)} sizes ({step} to {found[-1][axes[0]]} voxels along "
        f"{', '.join(largest_volume.AXES[len(shape) - 1][a] for a in axes)}) "
        f"for the largest that fits, within {max_seconds:g} s")
    result = largest_volume.search(probe, found, axes, tuple(shape[:-1]), memory,
                                   max_seconds, started)
    compiler, terms = _terms(on)
    return {"mode": "largest", "target": on.name, "devices": count, "network": _network(config),
            "precision": config.precision, "batch_size": config.batch_size, "base_size": list(shape[:-1]),
            "axes": [largest_volume.AXES[len(shape) - 1][a] for a in axes], "multiple": step,
            "device_memory_bytes": memory, "layouts": layouts_to_try if isinstance(layouts_to_try, str)
            else list(layouts_to_try), "compiler": compiler, "device_bytes": terms,
            "max_seconds": max_seconds, "seconds": round(result.seconds, 1),
            "largest": None if result.best is None else result.best.to_json(),
            "next_searched": None if result.miss is None else result.miss.to_json(),
            "not_searched": None if result.unsearched is None else [list(s) for s in result.unsearched],
            "searched_up_to": result.searched_up_to, "step_time": step_time(result.best and result.best.row),
            "points": [p.to_json() for p in result.points]}


def smallest(*, kind: str, model=None, preset="default", settings=None, set_pairs=None, image_size=None,
             layouts_to_try="all", max_seconds: float = DEFAULT_MAX_SECONDS, cache_dir=None, use_cache=True,
             log: Callable[[str], None] = lambda line: None) -> dict:
    """`fullres plan --target v5e`: the smallest slice of `kind` that trains `image_size` whole, and the next."""
    started = time.perf_counter()
    config, shape = _config(model, preset, settings, set_pairs, image_size)
    every = smallest_slice.slices(kind)
    candidates = [t for t in every if layout_search.prune(layout_search.layouts(t.device_count, len(shape) - 1),
                                                          config, shape)[0]]  # those that can split the volume at all
    cache = target_compile.PlanCache(cache_dir) if use_cache else None
    deadline = started + max_seconds

    def probe(index: int) -> largest_volume.Point:
        on = candidates[-1 - index]  # find_edge keeps what fits at the low indices: the largest slices first
        return largest_volume.SizeProbe(config, on, on.device_count, layouts_to_try, targets.memory_per_device(on),
                                        cache, deadline, log, shape[-1])(shape[:-1])

    count = len(candidates)
    # From the smallest slice up: a slice far too small costs CPU estimates only (its CPU figure exceeds the memory)
    edge = edge_search.find_edge(count, probe, lambda p: p.fits, count - 1)
    by_slice = {candidates[-1 - i].name: p for i, p in edge.points.items()}
    chosen = None if edge.last_fit is None else candidates[-1 - edge.last_fit]
    following = None
    if chosen is not None and edge.last_fit > 0 and time.perf_counter() < deadline:
        following = candidates[-edge.last_fit]
        if following.name not in by_slice:
            by_slice[following.name] = probe(edge.last_fit - 1)
    compiler, terms = _terms(candidates[0])
    unsearched = [candidates[-1 - i].name for i in edge.unsearched]
    return {"mode": "smallest", "generation": kind, "size": list(shape[:-1]), "network": _network(config),
            "precision": config.precision, "batch_size": config.batch_size, "layouts": layouts_to_try
            if isinstance(layouts_to_try, str) else list(layouts_to_try), "compiler": compiler, "device_bytes": terms,
            "max_seconds": max_seconds, "seconds": round(time.perf_counter() - started, 1),
            "slices_considered": [t.name for t in candidates],
            "cannot_split": [t.name for t in every if t not in candidates],
            "smallest": None if chosen is None else {"target": chosen.name, "devices": chosen.device_count,
                                                     "device_memory_bytes": targets.memory_per_device(chosen),
                                                     **by_slice[chosen.name].to_json()},
            "next_larger": None if following is None else {
                "target": following.name, "devices": following.device_count,
                "device_memory_bytes": targets.memory_per_device(following), **by_slice[following.name].to_json()},
            "not_searched": sorted(unsearched, key=lambda name: [t.name for t in candidates].index(name)),
            "step_time": step_time(None if chosen is None else by_slice[chosen.name].row),
            "points": [{"target": name, **p.to_json()} for name, p in by_slice.items()]}


def _point(values: dict | None) -> largest_volume.Point | None:
    if values is None:
        return None
    from trainer.plan import plan_row

    return largest_volume.Point(tuple(values["size"]), values["fits"], values["row"] and plan_row.PlanRow.from_json(
        values["row"]), None, values["why"], values["seconds"])


def lines(result: dict) -> list[str]:
    """The result of `largest` or `smallest` in words."""
    bound = (f"--max-seconds {result['max_seconds']:g}"
             + (" (the default)" if result["max_seconds"] == DEFAULT_MAX_SECONDS else ""))
    said = [f"{result['network']}, {result['precision']}, batch {result['batch_size']} per replica, layouts "
            f"{result['layouts']}; by {result['compiler']}: compiler figures, not device measurements; {bound}, "
            f"searched in {result['seconds']:.0f} s"]
    if result["device_bytes"]:
        said.append(f"per device: {result['device_bytes']['device_bytes']}")
    if result["mode"] == "largest":
        memory = result["device_memory_bytes"]
        grown = "cube" if len(result["axes"]) == len(result["base_size"]) else "x".join(result["axes"])
        said.insert(0, f"largest {grown} of {result['base_size']} (multiples of "
                       f"{result['multiple']} the network takes) that trains whole on {result['target']}, one "
                       f"replica over {result['devices']} device(s) of {sizes.human_bytes(memory)}:")
        best, miss = _point(result["largest"]), _point(result["next_searched"])
        said.append(f"largest that fits: {point_line(best, memory)}" if best else
                    "none of the sizes searched fits")
        if miss is not None:
            said.append(f"next size searched: {point_line(miss, memory)}")
        elif best is not None and result["not_searched"] is None:
            said.append(f"the largest size searched ({result['searched_up_to']} voxels) fits: larger ones were not "
                        "searched")
        if result["not_searched"]:
            first, last = ("x".join(map(str, s)) for s in result["not_searched"])
            said.append(f"not searched (the time ran out): {first}" + ("" if first == last else f" to {last}")
                        + "; give more --max-seconds to reach them")
        return said
    said.insert(0, f"smallest {result['generation']} slice that trains {'x'.join(map(str, result['size']))} whole "
                   f"(one replica over all its devices; slices {', '.join(result['slices_considered'])}):")
    for key, words in (("smallest", "smallest"), ("next_larger", "next larger")):
        found = result[key]
        if found is not None:
            said.append(f"{words}: {found['target']} ({found['devices']} devices): "
                        f"{point_line(_point(found), found['device_memory_bytes'])}")
    if result["smallest"] is None:
        said.append("none of the slices searched trains it whole" + ("" if result["not_searched"] else
                    f" (up to {result['slices_considered'][-1]}); try bfloat16, --remat or a smaller volume"))
    elif result["next_larger"] is None and result["smallest"]["target"] != result["slices_considered"][-1]:
        said.append("next larger slice: not searched (the time ran out)")
    if result["not_searched"]:
        said.append(f"not searched (the time ran out): {', '.join(result['not_searched'])}; give more --max-seconds "
                    "to reach them")
    return said
