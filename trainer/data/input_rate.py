"""How fast this host delivers one process's share of a data set: what `fullres plan --data` and the benchmark measure.

The rate is the training input's own (`ct_batches.CtBatches`: read, check,
decode into the batch buffers that go to the accelerator), measured over whole
passes of the data set, from the records or from the decoded cache, on all the
cores this process may use or on fewer (the reading threads are pinned, as
`taskset` would pin a process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

from trainer.data import batches, ct_batches, ct_input


@dataclasses.dataclass(frozen=True)
class Rate:
    """Examples (of the share measured) per second, their bytes per second, and how they were read."""

    examples_per_second: float
    mib_per_second: float
    cores: int
    cached: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def pinned_to(cores: int):
    """The calling thread (and the threads it starts) on the first `cores` of this process's cores, then back."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:cores])
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def measure(records: ct_input.CtRecords, depth: tuple[int, int] | None = None, *, cached: bool = False,
            cores: int | None = None, min_seconds: float = 2.0, patch: tuple[int, ...] | None = None) -> Rate:
    """This host's rate for the depth range `depth` (None: whole examples), one example per step.

    Args:
        cached: from the decoded cache (filled by one untimed pass first), else from the records every time.
        cores: read on this many of the usable cores (default: all of them).
        min_seconds: measure whole passes of the data set until at least this long.
        patch: (d, h, w): each example a random crop of this shape, as `fullres train --patch-size` reads them
            (`depth` then a range of the crop's depth).
    """
    cores = min(cores or batches.usable_cores(), batches.usable_cores())
    share = batches.Share((0,), depth)
    crop = tuple(patch) if patch is not None else records.shape
    start, stop = share.depth_of(crop[0])
    example_bytes = (stop - start) * crop[1] * crop[2] * records.layout(0).voxel_bytes  # image (every channel), label
    with pinned_to(cores):
        stream = ct_batches.CtBatches(records, 1, share, seed=0, cache="on" if cached else "off", workers=cores,
                                    patch=patch)
        held = []

        def take(count: int) -> None:
            for _ in range(count):
                held.append(next(stream))
                if len(held) > 2:  # as the training loop holds them: the step in flight and the next
                    held.pop(0).release()

        try:
            if cached:
                take(len(records))  # the first pass fills the cache
            taken, started = 0, time.perf_counter()
            while taken == 0 or time.perf_counter() - started < min_seconds:
                take(len(records))
                taken += len(records)
            seconds = time.perf_counter() - started
        finally:
            stream.close()
    return Rate(round(taken / seconds, 2), round(taken * example_bytes / 2**20 / seconds, 1), cores, cached)
