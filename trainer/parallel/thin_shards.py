"""Splits where XLA computes a wrong gradient, silently: a window that reaches across a whole shard, two axes split.

Measured (jax 0.10.2, XLA's SPMD partitioner, CPU; pure JAX, `benchmarks/partitioning/gspmd_min_voxels.py`, docs/zoo.md):
when two or more spatial axes are split and a convolution's (or pooling
window's) input holds, along a split axis, no more voxels per device than its
window reaches past them (its padding: 1 for a 3-wide 'same' window, 2 for a
5-wide one), the gradient of the following convolutions' kernels comes out
wrong (relative difference 1 to 3); the forward pass and the loss are right,
and nothing fails. One split axis, at any count (8-way, 1 voxel a device), was
right in every case tried, as were two or more split axes with more voxels a
device than the window reaches. The rule below is that measured boundary, read
from the network itself (its traced convolutions at the training shape, as
`halo.windows` finds them): it may refuse a few such layouts that XLA happens to
get right, never one it gets wrong among those mapped.

`tests/trainer/parallel/test_thin_shards.py` proves the wrong gradient in the
JAX fullres runs on; when a JAX release fixes it, that test fails, and this
refusal can go.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainer.parallel import halo, partitioning


WRONG_GRADIENT = "silently computes wrong gradients"  # in every refusal's sentence: how a plan tells them apart


def refused_for_gradient(sentence: str) -> bool:
    """Whether `sentence` (a layout's reason for being pruned) is this module's refusal, not a size that cannot divide."""
    return WRONG_GRADIENT in sentence


def reach(window: halo.Window, axis: int) -> int:
    """Voxels the window reaches past a shard's edge along `axis`: its padding on the wider side."""
    high = window.high[axis] if window.high else max(0, window.window[axis] - window.strides[axis] - window.low[axis])
    return max(window.low[axis], high)


def thin(windows: Sequence[halo.Window], dims: Sequence[int]) -> list[tuple[halo.Window, int, float]]:
    """(window, spatial axis, voxels per device) for each window whose reach spans its shard along a split axis,
    where two or more spatial axes are split; [] where the layout is safe."""
    parts = tuple(dims[1:-1])
    if sum(p > 1 for p in parts) < 2:
        return []
    found = []
    for window in windows:
        if len(window.in_spatial) != len(parts):
            continue
        for axis, count in enumerate(parts):
            per_device = window.in_spatial[axis] / count
            if count > 1 and reach(window, axis) >= 1 and per_device <= reach(window, axis):
                found.append((window, axis, per_device))
    return found


def refusal(windows: Sequence[halo.Window], dims: Sequence[int], image_shape: Sequence[int]) -> str | None:
    """The sentence that refuses `dims` for the network of `windows` (traced on `image_shape`, (B, *spatial, C)),
    or None where the layout is safe."""
    found = thin(windows, dims)
    if not found:
        return None
    window, axis, per_device = found[0]
    names = partitioning.DIMENSION_NAMES[len(dims)]
    name = names[axis + 1]
    # The input size along the axis that gives every window on it more voxels a device than it reaches.
    factor = max(2 ** math.ceil(math.log2((reach(w, a) + 1) / p)) for w, a, p in found if a == axis)
    layer = f"layer {window.layer!r}" if window.layer else "a convolution or pooling window outside every layer"
    shown = "×".join(map(str, window.window))
    voxels = f"{per_device:g} voxel{'' if per_device == 1 else 's'}"
    return (f"input_partition_dims {list(dims)} leaves {layer} (a {shown} window over "
            f"{'×'.join(map(str, window.in_spatial))} voxels) {voxels} per device along {name}, no more than the "
            f"{reach(window, axis)} its window reaches past them, where XLA (jax 0.10.2) {WRONG_GRADIENT} once two or more axes are "
            f"split; give {name} {image_shape[axis + 1] * factor} or more (a larger --patch-size, or larger volumes), "
            f"split {name} in fewer parts, or split one axis only.")


def check(windows: Sequence[halo.Window], dims: Sequence[int], image_shape: Sequence[int]) -> None:
    """Refuses `dims` where XLA would train the network of `windows` with a wrong gradient (`refusal`).

    Raises:
        partitioning.PartitionError: one sentence naming the layer, the axis, its voxels per device and the fix.
    """
    sentence = refusal(windows, dims, image_shape)
    if sentence is not None:
        raise partitioning.PartitionError(sentence)


def splits_two_axes(dims: Sequence[int]) -> bool:
    """Whether `dims` splits two or more spatial axes (the only layouts `check` can refuse: no trace needed else)."""
    return sum(p > 1 for p in tuple(dims)[1:-1]) >= 2


def model_windows(model, state, image_shape: Sequence[int], dims: Sequence[int]) -> list[halo.Window]:
    """`halo.windows` of `model` traced as a step split `dims` traces it (`split_ops.splitting`: a transposed
    convolution is then the stride-1 convolution XLA partitions, its phases padded to a multiple of the split)."""
    from trainer.parallel import split_ops

    with split_ops.splitting(dims):
        return halo.windows(model, state, tuple(image_shape))


def check_model(model, state, dims: Sequence[int], image_shape: Sequence[int]) -> None:
    """`check` for a built `model` (its variables `state`) on `image_shape`, traced only where `dims` splits two
    or more axes.

    Raises:
        partitioning.PartitionError: as `check`.
    """
    if splits_two_axes(dims):
        check(model_windows(model, state, image_shape, dims), dims, image_shape)
