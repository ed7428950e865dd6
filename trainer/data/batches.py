"""What the input hands the training loop each step, and the machinery that reads ahead into reused buffers.

A `Share` says which part of every global batch one process reads: some of its
rows and, when a partitioned dimension crosses processes, a depth range of each
(`engine.placement.process_share` derives it from the layout). A `HostBatch` is
one step's share on the host; its arrays are views of a buffer that goes back
to the pool when the loop calls `release` (once the step that read them is
done), so a long run allocates its batch memory once: on small hosts fresh
memory costs several times the copy into it (measured in `benchmarks/input/input_rate.py`).

`Prefetcher` fills the buffers of the next steps on a thread pool while the
loop trains on this one; each step's work is split into pieces (rows, and
depth ranges of a row) so that all cores decode even at one example per step.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator


@dataclasses.dataclass(frozen=True)
class Share:
    """The part of every global batch one process reads.

    Args:
        rows: the rows of the global batch its devices hold, in order.
        depth: [start, stop) of the depth axis its devices hold; None: the whole depth.

    Example:
        >>> Share((0, 1), (64, 128)).depth_of(256)
        (64, 128)
    """

    rows: tuple[int, ...]
    depth: tuple[int, int] | None = None

    def depth_of(self, size: int) -> tuple[int, int]:
        """[start, stop) of a depth axis of `size` voxels."""
        return self.depth or (0, size)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under `taskset`), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class HostBatch:
    """One step's input on the host.

    Attributes:
        inputs: what the training step takes as its input (an array, or a dict of arrays).
        labels: its labels (an array, or a dict of arrays).
        ids: each row's example id (case id, source id), for evaluation.
    """

    def __init__(self, inputs, labels, ids: list[str], on_release: Callable[[], None] | None = None):
        self.inputs, self.labels, self.ids = inputs, labels, ids
        self._on_release = on_release

    def release(self) -> None:
        """Gives the buffer back for a later step; its arrays must not be read after this (idempotent)."""
        if self._on_release is not None:
            on_release, self._on_release = self._on_release, None
            on_release()


class Prefetcher:
    """Steps' batches filled ahead, in order, on a thread pool, into buffers from a pool.

    Args:
        steps: for each step, what `fill` needs to know (e.g. the example index of each row).
        new_buffer: makes one step's buffer.
        pieces: `pieces(plan)` lists the independent pieces of filling one step (e.g. (row, depth range)).
        fill: `fill(buffer, plan, piece)` fills one piece (runs on the pool; must release the GIL to scale).
        finish: `finish(buffer, plan, release) -> HostBatch` once every piece is done (on the caller's thread).
        workers: threads (default: the usable cores).
        ahead: steps filled ahead of the one the loop takes.
        held: batches the loop may hold unreleased at once (steps in flight): buffers beyond `ahead` + `held` are
            not made, so a loop that forgets to release stalls the reading ahead rather than memory.
    """

    def __init__(self, steps: Iterator, new_buffer: Callable[[], object], pieces: Callable, fill: Callable,
                 finish: Callable, workers: int | None = None, ahead: int = 2, held: int = 3):
        self.workers = workers or usable_cores()
        self._steps, self._new_buffer, self._pieces, self._fill, self._finish = steps, new_buffer, pieces, fill, finish
        self._ahead, self._most_buffers, self._buffers = ahead, ahead + held, 0
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="fullres-input")
        self._free: list = []
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()  # (buffer, plan, futures)
        self._exhausted = False

    def _release(self, buffer) -> Callable[[], None]:
        def give_back():
            with self._lock:
                self._free.append(buffer)
        return give_back

    def _top_up(self) -> None:
        while not self._exhausted and len(self._pending) < self._ahead:
            with self._lock:
                buffer = self._free.pop() if self._free else None
            if buffer is None:
                if self._buffers >= self._most_buffers and self._pending:  # wait for the loop to give one back
                    return
                buffer = self._new_buffer()
                self._buffers += 1
            plan = next(self._steps, None)
            if plan is None:
                self._exhausted = True
                with self._lock:
                    self._free.append(buffer)
                return
            futures = [self._pool.submit(self._fill, buffer, plan, piece) for piece in self._pieces(plan)]
            self._pending.append((buffer, plan, futures))

    def __iter__(self):
        return self

    def __next__(self) -> HostBatch:
        self._top_up()
        if not self._pending:
            raise StopIteration
        buffer, plan, futures = self._pending.popleft()
        for future in futures:
            future.result()  # raises what the reader raised
        self._top_up()  # the next steps start while the loop works on this one
        return self._finish(buffer, plan, self._release(buffer))

    def close(self) -> None:
        for _, _, futures in self._pending:
            for future in futures:
                future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
