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

The decoded cache (MLPerf's approach: the data set decoded in host memory) holds
this process's share of every example once it has been read; `cache` "auto"
turns it on when that fits `CACHE_SHARE_OF_MEMORY` of the memory available,
and the log says which was chosen and why.

Patch mode (`patch`): each row is a crop of its example (`patches.CropSampler`:
random, a third centred on foreground, a function of the seed and the stream
position), and a process reads only the depths of the crop it holds; the cache
then holds whole examples, since the crops move.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterator

import numpy as np

from common import sizes
from preprocessing.records import ct_slabs, dataset_files, tfrecord_files, tfrecord_schema
from trainer import config as config_lib
from trainer.data import batches, patches

CACHE_SHARE_OF_MEMORY = 0.5  # "auto" caches when this process's share of the data set fits this part of MemAvailable


@functools.cache
def hide_accelerators_from_tensorflow() -> None:
    """Keeps TensorFlow on the CPU (once per process; later calls do nothing)."""
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")


def list_files(pattern: str) -> list[str]:
    """The TFRecord files `pattern` names (local paths or gs://): a data set folder's shards, or the files a
    pattern matches (`dataset_files.record_files`; `data_set.resolve` checks them before training).

    Raises:
        FileNotFoundError: when nothing matches, naming the pattern.
    """
    files = dataset_files.record_files(pattern)
    if not files:
        raise FileNotFoundError(
            f"no TFRecord files match {pattern!r}; check the path, or create the data with `fullres demo` or "
            "`fullres preprocess ct`."
        )
    return files


class CtRecords:
    """A data set's CT records by number, in their case ids' order (not the shards': Beam shards each preprocessing
    differently); a record's layout (where its slabs lie) is checked when first needed."""

    def __init__(self, pattern: str, workers: int | None = None):
        self.pattern = pattern
        paths = list_files(pattern)
        with concurrent.futures.ThreadPoolExecutor(min(len(paths), workers or batches.usable_cores())) as pool:
            self.files = list(pool.map(tfrecord_files.RecordFile, paths))
        where = [(file, number) for file in self.files for number in range(len(file))]
        try:
            cases = [ct_slabs.read_layout(file, number).case_id for file, number in where]
        except tfrecord_files.RecordFileDamaged:  # not CT records: the first read of one says so, where it did
            cases = [""] * len(where)  # (sorted is stable: the shards' order)
        self._where = [where[i] for i in sorted(range(len(where)), key=lambda i: cases[i])]
        self._layouts: list[ct_slabs.CtLayout | None] = [None] * len(self._where)
        self.compressed = any(file.compressed for file in self.files)

    def __len__(self) -> int:
        return len(self._where)

    def layout(self, index: int) -> ct_slabs.CtLayout:
        """Record `index`'s layout (read once); every record must have the first one's shape.

        Raises:
            ValueError: a record of another shape (the message names its file and case).
        """
        layout = self._layouts[index]
        if layout is None:
            file, number = self._where[index]
            layout = self._layouts[index] = ct_slabs.read_layout(file, number)
            first = self._layouts[0] or self.layout(0)
            if layout.image_shape != first.image_shape:
                raise ValueError(
                    f"{file.path}: case {layout.case_id} is {'x'.join(map(str, layout.shape))} voxels but the data set's "
                    f"first is {'x'.join(map(str, first.shape))}; preprocess with --shape D,H,W so that every volume "
                    "has one shape.")
        return layout

    @property
    def shape(self) -> tuple[int, int, int]:
        """(D, H, W) of every volume."""
        return self.layout(0).shape

    channels = property(lambda self: self.layout(0).channels, doc="Image channels: 1 (CT), 3 (video clips' RGB).")
    stored = property(lambda self: self.layout(0).stored, doc="The images' stored (and sent) type: CT int16, video uint8.")

    def read(self, index: int, start: int, stop: int, image: np.ndarray, label: np.ndarray) -> None:
        """Depths [start, stop) of record `index` into `image` (stop - start, H, W, C) as stored, `label` uint8."""
        file, number = self._where[index]
        ct_slabs.read_depths(file, number, self.layout(index), start, stop, image, label)

    def share_bytes(self, depth: int | None = None) -> int:
        """Bytes of `depth` depth voxels (default: all) of every record: what the cache of that share holds."""
        shape = self.shape
        return len(self) * self.layout(0).share_bytes(depth or shape[0])

    def close(self) -> None:
        for file in self.files:
            file.close()


def read_examples(pattern: str) -> Iterator[dict]:
    """Every record of `pattern`, whole and in order, as numpy: `{"case_id", "image" (D, H, W, C) float32,
    "label" (D, H, W) uint8}` (for looking at a data set; training reads through `CtBatches`).

    Raises:
        tfrecord_files.RecordFileDamaged: a damaged or cut-short file, or records of an earlier fullres.
    """
    records = CtRecords(pattern, workers=1)
    try:
        for index in range(len(records)):
            layout = records.layout(index)
            image, label = np.empty(layout.image_shape, layout.stored), np.empty(layout.shape, np.uint8)
            records.read(index, 0, layout.shape[0], image, label)
            yield {"case_id": layout.case_id, "image": tfrecord_schema.dequantize(image, layout.scale), "label": label}
    finally:
        records.close()


def count_examples(pattern: str) -> int:
    """The records matching `pattern` (indexes every file)."""
    records = CtRecords(pattern)
    count = len(records)
    records.close()
    return count


def memory_available() -> int | None:
    """Bytes the host can give without swapping (Linux's MemAvailable); None where it does not say."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def choose_cache(mode: str, needed: int, available: int | None) -> tuple[bool, str]:
    """(cache or not, why, in words) for `mode` ("auto", "on", "off") and a share of `needed` bytes.

    >>> print(*choose_cache("auto", 2 * 2**30, 16 * 2**30))
    True on: this process's share of the data set, 2.00 GiB, fits in 50% of the 16.00 GiB of memory available
    >>> print(choose_cache("auto", 12 * 2**30, 16 * 2**30)[1])
    off: this process's share of the data set, 12.00 GiB, is more than 50% of the 16.00 GiB of memory available; records are read every step (--input-cache on forces it)
    """
    if mode not in config_lib.INPUT_CACHE:
        raise ValueError(f"input cache {mode!r} is not known; use one of {', '.join(config_lib.INPUT_CACHE)}.")
    share = f"this process's share of the data set, {sizes.human_bytes(needed)},"
    if mode == "on":
        return True, f"on (--input-cache on): {share} held in memory" + sizes.cache_over_memory(needed, available)
    if mode == "off":
        return False, "off (--input-cache off): records are read every step"
    limit = f"{CACHE_SHARE_OF_MEMORY:.0%} of the {sizes.human_bytes(available)} of memory available" if available else ""
    if available is None:
        return False, "off: this host does not say how much memory is available (--input-cache on forces it)"
    if needed <= CACHE_SHARE_OF_MEMORY * available:
        return True, f"on: {share} fits in {limit}"
    return False, f"off: {share} is more than {limit}; records are read every step (--input-cache on forces it)"


class _Cache:
    """This process's share of each example, decoded, kept once read: image as stored, uint8 label per index. Each
    depth is read by one thread; a thread needing depths another is reading waits, and reads them if that read fails."""

    def __init__(self, depth: int, plane: tuple[int, int], channels: int = 1, stored: np.dtype = np.dtype(np.int16)):
        self._shape, self._channels, self._stored = (depth, *plane), channels, stored
        self._entries: dict[int, tuple[np.ndarray, ...]] = {}
        self._changed = threading.Condition()

    def fill(self, index: int, low: int, high: int, read: Callable[[int, int, np.ndarray, np.ndarray], None]):
        """(image, label) of `index` with depths [low, high) in, `read(low, high, image, label)` called for those
        missing that no other thread is reading."""
        entry = self._entries.get(index)
        if entry is None:
            with self._changed:
                entry = self._entries.setdefault(index, (
                    np.empty((*self._shape, self._channels), self._stored), np.empty(self._shape, np.uint8),
                    np.zeros(self._shape[0], bool), np.zeros(self._shape[0], bool)))  # image, label, filled, claimed
        image, label, filled, claimed = entry
        while not filled[low:high].all():
            with self._changed:
                mine = ~filled[low:high] & ~claimed[low:high]
                if not mine.any():
                    self._changed.wait()
                    continue
                claimed[low:high] |= mine
            depths = np.flatnonzero(mine) + low
            try:
                for run in np.split(depths, np.flatnonzero(np.diff(depths) > 1) + 1):  # contiguous depth ranges
                    read(int(run[0]), int(run[-1]) + 1, image[run[0]:run[-1] + 1], label[run[0]:run[-1] + 1])
            except BaseException:
                with self._changed:
                    claimed[low:high] &= ~mine
                    self._changed.notify_all()
                raise
            with self._changed:
                filled[low:high] |= mine
                self._changed.notify_all()
        return image, label


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

    def __init__(self, records: CtRecords, batch_size: int, share: batches.Share | None = None, *, seed: int = 0,
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
        use, self.cache_reason = choose_cache(cache, records.share_bytes(self._cached[1] - self._cached[0]),
                                              memory_available())
        self._cache = (_Cache(self._cached[1] - self._cached[0], (height, width), records.channels, records.stored)
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
