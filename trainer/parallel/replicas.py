"""A split's replicas: whether the devices present and the global batch hold it.

One replica holds one example split over `num_cores_per_replica` cores (`partitioning.PartitionConfig`); the devices
present make `devices / cores` replicas, and the global batch is shared out over them. What a split is against a
shape and a network is `partitioning.validate`; this module is the same split against the devices and the batch.
Training asks `validate_devices` before it reads any data, so a split the devices cannot hold is named first, and
`validate` after the rerun check, which names a resume's changed batch as a change of the run (`resolved_run`).
"""

from __future__ import annotations

from trainer.parallel import partitioning


def fitting_counts(batch_size: int, cores_per_replica: int) -> list[int]:
    """The device counts, most first, that run a global batch of `batch_size` with `cores_per_replica` cores each.

    >>> fitting_counts(4, 1), fitting_counts(2, 4)
    ([4, 2, 1], [8, 4])
    """
    return [cores_per_replica * replicas for replicas in range(batch_size, 0, -1) if batch_size % replicas == 0]


def validate_devices(config: partitioning.PartitionConfig, num_devices: int) -> None:
    """One replica's cores divide the devices: the check that needs neither data nor batch.

    Raises:
        partitioning.PartitionError: with a one-sentence message naming the problem and the fix.
    """
    dims = config.input_partition_dims
    cores = config.num_cores_per_replica
    if num_devices % cores != 0:
        divisors = [n for n in range(1, num_devices + 1) if num_devices % n == 0]
        raise partitioning.PartitionError(
            f"input_partition_dims {list(dims)} asks for {cores} cores per replica, which does not divide the "
            f"{num_devices} devices present; use dims whose product is one of {divisors}."
        )


def validate(config: partitioning.PartitionConfig, num_devices: int, global_batch_size: int | None = None) -> None:
    """The split fits `num_devices` devices (`validate_devices`) and, if given, the global batch divides over the
    replicas they make.

    Raises:
        partitioning.PartitionError: with a one-sentence message naming the problem and the fix.
    """
    validate_devices(config, num_devices)
    cores = config.num_cores_per_replica
    replicas = num_devices // cores
    if global_batch_size is not None and global_batch_size % replicas != 0:
        raise partitioning.PartitionError(
            f"global batch size {global_batch_size} does not divide over {replicas} replicas "
            f"({num_devices} devices / {cores} cores per replica); use a multiple of {replicas}."
        )
