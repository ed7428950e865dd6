"""`input_partition_dims = "auto"`: the layout training uses, chosen by compiling and ranking them all.

`choose_layout` runs `layout_search.search` for the devices present and takes the
best-ranked layout (least halo, then least memory); the choice and why are
cached beside the run (`layout_choice.json`) and reused while the config (its
paths aside), the example shape and the devices stay the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence

from common import sizes
from trainer import config as config_lib
from trainer.parallel import partitioning
from trainer.plan import compiled_step, layout_search

CACHE_FILE = "layout_choice.json"  # beside train_config.json: the "auto" choice of this run and why



@dataclasses.dataclass(frozen=True)
class LayoutChoice:
    """What `input_partition_dims = "auto"` resolved to, and why (recorded in metrics.json)."""

    input_partition_dims: tuple[int, ...]
    reason: str
    key: str
    rows: list[dict]
    pruned: int
    cached: bool = False

    def to_json(self) -> dict:
        return {"requested": partitioning.AUTO, "input_partition_dims": list(self.input_partition_dims),
                "reason": self.reason, "key": self.key, "pruned": self.pruned, "cached": self.cached,
                "rows": self.rows}


def choice_key(config: config_lib.TrainConfig, shape: Sequence[int], devices) -> str:
    """A hash of what the choice depends on: the run's settings (not its paths), the example shape, the devices."""
    values = config_lib.to_dict(config)
    for path in ("train_data", "output_dir", "eval_data"):
        values.pop(path, None)
    device_kinds = sorted({f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in devices})
    text = json.dumps({"config": values, "shape": list(shape), "devices": [len(devices), device_kinds]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def choose_layout(config: config_lib.TrainConfig, shape: Sequence[int], devices, *, cache_dir: str | None = None,
                  log: Callable[[str], None] = lambda line: None) -> LayoutChoice:
    """Resolves `input_partition_dims = "auto"`: the best-ranked layout of the devices present for `shape`.

    Each example is split over all devices (one replica); when no layout of
    that many cores divides the volume, over the largest divisor of the device
    count that does and leaves whole replicas for the batch. The choice is read
    from `cache_dir/layout_choice.json` when the config (paths aside), the
    example shape and the devices are the ones it was made for; otherwise the
    layouts are compiled and ranked (`search`).

    Returns:
        A `LayoutChoice`; `save_choice` writes it to the cache.

    Raises:
        partitioning.PartitionError: no layout of any usable core count divides the volume.
    """
    shape = tuple(shape)
    key = choice_key(config, shape, devices)
    path = os.path.join(cache_dir, CACHE_FILE) if cache_dir else None
    if path and os.path.exists(path):
        try:
            with open(path) as file:
                cached = json.load(file)
        except (OSError, json.JSONDecodeError):
            cached = {}  # cut short or unreadable: choose again, and overwrite it
        if cached.get("key") == key:
            return LayoutChoice(tuple(cached["input_partition_dims"]), cached["reason"], key, cached["rows"],
                                cached["pruned"], cached=True)
        log(f"input_partition_dims auto: the config or the devices changed since {path}; choosing again")
    count = len(devices)
    counts = [n for n in range(count, 0, -1) if count % n == 0 and config.batch_size % (count // n) == 0]
    spatial = len(shape) - 1
    # Each core count's layouts that divide the volume at every resolution level (nothing compiled), and what a side
    # must divide by (× the parts) at every level, which the refusal below names.
    dividing = [(cores, *layout_search.prune(layout_search.layouts(cores, spatial), config, shape)) for cores in counts]
    factors = [2**n for n in partitioning.per_axis(config.model.downsampling_levels, spatial)]
    gathering: list[int] = []  # core counts whose every layout that compiled all-gathers activations
    for cores, kept, pruned in dividing:
        if not kept:
            continue
        log(f"input_partition_dims auto: compiling the {len(kept)} layout(s) of {cores} cores that divide "
            f"{list(shape[:-1])} ({len(pruned)} pruned) ...")
        try:
            result = layout_search.search(config, shape, [cores], devices=devices[:cores], efficiency=False,
                                          log=log)[0]
        except partitioning.PartitionError:  # every layout that divides is one XLA would differentiate wrongly
            continue
        # Training refuses a step that all-gathers activations (unless --allow-gathers): never pick one it refuses.
        usable = [r for r in result.rows if config.allow_gathers or not r.activation_all_gathers]
        if usable:
            break
        gathering.append(cores)
        log(f"input_partition_dims auto: every layout of {cores} cores all-gathers activations; trying fewer cores "
            "per replica")
    else:
        factor = str(factors[0]) if len(set(factors)) == 1 else f"({', '.join(map(str, factors))}, per axis)"
        raise partitioning.PartitionError(
            f"input_partition_dims auto: no split of {count} devices (nor of fewer cores per replica, with batch "
            f"{config.batch_size}) divides {list(shape[:-1])} at every resolution level"
            + (f" without all-gathering activations (every layout of {', '.join(map(str, gathering))} cores "
               "does)" if gathering else "")
            + f"; give the volume sides that divide by {factor} × the parts, or set input_partition_dims "
            "explicitly.")
    best = usable[0]
    pruned = result.pruned  # the search prunes every layout again (and, by `thin_shards`, a network XLA would
    # differentiate wrongly): counting the first pass too counted those that cannot divide twice
    along_first = compiled_step.default_partition_dims(cores, spatial + 2)
    default = next((r for r in result.rows if r.input_partition_dims == along_first), None)
    skipped = len(result.rows) - len(usable)
    reason = (f"least halo exchange of {len(usable)} layout(s) of {cores} cores ({len(pruned)} pruned"
              + (f", {skipped} that all-gather activations set aside" if skipped else "") + "): "
              f"{sizes.human_bytes(best.halo_bytes)} per device per step"
              + (f" ({best.halo_ratio:.2f}× its lower bound)" if best.halo_ratio else "")
              + (f" and {sizes.human_bytes(best.ring_bytes)} of ring attention" if best.ring_bytes else "")
              + f", {sizes.human_bytes(best.total_bytes)} per device"
              + (" (within 2 % of the leanest layout)" if not skipped else "")
              + (f"; {','.join(map(str, along_first))}: {sizes.human_bytes(default.halo_bytes)} halo, "
                 f"{sizes.human_bytes(default.total_bytes)}" if default is not None and default is not best else ""))
    if cores < count:
        reason += (f"; {count // cores} replicas, since no layout of {count} cores divides the volume"
                   + (" without all-gathering activations" if gathering else ""))
    return LayoutChoice(best.input_partition_dims, reason, key, [r.to_json() for r in result.rows], len(pruned))


def save_choice(choice: LayoutChoice, directory: str) -> None:
    """Writes `choice` to `directory/layout_choice.json` (atomically), for the next run with the same config."""
    path = os.path.join(directory, CACHE_FILE)
    with open(path + ".tmp", "w") as file:
        json.dump(choice.to_json(), file, indent=2)
    os.replace(path + ".tmp", path)
