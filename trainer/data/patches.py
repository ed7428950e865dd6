"""Where each training patch lies: random crops, a third of them centred on a foreground voxel (nnU-Net's oversampling).

nnU-Net trains on random crops of its patch size and forces a third of them
(`oversample_foreground_percent = 0.33`) to be centred on a voxel of a
randomly chosen foreground class, so that small structures are seen often
enough. Here the crop of stream position p (p = step × batch size + row, as
`ct_input` numbers the examples) is a pure function of (seed, p) and the
example: every process of a partitioned run computes the same crop for a row,
and reads only the depth slabs of it its devices hold; a resumed run draws the
same crops again. Position p is a foreground crop when p mod 3 = 2, so exactly
a third of every three consecutive crops are (nnU-Net decides by the row's
place in its batch, which at batch size 1 never oversamples).

Crops are made on the host, in the reader: a patch reads only the slabs it
needs (a 64-deep patch of a 256-deep volume reads a quarter of its bytes),
and the device step receives a batch of the patch's shape, split like a whole
volume of that shape (`partitioning`), so the step's partitioned parity is the
whole-volume step's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

FOREGROUND_EVERY = 3  # one crop in three is centred on foreground (nnU-Net: 0.33)
MOST_LOCATIONS = 10_000  # foreground voxels kept per class and example to centre crops on (nnU-Net samples 10,000)


def is_foreground_crop(position: int) -> bool:
    """Whether the crop of stream position `position` is centred on a foreground voxel.

    >>> [is_foreground_crop(p) for p in range(6)]
    [False, False, True, False, False, True]
    """
    return position % FOREGROUND_EVERY == FOREGROUND_EVERY - 1


def check_fits(patch: Sequence[int], shape: Sequence[int], source: str) -> None:
    """Refuses a patch larger than the volumes along any axis, in one sentence.

    Raises:
        ValueError: naming the data, the sizes and the fix.
    """
    if any(p > s for p, s in zip(patch, shape)):
        raise ValueError(f"--patch-size {','.join(map(str, patch))} is larger than the {'x'.join(map(str, shape))} "
                         f"volumes of {source}; give a patch at most the volume's size along every axis, or leave "
                         "--patch-size out to train on whole volumes.")


def foreground_locations(label: np.ndarray) -> dict[int, np.ndarray]:
    """Foreground class -> (n, 3) voxel coordinates of it, at most `MOST_LOCATIONS` of each, evenly thinned.

    >>> label = np.zeros((4, 4, 4), np.uint8); label[1, 2, 3] = 2
    >>> foreground_locations(label)
    {2: array([[1, 2, 3]])}
    """
    found = {}
    for value in np.unique(label):
        if value == 0:
            continue
        where = np.argwhere(label == value)  # (n, 3) in C order
        step = max(1, -(-len(where) // MOST_LOCATIONS))
        found[int(value)] = where[::step]
    return found


class CropSampler:
    """The crop origin of each (position, example): random, or centred on foreground one time in three.

    Args:
        patch: (d, h, w) the crop's shape.
        shape: (D, H, W) every volume's shape.
        seed: the run's seed.
        read_label: `read_label(index)` -> (D, H, W) uint8, the whole label map of example `index` (read once per
            example, the first time a foreground crop of it is drawn).

    Example:
        >>> label = np.zeros((8, 8, 8), np.uint8); label[6, 1, 7] = 1
        >>> sampler = CropSampler((4, 4, 4), (8, 8, 8), seed=0, read_label=lambda index: label)
        >>> sampler.origin(2, 0)  # a foreground crop: centred on (6, 1, 7), kept inside the volume
        (4, 0, 4)
    """

    def __init__(self, patch: Sequence[int], shape: Sequence[int], seed: int,
                 read_label: Callable[[int], np.ndarray]):
        self.patch, self.shape, self.seed = tuple(patch), tuple(shape), seed
        self._read_label = read_label
        self._locations: dict[int, dict[int, np.ndarray]] = {}
        self._lock = threading.Lock()

    def locations(self, index: int) -> dict[int, np.ndarray]:
        """Example `index`'s foreground locations (`foreground_locations`), found once."""
        with self._lock:
            if index not in self._locations:
                self._locations[index] = foreground_locations(self._read_label(index))
            return self._locations[index]

    def origin(self, position: int, index: int) -> tuple[int, ...]:
        """The (z, y, x) corner of the crop of stream position `position`, which reads example `index`."""
        rng = np.random.default_rng([self.seed, position, 0x9A7C])
        highest = [s - p for s, p in zip(self.shape, self.patch)]
        if is_foreground_crop(position):
            locations = self.locations(index)
            if locations:  # a class at random, then one of its voxels, as nnU-Net
                classes = sorted(locations)
                chosen = locations[classes[rng.integers(len(classes))]]
                centre = chosen[rng.integers(len(chosen))]
                return tuple(int(min(max(c - p // 2, 0), h)) for c, p, h in zip(centre, self.patch, highest))
        return tuple(int(rng.integers(h + 1)) for h in highest)
