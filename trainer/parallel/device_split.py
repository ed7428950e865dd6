"""Which split a trained model runs under on the devices it has: it is not tied to the device count it trained on.

`fullres predict` and evaluation (`trainer.evaluate`, the pipelines' evaluate step) both choose here: the
training split where the devices present hold it; otherwise the same axes cut into fewer parts until they fit
(a 16-way `1,4,4,1,1` model predicts `1,2,2,1,1` on 4 devices and unsplit on 1). Predict pads volumes as the
training split pads them under every split, `--input-partition-dims` too (`inference.VolumePredictor(pad_as=...)`:
the padding is part of what the model sees, instance normalization averages over it); a split runs on that shape
wherever each axis divides by its parts, its lower levels split unevenly by XLA, exactly. Only an asked split that
does not divide it pads further, and says its masks can differ (no split can run a shape its input does not
divide: the input's placement needs equal blocks). Evaluation's records are not padded, and a smaller cut divides
every size the training split divides. `trained_run.load_split` loads a run under this choice for all three. A split changes no class id (the partitioned forward pass is exact up to float rounding:
`tests/trainer/parallel/test_parity.py`), so the masks, and an evaluation's scores, are those of the training
split; only how much of a volume each device holds changes, and a scan too large for the split chosen is a dead
letter that names the cores it needs (`engine.inference.VolumeTooLarge`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _smaller(parts: int) -> int:
    """The largest proper divisor of `parts` (1 for a prime): the next smaller cut of one axis."""
    return next(parts // factor for factor in range(2, parts + 1) if parts % factor == 0)


def choose(trained: Sequence[int], asked: Sequence[int] | None, device_count: int) -> tuple[tuple[int, ...], str]:
    """(the input_partition_dims to run under, why, in words).

    Args:
        trained: the run's training split.
        asked: `--input-partition-dims`, or None to choose.
        device_count: the devices present.

    >>> choose((1, 4, 4, 1, 1), None, 4)[0], choose((1, 2, 1, 1, 1), None, 1)[0]
    ((1, 2, 2, 1, 1), (1, 1, 1, 1, 1))
    >>> choose((1, 2, 1, 1, 1), None, 8)
    ((1, 2, 1, 1, 1), 'the training split')
    """
    if asked is not None:
        return tuple(asked), "as --input-partition-dims asks"
    dims = [int(d) for d in trained]
    cores = math.prod(dims)
    if cores <= device_count:
        return tuple(dims), "the training split"
    while math.prod(dims) > device_count:
        axis = max(range(len(dims)), key=lambda index: dims[index])  # the most divided axis (the first of equals)
        dims[axis] = _smaller(dims[axis])
    described = ",".join(map(str, trained))
    return tuple(dims), (f"the training split {described} needs {cores} devices and {device_count} "
                         f"{'is' if device_count == 1 else 'are'} present, so the same axes in fewer parts")


def record(dims: Sequence[int], trained: Sequence[int], device_count: int, why: str) -> dict:
    """The choice as predict's `summary.json` and evaluation's scores keep it (`"split"`).

    >>> record((1, 1, 1, 1, 1), (1, 2, 1, 1, 1), 1, "fewer parts")["trained_with"]
    [1, 2, 1, 1, 1]
    """
    return {"input_partition_dims": [int(d) for d in dims], "trained_with": [int(d) for d in trained],
            "devices_present": device_count, "why": why}
