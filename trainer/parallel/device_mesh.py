"""Placing a split on devices: the (replica, *split axes) mesh, and the Keras distribution that lays every batch out
on it.

What a split means (`PartitionConfig`, its checks against a model and a shape) is `partitioning`, whether the
devices present hold it `replicas`; this module puts it on real devices. `SpatialParallel` is the public face:
Keras's own idiom, set before the model is built.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from trainer.parallel import partitioning, replicas, split_ops


def require_devices(cores: int, present: int, what: str, alternative: str = "") -> None:
    """The one refusal of a split that needs more devices than are present.

    Args:
        cores: devices the split needs (one replica's cores, or a partition count).
        present: devices present.
        what: the subject of the sentence, e.g. "input_partition_dims [1, 4, 1, 1, 1]".
        alternative: a further way out, e.g. "pass --input-partition-dims with fewer parts".

    Example:
        >>> require_devices(4, 2, "input_partition_dims [1, 4, 1, 1, 1]")
        Traceback (most recent call last):
        ...
        trainer.parallel.partitioning.PartitionError: input_partition_dims [1, 4, 1, 1, 1] needs 4 devices but 2 are present; run where 4 are, or on a CPU with --virtual-devices 4.

    Raises:
        partitioning.PartitionError: `cores` > `present`.
    """
    if cores > present:
        alternative = f", {alternative}" if alternative else ""
        raise partitioning.PartitionError(f"{what} needs {cores} devices but {present} are present; run where {cores} are"
                             f"{alternative}, or on a CPU with --virtual-devices {cores}.")


def build_mesh(config: partitioning.PartitionConfig, devices: Sequence | None = None) -> keras.distribution.DeviceMesh:
    """Builds the (replica, *partitioned spatial axes) device mesh.

    Args:
        config: the partitioning.
        devices: devices to use; all devices (`keras.distribution.list_devices()`) by default.

    Returns:
        A `keras.distribution.DeviceMesh`; e.g. 8 devices with `(1, 2, 2, 1, 1)`
        give shape `(2, 2, 2)` and axes `("replica", "depth", "height")`.
    """
    if devices is None:
        devices = keras.distribution.list_devices()
    replicas.validate_devices(config, len(devices))
    axes = config.partitioned_axes
    shape = (len(devices) // config.num_cores_per_replica, *(parts for _, parts in axes))
    names = (partitioning.REPLICA_AXIS, *(name for name, _ in axes))
    return keras.distribution.DeviceMesh(shape=shape, axis_names=names, devices=list(devices))


class SpatialParallel(keras.distribution.ModelParallel):
    """A Keras distribution that replicates the weights and splits every input in space, as `input_partition_dims` says.

    Keras's own idiom: set it before the model is built, and `model.fit` (and
    `evaluate`, `predict`) split each batch over the replicas and each example
    over its replica's cores; XLA splits every layer and exchanges the halos.
    `fullres train` uses the same distribution.

    Args:
        input_partition_dims: one integer per dimension of the feature tensor, channels last, e.g.
            `[1, 4, 1, 1, 1]`: NDHWC split 4 ways along depth; their product is the cores per replica.
        label_partition_dims: None keeps labels whole within a replica; dims split them like the features.
        devices: the devices to use (all by default); devices / cores per replica is the number of replicas.

    Sparse labels (a rank less, `(B, D, H, W)`) are laid out as labels; other ranks over the replicas only.

    Example:
        >>> distribution = SpatialParallel([1, 4, 1, 1, 1])  # with 8 devices: 2 replicas × 4 cores
        >>> distribution.get_data_layout((2, 64, 32, 32, 1)).axes
        ('replica', 'depth', None, None, None)
        >>> keras.distribution.set_distribution(distribution)  # model.fit now splits every volume 4 ways along depth
        >>> keras.distribution.set_distribution(None)
    """

    def __init__(self, input_partition_dims: Sequence[int], label_partition_dims: Sequence[int] | None = None,
                 devices: Sequence | None = None):
        config = partitioning.PartitionConfig(tuple(input_partition_dims),
                                 None if label_partition_dims is None else tuple(label_partition_dims))
        partitioning.check_dims(config)
        super().__init__(layout_map=keras.distribution.LayoutMap(build_mesh(config, devices)),
                         batch_dim_name=partitioning.REPLICA_AXIS)
        self.config = config
        split_ops.install()  # transposed convolutions and resizes split without gathers while this is set

    def _spatial_axes(self, dims: Sequence[int]) -> tuple:
        names = partitioning.DIMENSION_NAMES[len(self.config.input_partition_dims)]
        axes = [None] * len(dims)
        axes[0] = partitioning.REPLICA_AXIS
        for i in range(1, len(dims)):
            if dims[i] > 1:
                axes[i] = names[i]
        return tuple(axes)

    def get_data_layout(self, data_shape) -> keras.distribution.TensorLayout:
        """Layout of a feature batch: batch over replicas, spatial dims over cores (other ranks: see the class)."""
        rank = len(self.config.input_partition_dims)
        if len(data_shape) == rank - 1:
            return self.get_label_layout(data_shape)
        if len(data_shape) != rank:
            return keras.distribution.TensorLayout((partitioning.REPLICA_AXIS, *([None] * (len(data_shape) - 1))),
                                                   self.device_mesh)
        return keras.distribution.TensorLayout(self._spatial_axes(self.config.input_partition_dims), self.device_mesh)

    def get_label_layout(self, label_shape) -> keras.distribution.TensorLayout:
        """Layout of a label batch: whole within a replica, or split like the features."""
        if self.config.label_partition_dims is None:
            axes = (partitioning.REPLICA_AXIS,) + (None,) * (len(label_shape) - 1)
        else:
            axes = self._spatial_axes(self.config.label_partition_dims)[: len(label_shape)]
        return keras.distribution.TensorLayout(axes, self.device_mesh)

    def replicated_layout(self, rank: int) -> keras.distribution.TensorLayout:
        """Layout of a fully replicated tensor (weights, scalars)."""
        return keras.distribution.TensorLayout((None,) * rank, self.device_mesh)

    @property
    def num_replicas(self) -> int:
        return self.device_mesh.shape[0]


def make_distribution(config: partitioning.PartitionConfig, devices: Sequence | None = None) -> SpatialParallel:
    """Builds the mesh and the distribution for `config` over `devices` (all by default)."""
    return SpatialParallel(config.input_partition_dims, config.label_partition_dims, devices)
