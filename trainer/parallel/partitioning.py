"""Spatial partitioning's meaning: `input_partition_dims`, checked against a model and a shape before anything compiles.

The contract is the one Cloud TPU users know from `input_partition_dims`
(docs/design.md, "Partitioning semantics"):

* one integer per dimension of the feature tensor, e.g. `(1, 4, 1, 1, 1)` splits
  the depth of an NDHWC volume over 4 cores; their product is the number of
  cores per replica;
* `num_devices / cores_per_replica` data-parallel replicas share the global batch;
* labels are either kept whole within a replica (`label_partition_dims=None`) or
  split like the features;
* weights are replicated; XLA's SPMD partitioner inserts the halo exchange.

The mesh has one axis `replica` and one axis per partitioned spatial dimension
(`depth`, `height`, `width`); building it on the devices present, and the Keras
distribution over it, is `device_mesh`, and whether the devices and the global
batch hold a split is `replicas`. Everything here is checked before anything is
compiled, and a bad configuration is refused with one sentence that names the
dimension and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


from common import parsing

REPLICA_AXIS = "replica"
# `input_partition_dims = "auto"`: `layout_choice.choose_layout` picks the dims once the devices are known.
AUTO = "auto"
# Names of the dimensions of a channels-last feature tensor, by rank.
DIMENSION_NAMES = {
    4: ("batch", "height", "width", "channels"),
    5: ("batch", "depth", "height", "width", "channels"),
}
# A video clip's first axis is time, its size the clip length that `fullres preprocess video --clip-length` chose.
CLIP_LENGTH = "clip length"
VIDEO_DIMENSION_NAMES = ("batch", CLIP_LENGTH, "height", "width", "channels")


class PartitionError(ValueError):
    """A partitioning configuration that cannot work, with the fix in its message."""


@dataclasses.dataclass(frozen=True)
class PartitionConfig:
    """How each example is split across the cores of one replica.

    Args:
        input_partition_dims: one integer per feature dimension (channels last),
            e.g. `(1, 4, 1, 1, 1)` for NDHWC split 4-way along depth.
        label_partition_dims: `None` keeps labels whole within a replica (boxes,
            class ids); a tuple splits them like the features (segmentation masks,
            one entry per label dimension).

    `input_partition_dims` may also be `"auto"`: training then asks
    `layout_choice.choose_layout` for the layout of the devices present (labels
    given as dims are then split like the chosen features).

    Example:
        >>> config = PartitionConfig((1, 2, 2, 1, 1))
        >>> config.num_cores_per_replica
        4
        >>> config.partitioned_axes
        (('depth', 2), ('height', 2))
    """

    input_partition_dims: tuple[int, ...] | str = (1, 1, 1, 1, 1)
    label_partition_dims: tuple[int, ...] | None = None

    def __post_init__(self):
        if isinstance(self.input_partition_dims, str):
            if self.input_partition_dims.strip().lower() != AUTO:
                raise PartitionError(f"input_partition_dims {self.input_partition_dims!r} is neither dims nor "
                                     f"{AUTO!r}; write e.g. 1,4,1,1,1, or auto to let fullres choose.")
            object.__setattr__(self, "input_partition_dims", AUTO)
        else:
            object.__setattr__(self, "input_partition_dims", tuple(int(d) for d in self.input_partition_dims))
        if self.label_partition_dims is not None:
            object.__setattr__(self, "label_partition_dims", tuple(int(d) for d in self.label_partition_dims))

    @property
    def is_auto(self) -> bool:
        """True when the layout is left to `layout_choice.choose_layout`."""
        return self.input_partition_dims == AUTO

    @property
    def rank(self) -> int | None:
        """Entries of `input_partition_dims`; None while it is "auto"."""
        return None if self.is_auto else len(self.input_partition_dims)

    @property
    def num_cores_per_replica(self) -> int:
        return math.prod(self.input_partition_dims)

    @property
    def partitioned_axes(self) -> tuple[tuple[str, int], ...]:
        """(dimension name, parts) for every spatial dimension split more than once."""
        names = DIMENSION_NAMES.get(self.rank)
        if names is None:
            return ()
        return tuple(
            (names[i], parts) for i, parts in enumerate(self.input_partition_dims) if parts > 1 and 0 < i < self.rank - 1
        )


def parse_dims(text: str | None) -> tuple[int, ...] | None:
    """Parses `"1,4,1,1"` or `"[1, 4, 1, 1]"` (`parsing.parse_list`); `None`, `""` and `"none"` give None.

    Raises:
        PartitionError: a part is not an integer.
    """
    try:
        return parsing.parse_list(text, int, "partition dims")
    except ValueError:
        raise PartitionError(
            f"partition dims {text!r} are not a comma-separated list of integers; write e.g. 1,4,1,1,1."
        ) from None


def _nearest_valid_sizes(size: int, multiple: int) -> str:
    below = (size // multiple) * multiple
    above = below + multiple
    if below == 0:
        return f"{above} (a multiple of {multiple})"
    return f"{below} or {above} (multiples of {multiple})"


def _use(name: str, sizes: str, smallest: int) -> str:
    """What to make dimension `name` instead (`sizes`, the smallest of them `smallest`), e.g. "use depth 8 or more";
    a clip's length in the words of the conversion that sets it.

    >>> _use(CLIP_LENGTH, "8 or more", 8)
    'use clips of 8 or more frames (fullres preprocess video --clip-length 8)'
    """
    if name == CLIP_LENGTH:
        return f"use clips of {sizes} frames (fullres preprocess video --clip-length {smallest})"
    return f"use {name} {sizes}"


def check_dims(config: PartitionConfig) -> None:
    """The part of `validate` that needs no shapes: one entry per NHWC or NDHWC dimension, each at least 1, the batch
    and channels whole, and labels (if split) split like the features.

    Raises:
        PartitionError: with a one-sentence message naming the problem and the fix.
    """
    if config.is_auto:
        raise PartitionError("input_partition_dims is 'auto', which training resolves once the devices are known "
                             "(layout_choice.choose_layout); pass the chosen dims here.")
    dims = config.input_partition_dims
    rank = len(dims)
    names = DIMENSION_NAMES.get(rank)
    if names is None:
        raise PartitionError(
            f"input_partition_dims {list(dims)} has {rank} entries; fullres partitions 4-D (batch, height, width, "
            "channels) or 5-D (batch, depth, height, width, channels) inputs, e.g. [1, 4, 1, 1] or [1, 4, 1, 1, 1].")
    if any(d < 1 for d in dims):
        raise PartitionError(f"input_partition_dims {list(dims)} has an entry below 1; every entry must be >= 1.")
    if dims[0] != 1:
        raise PartitionError(
            f"input_partition_dims[0] = {dims[0]} partitions the batch dimension; the batch is split over replicas "
            "automatically, so set it to 1."
        )
    if dims[-1] != 1:
        raise PartitionError(
            f"input_partition_dims[{rank - 1}] = {dims[-1]} partitions the channels; only spatial dimensions can be "
            "partitioned, so set it to 1."
        )
    if config.label_partition_dims is not None:
        labels = config.label_partition_dims
        spatial = dims[1:-1]
        if tuple(labels[1 : 1 + len(spatial)]) != spatial or labels[0] != 1 or len(labels) not in (rank - 1, rank):
            expected = [1, *spatial] if len(labels) == rank - 1 else list(dims)
            raise PartitionError(
                f"label_partition_dims {list(labels)} must split the labels like the features "
                f"{list(dims)}; use {expected}, or None to keep labels whole within a replica."
            )


def validate(
    config: PartitionConfig,
    feature_shape: Sequence[int],
    *,
    downsampling_levels: int | Sequence[int] = 0,
    dimension_names: Sequence[str] | None = None,
) -> None:
    """Refuses a split that cannot divide a shape at every resolution level of a network, before anything compiles.

    Whether the devices present and the global batch hold it is `replicas.validate`.

    Args:
        config: the partitioning to check.
        feature_shape: shape of one batch of features, batch first and channels
            last, e.g. `(B, D, H, W, C)`; the batch entry is not used.
        downsampling_levels: how many times the model halves each spatial
            dimension (a UNet with 4 resolution levels halves 3 times): one
            number for every spatial dimension, or one per dimension (a user's
            network, measured: `user_model.downsampling_levels`). Every level's
            size must divide by that dimension's partition count.
        dimension_names: what the messages call each dimension of the features (default `DIMENSION_NAMES`;
            `VIDEO_DIMENSION_NAMES` for clips, whose first axis is the clip length).

    Raises:
        PartitionError: with a one-sentence message naming the problem and the fix.
    """
    if config.is_auto:
        check_dims(config)  # refuses "auto", which is no layout yet
    dims = config.input_partition_dims
    rank = len(feature_shape)
    names = DIMENSION_NAMES.get(rank)
    if names is not None and dimension_names is not None and len(dimension_names) == rank:
        names = tuple(dimension_names)
    if names is None:
        raise PartitionError(
            f"features of shape {tuple(feature_shape)} are {rank}-D; fullres partitions 4-D (batch, height, width, "
            "channels) or 5-D (batch, depth, height, width, channels) inputs."
        )
    if len(dims) != rank:
        example = [1] * rank
        example[1] = 4
        raise PartitionError(
            f"input_partition_dims {list(dims)} has {len(dims)} entries but the features are {rank}-D "
            f"({', '.join(names)}); give one entry per dimension, e.g. {example}."
        )
    check_dims(config)
    levels_per_axis = per_axis(downsampling_levels, rank - 2)
    for axis in range(1, rank - 1):
        size, parts, levels = feature_shape[axis], dims[axis], levels_per_axis[axis - 1]
        multiple = parts * 2**levels
        if size % multiple == 0:
            if parts == 2 and size // 2**levels == 2:
                # Measured (XLA in jax 0.10.2, CPU): a 3-wide convolution over a 2-voxel axis cut in 2 gathers the
                # whole activation onto every device, and with a second split axis the gradients of that level's
                # weights come out 4-8x too large (the forward pass and the loss are right).
                level = f"resolution level {levels + 1}" if levels else "the input"
                clip = names[axis] == CLIP_LENGTH
                raise PartitionError(
                    f"{names[axis]} {size} (input_partition_dims[{axis}] = 2) is 2 {'frames' if clip else 'voxels'} "
                    f"at {level}, 1 on each of its 2 devices, where XLA gathers whole activations and can compute "
                    f"wrong gradients; {_use(names[axis], f'{2 * size} or more', 2 * size)}, or do not split "
                    f"{'the ' if clip else ''}{names[axis]}."
                )
            continue
        # Find the first resolution level at which the dimension stops working.
        level_size = size
        for level in range(levels + 1):
            if level_size % parts != 0:
                reason = f"is {level_size}, which does not divide by {parts}"
                break
            if level < levels and level_size % 2 != 0:
                reason = f"is {level_size}, which cannot be halved"
                break
            level_size //= 2
        where = "at the input" if level == 0 else f"at resolution level {level + 1} (after {level} downsampling{'s' if level > 1 else ''})"
        raise PartitionError(
            f"{names[axis]} {size} (input_partition_dims[{axis}] = {parts}) does not fit a model with "
            f"{levels} downsampling{'s' if levels != 1 else ''}: {where} it {reason}; "
            f"{_use(names[axis], _nearest_valid_sizes(size, multiple), max(size // multiple, 1) * multiple)}."
        )


def per_axis(downsampling_levels: int | Sequence[int], spatial_dims: int) -> tuple[int, ...]:
    """`downsampling_levels` as one number per spatial dimension (a single number holds for every one).

    >>> per_axis(3, 3), per_axis((1, 2, 2), 3)
    ((3, 3, 3), (1, 2, 2))
    """
    levels = (downsampling_levels,) * spatial_dims if isinstance(downsampling_levels, int) else tuple(downsampling_levels)
    if len(levels) != spatial_dims:
        raise PartitionError(f"downsampling levels {list(levels)} name {len(levels)} axes; the inputs have {spatial_dims}.")
    return levels
