"""The decoded cache (MLPerf's approach: the data set decoded in host memory): whether it fits, and the cache.

It holds this process's share of every example once it has been read; `--input-cache` "auto" turns it on when that
fits `CACHE_SHARE_OF_MEMORY` of the memory available, and the log says which was chosen and why. It changes nothing
but the speed: `ct_batches` reads the same bytes from it as from the records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from common import sizes
from trainer import config as config_lib


CACHE_SHARE_OF_MEMORY = 0.5  # "auto" caches when this process's share of the data set fits this part of MemAvailable


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


class DecodedCache:
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
                    # Asked again under the lock: a thread that filled the last of them after the check above has
                    # notified already, and waiting now would wait for a notice that never comes.
                    if not filled[low:high].all():
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
