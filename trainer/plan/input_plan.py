"""`fullres plan --data`: does this host feed the layout the plan chose? Its input rate beside the step's.

A process of the chosen layout reads its share of every batch: its rows and,
when depth is split across processes, its depths (`placed_share`). This module
measures how fast this host delivers that share from the user's own records
(`trainer.data.input_rate`: from the records on all cores and on one, and from
the decoded cache), sets it beside what the step needs (the rows a process
reads per step over the estimated step time, on a target), and says in one
line whether the input keeps up, or what would make it: host cores, the cache,
uncompressed records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from common import sizes
from trainer.data import batches, ct_input, decoded_cache, input_rate
from trainer.engine import placement


def placed_share(dims: Sequence[int], image_shape: Sequence[int], devices: int, processes: int,
                 process: int = 0) -> batches.Share:
    """The share of a global batch of `image_shape` that process `process` of `processes` reads under `dims`.

    Devices belong to processes in the mesh's order (the first `devices / processes` to process 0), as
    `device_mesh.build_mesh` lays out `jax.devices()`, which a multi-process run lists process by process.

    >>> placed_share((1, 16, 1, 1, 1), (1, 256, 256, 256, 1), 16, 4, 1)
    Share(rows=(0,), depth=(64, 128))
    """
    cores = math.prod(dims)
    replicas = devices // cores
    split = [(axis, parts) for axis, parts in enumerate(dims[1:-1], start=1) if parts > 1]
    mesh = (replicas, *(parts for _, parts in split))
    per_process = devices // processes
    per_replica = image_shape[0] // replicas
    blocks = []
    for flat in range(process * per_process, (process + 1) * per_process):
        coords = np.unravel_index(flat, mesh)
        index = [slice(int(coords[0]) * per_replica, (int(coords[0]) + 1) * per_replica)]
        index += [slice(0, size) for size in image_shape[1:]]
        for (axis, parts), coord in zip(split, coords[1:]):
            size = image_shape[axis] // parts
            index[axis] = slice(int(coord) * size, (int(coord) + 1) * size)
        blocks.append(tuple(index))
    return placement.share_of_blocks(blocks, tuple(image_shape))


def check_kind(data: str) -> str:
    """Refuses `--data` that are not records this module measures (CT volumes or video clips), before anything is
    compiled: detection's images with boxes are read by another input, whose rate this plan does not measure.
    Returns the records' kind (`tfrecord_schema.CT_RECORDS` or `VIDEO_RECORDS`), for `check_shape` and `plan_input`.

    Raises:
        FileNotFoundError, ValueError: `data_set.resolve`'s sentences (nothing there, records of mixed data sets).
        ValueError: one sentence naming the kind of records found and what to do.
    """
    from preprocessing.records import data_set, tfrecord_schema as schema

    kind = data_set.resolve(data, "--data").kind
    if kind in (schema.CT_RECORDS, schema.VIDEO_RECORDS):
        return kind
    fix = ("leave --data out to plan the detection step without measuring its input" if kind == schema.DETECTION_RECORDS
           else "convert the scans again with this fullres's fullres preprocess ct")
    raise ValueError(f"--data {data} holds {kind}, but fullres plan --data measures the input of CT volumes or video "
                     f"clips only (the records of fullres preprocess ct or video); {fix}, or pass CT or clip records.")


def _words(data: str, kind: str | None) -> tuple[str, str]:
    """What the records' examples and their first axis are called: ("clips", "frames") or ("volumes", "depths").
    `kind`: the records' kind as `check_kind` found it; None: found here."""
    from preprocessing.records import data_set, tfrecord_schema as schema

    kind = kind or data_set.resolve(data, "--data").kind
    return ("clips", "frames") if kind == schema.VIDEO_RECORDS else ("volumes", "depths")


def check_shape(data: str, volume: Sequence[int], kind: str | None = None) -> None:
    """Refuses records of another size than the planned volumes or clips (D, H, W), before anything is compiled.

    Raises:
        ValueError: one sentence naming both sizes and the --image-size to plan with.
    """
    records = ct_input.CtRecords(data)
    try:
        _check_shape(data, records, tuple(volume), _words(data, kind)[0])
    finally:
        records.close()


def _check_shape(data: str, records, volume: tuple[int, ...], examples: str) -> None:
    if tuple(records.shape) != volume:
        raise ValueError(f"--data {data} holds {examples} of {'x'.join(map(str, records.shape))} but the plan is for "
                         f"{'x'.join(map(str, volume))}; plan with --image-size "
                         f"{','.join(map(str, records.shape))}, or pass records of that size.")


def plan_input(data: str, dims: Sequence[int], image_shape: Sequence[int], devices: int, processes: int,
               step_seconds: float | None, log: Callable[[str], None] = lambda line: None,
               volume: Sequence[int] | None = None, kind: str | None = None) -> dict:
    """Measures this host's input for one process of the layout `dims` and compares it with the step.

    Args:
        data: the training data set (a folder or a pattern of its records).
        image_shape: one global batch (B, D, H, W, C).
        devices, processes: the target's devices and processes (hosts).
        volume: the volumes' (D, H, W) when the batch holds crops of them (patches, read as `fullres train
            --patch-size` reads them); None: the batch holds whole volumes.
        step_seconds: the step's estimate (None: no estimate, as on `cpu`).
        kind: the records' kind as `check_kind` found it (None: found again here).

    Returns:
        The JSON `fullres plan --json` carries as `input`, with `line` (what the plan prints) and `host` (what a
        host needs, for the launch).

    Raises:
        ValueError: the records do not have the planned shape.
    """
    patch = None if volume is None or tuple(volume) == tuple(image_shape[1:-1]) else tuple(image_shape[1:-1])
    volume = tuple(volume or image_shape[1:-1])
    examples, along = _words(data, kind)
    records = ct_input.CtRecords(data)
    try:
        _check_shape(data, records, volume, examples)
        share = placed_share(dims, image_shape, devices, processes)
        start, stop = share.depth_of(image_shape[1])
        plane = patch[1:] if patch else records.shape[1:]
        # A voxel as read: its image values in the records' own type and channels (CT int16 x 1, a clip uint8 x 3)
        # and its uint8 label.
        share_bytes = (stop - start) * math.prod(plane) * records.layout(0).voxel_bytes
        cores = batches.usable_cores()
        crops = f" of {'x'.join(map(str, patch))} crops" if patch else ""
        log(f"measuring this host's input from {data}: {along} {start}-{stop - 1}{crops} of {records.shape[0]} "
            f"({sizes.human_bytes(share_bytes)} an example), {len(records)} examples, {cores} core(s) ...")
        read = input_rate.measure(records, share.depth, cached=False, patch=patch)
        one_core = input_rate.measure(records, share.depth, cached=False, cores=1, patch=patch) if cores > 1 else read
        cached = input_rate.measure(records, share.depth, cached=True, patch=patch)
        # The cache holds what is read of each example: the share's depths, or (crops move) the whole volume.
        cache_bytes = records.share_bytes(None if patch else stop - start)
        cache_on, cache_reason = decoded_cache.choose_cache("auto", cache_bytes, decoded_cache.memory_available())
        compressed = records.compressed
        count = len(records)
    finally:
        records.close()
    rows = len(share.rows)
    needed = rows / step_seconds if step_seconds else None
    rate = cached if cache_on else read
    result = {"share": {"rows": list(share.rows), "depth": [start, stop], "along": along,
                        "bytes_per_example": share_bytes, "patch": list(patch) if patch else None},
              "processes": processes, "examples": count, "compressed": compressed,
              "records": read.to_json(), "one_core": one_core.to_json(), "cache": cached.to_json(),
              "cache_chosen": cache_on, "cache_reason": cache_reason,
              "needed_examples_per_second": None if needed is None else round(needed, 2),
              "keeps_up": None if needed is None else rate.examples_per_second >= needed}
    per_core = one_core.examples_per_second
    host = {"cache_bytes_per_process": cache_bytes}
    if needed is not None:
        host["cores_for_input"] = math.ceil(needed / per_core) if per_core else None
    result["host"] = host
    result["line"] = _line(result, rate, needed, step_seconds, cores, per_core)
    return result


def _line(result: dict, rate: input_rate.Rate, needed: float | None, step_seconds: float | None, cores: int,
          per_core: float) -> str:
    share, records, cached = result["share"], result["records"], result["cache"]
    crops = f" of {'x'.join(map(str, share['patch']))} crops" if share.get("patch") else ""
    what = (f"input: one process's share (rows {','.join(map(str, share['rows']))}, {share['along']} {share['depth'][0]}-"
            f"{share['depth'][1] - 1}{crops}, {sizes.human_bytes(share['bytes_per_example'])} an example) from "
            f"{'GZIP' if result['compressed'] else 'uncompressed'} records: {records['examples_per_second']:.1f}/s "
            f"({records['mib_per_second']:.0f} MiB/s) on {cores} core(s), {per_core:.1f}/s on 1"
            + (f" ({records['examples_per_second'] / per_core:.2f}x)" if per_core and cores > 1 else "")
            + f"; from the decoded cache {cached['examples_per_second']:.1f}/s ({cached['mib_per_second']:.0f} MiB/s);"
            f" the cache would be {result['cache_reason']}")
    if needed is None:
        return what + "; no step estimate to compare with (plan for a --target)"
    need = (f"the step needs {needed:.1f}/s per process ({len(share['rows'])} row(s) every "
            f"{step_seconds * 1e3:.3g} ms, est.)")
    if rate.examples_per_second >= needed:
        return f"{what}; {need}: input keeps up"
    fixes = []
    if per_core:
        fixes.append(f"{math.ceil(needed / per_core)} host cores at this host's rate per core (it has {cores})")
    if not result["cache_chosen"] and cached["examples_per_second"] >= needed:
        fixes.append(f"the cache (--input-cache on: {sizes.human_bytes(result['host']['cache_bytes_per_process'])} "
                     "per process)")
    if result["compressed"]:
        fixes.append("uncompressed records (fullres preprocess without --compress)")
    return f"{what}; {need}: input-bound; {', or '.join(fixes)} would feed it"
