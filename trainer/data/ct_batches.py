"""CT records into batches: each process reads its share, in parallel, into reused buffers, from a cache where it fits.

The order is a pure function of the seed and the case ids: the example at stream position p (p = step × batch
size + row) is `permutation(seed, epoch)[p mod N]` of the records in case-id order, epoch = p div N. So a resumed
run starts at its step without reading what came before, a process reading some rows of each batch reads exactly
those rows of what one process would, and the decoded cache changes nothing but the speed.

What one process reads (`batches.Share`): the rows of every global batch its
devices hold and, when depth is split across processes, only the depth slabs
they hold (`ct_slabs.read_depths`: nothing else of a record is read or parsed).
Images stay as stored (CT int16, video clips uint8 RGB) and labels uint8 all the
way to the device, where the training step makes them float32 (`SegmentationTask.prepare`).

The decoded cache (`decoded_cache`) holds this process's share of every example once it has been read.

Patch mode (`patch`): each row is a crop of its example (`patches.CropSampler`:
random, a third centred on foreground, a function of the seed and the stream
position), and a process reads only the depths of the crop it holds; the cache
then holds whole examples, since the crops move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from trainer.data import batches, ct_input, decoded_cache, patches


def epoch_order(seed: int, epoch: int, count: int) -> np.ndarray:
    """The example indices of `epoch`, in order: a permutation drawn from (seed, epoch) alone."""
    return np.random.default_rng([seed, epoch]).permutation(count)


class _Order:
    """Stream position -> example index (`epoch_order`), remembering the epochs in use."""

    def __init__(self, seed: int, count: int, shuffle: bool):
        self._seed, self._count, self._shuffle = seed, count, shuffle
        self._epochs: dict[int, np.ndarray] = {}

    def __call__(self, position: int) -> int:
        epoch, offset = divmod(position, self._count)
        if not self._shuffle:
            return offset
        if epoch not in self._epochs:
            if len(self._epochs) > 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = epoch_order(self._seed, epoch, self._count)
        return int(self._epochs[epoch][offset])


class CtBatches:
    """The batches one process reads: its share of every global batch, in the run's order.

    Args:
        records: the data set.
        batch_size: the global batch size.
        share: this process's rows and depth range (`batches.Share`); None: all of every batch.
        seed: the order's seed (see the module docstring).
        start_step: the first step's number: position start_step × batch_size on.
        steps: how many steps (None: for ever, repeating the data set).
        shuffle: the seeded order; False: the records in order, each once (with `steps` None, the last
            batch may be short).
        cache: "auto", "on" or "off".
        workers: reading threads (default: the usable cores).
        log: where the cache decision is said.
        patch: (d, h, w): each row is a crop of this shape (`patches`); `share`'s depth range is of the patch.
            None: whole volumes.
    """

    def __init__(self, records: ct_input.CtRecords, batch_size: int, share: batches.Share | None = None, *, seed: int = 0,
                 start_step: int = 0, steps: int | None = None, shuffle: bool = True, cache: str = "off",
                 workers: int | None = None, log: Callable[[str], None] | None = None,
                 patch: tuple[int, ...] | None = None):
        self.records, self.batch_size = records, batch_size
        self.share = share or batches.Share(tuple(range(batch_size)))
        depth, height, width = records.shape
        self.patch = tuple(patch) if patch is not None else None
        crop = self.patch or records.shape
        if self.patch is not None:
            patches.check_fits(self.patch, records.shape, records.pattern)
            if not shuffle:
                raise ValueError("patches are drawn for training (shuffle=True); evaluation reads whole volumes.")
        self.start, self.stop = self.share.depth_of(crop[0])
        # The cache holds the depths this process reads: its share, or (patches move) the whole record.
        self._cached = (self.start, self.stop) if self.patch is None else (0, depth)
        use, self.cache_reason = decoded_cache.choose_cache(cache, records.share_bytes(self._cached[1] - self._cached[0]),
                                              decoded_cache.memory_available())
        self._cache = (decoded_cache.DecodedCache(self._cached[1] - self._cached[0], (height, width), records.channels, records.stored)
                       if use else None)
        if log is not None:
            log(f"input cache {self.cache_reason}")
        order = _Order(seed, len(records), shuffle)
        rows = self.share.rows
        self._plane = tuple(crop[1:])
        if shuffle:
            sampler = (patches.CropSampler(self.patch, records.shape, seed, self._whole_label)
                       if self.patch is not None else None)
            plans = _step_plans(order, batch_size, rows, start_step, steps, sampler)
        else:
            plans = _in_order_plans(len(records), batch_size, rows)
        self.workers = workers or batches.usable_cores()
        # Pieces per step: enough that every worker decodes, never thinner than one slab.
        slabs = max(1, (self.stop - self.start) // records.layout(0).slab_depth)
        self._cuts = max(1, min(slabs, -(-self.workers // len(rows))))
        if records.compressed:  # every piece of a GZIP record inflates it from its start: read each one whole
            self._cuts = 1
        self._prefetcher = batches.Prefetcher(plans, self._new_buffer, self._pieces, self._fill, self._finish,
                                              workers=self.workers)

    @property
    def cached(self) -> bool:
        return self._cache is not None

    def _new_buffer(self):
        shape = (len(self.share.rows), self.stop - self.start, *self._plane)
        return (np.empty((*shape, self.records.channels), self.records.stored), np.empty(shape, np.uint8),
                np.empty(len(self.share.rows), np.float32))

    def _whole_label(self, index: int) -> np.ndarray:
        """Example `index`'s whole label map (for the foreground crops' centres; read once per example)."""
        shape = self.records.shape
        image, label = np.empty((*shape, self.records.channels), self.records.stored), np.empty(shape, np.uint8)
        self.records.read(index, 0, shape[0], image, label)
        return label

    def _pieces(self, plan: list[tuple[int, tuple[int, ...]]]):
        depth, slab = self.stop - self.start, self.records.layout(0).slab_depth
        pieces = []
        for slot, (_, origin) in enumerate(plan):
            first = origin[0] + self.start  # the record depth this row's share starts at
            cuts = (round(depth * k / self._cuts) for k in range(1, self._cuts))
            edges = {min(first + depth, -(-(first + cut) // slab) * slab) - first for cut in cuts}  # on slab edges
            bounds = sorted({0, depth} | {edge for edge in edges if 0 < edge < depth})
            pieces += [(slot, low, high) for low, high in zip(bounds, bounds[1:])]
        return pieces

    def _fill(self, buffer, plan: list[tuple[int, tuple[int, ...]]], piece) -> None:
        images, labels, scales = buffer
        slot, low, high = piece
        index, origin = plan[slot]
        image, label = images[slot, low:high], labels[slot, low:high]
        first, last = origin[0] + self.start + low, origin[0] + self.start + high  # record depths
        plane = tuple(slice(o, o + size) for o, size in zip(origin[1:], self._plane))  # the crop's (y, x)
        if low == 0:
            scales[slot] = self.records.layout(index).scale
        if self._cache is None:
            if self.patch is None:  # straight into the batch
                self.records.read(index, first, last, image, label)
                return
            whole_label = np.empty((last - first, *self.records.shape[1:]), np.uint8)
            whole_image = np.empty((*whole_label.shape, self.records.channels), self.records.stored)
            self.records.read(index, first, last, whole_image, whole_label)
            image[...], label[...] = whole_image[(slice(None), *plane)], whole_label[(slice(None), *plane)]
            return
        low_cached, high_cached = first - self._cached[0], last - self._cached[0]
        offset = self._cached[0]
        cached_image, cached_label = self._cache.fill(
            index, low_cached, high_cached,
            lambda low, high, into_image, into_label: self.records.read(index, low + offset, high + offset,
                                                                        into_image, into_label))
        image[...] = cached_image[(slice(low_cached, high_cached), *plane)]
        label[...] = cached_label[(slice(low_cached, high_cached), *plane)]

    def _finish(self, buffer, plan: list[tuple[int, tuple[int, ...]]], release) -> batches.HostBatch:
        images, labels, scales = buffer
        count = len(plan)
        ids = [self.records.layout(index).case_id for index, _ in plan]
        return batches.HostBatch({"image": images[:count], "scale": scales[:count]}, labels[:count], ids,
                                 release)  # image (R, d, H, W, C) int16 (video: uint8), scale (R,), label (R, d, H, W) uint8

    def __iter__(self) -> Iterator[batches.HostBatch]:
        return self._prefetcher

    def __next__(self) -> batches.HostBatch:
        return next(self._prefetcher)

    def close(self) -> None:
        self._prefetcher.close()


def _step_plans(order: _Order, batch_size: int, rows, start_step: int, steps: int | None,
                sampler: patches.CropSampler | None = None):
    """Each step's (example index, crop origin) per row: the origin is (0, 0, 0) without patches."""
    step = start_step
    while steps is None or step < start_step + steps:
        positions = [step * batch_size + row for row in rows]
        indices = [order(position) for position in positions]
        yield [(index, sampler.origin(position, index) if sampler else (0, 0, 0))
               for position, index in zip(positions, indices)]
        step += 1


def _in_order_plans(count: int, batch_size: int, rows):
    """Each record once, in order, `batch_size` at a time (the last batch may be short); `rows` of each."""
    for first in range(0, count, batch_size):
        plan = [(first + row, (0, 0, 0)) for row in rows if first + row < count]
        if plan:
            yield plan
