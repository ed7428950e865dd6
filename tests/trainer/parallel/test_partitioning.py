"""Partitioning config: every refusal names the problem and the fix; meshes and layouts are right."""

import jax
import pytest

from trainer.parallel import device_mesh, partitioning, replicas
from trainer.parallel.partitioning import PartitionConfig, PartitionError


@pytest.mark.parametrize(
    "dims, shape, devices, levels, batch, message",
    [
        # rank mismatch
        ((1, 4, 1, 1), (1, 64, 64, 64, 1), 8, 0, None,
         r"input_partition_dims \[1, 4, 1, 1\] has 4 entries but the features are 5-D \(batch, depth, height, width, "
         r"channels\); give one entry per dimension, e.g. \[1, 4, 1, 1, 1\]"),
        # batch entry != 1
        ((2, 4, 1, 1, 1), (2, 64, 64, 64, 1), 8, 0, None,
         r"input_partition_dims\[0\] = 2 partitions the batch dimension; .* set it to 1"),
        # channels partitioned
        ((1, 1, 1, 1, 2), (1, 64, 64, 64, 2), 8, 0, None,
         r"input_partition_dims\[4\] = 2 partitions the channels; only spatial dimensions can be partitioned"),
        # not divisible at the input
        ((1, 4, 1, 1, 1), (1, 66, 64, 64, 1), 8, 0, None,
         r"depth 66 \(input_partition_dims\[1\] = 4\) .* at the input it is 66, which does not divide by 4; use depth "
         r"64 or 68 \(multiples of 4\)"),
        # divisible at the input, not at a deeper level
        ((1, 4, 1, 1, 1), (1, 104, 64, 64, 1), 8, 2, None,
         r"depth 104 \(input_partition_dims\[1\] = 4\) does not fit a model with 2 downsamplings: at resolution level "
         r"3 \(after 2 downsamplings\) it is 26, which does not divide by 4; use depth 96 or 112 \(multiples of 16\)"),
        # an unpartitioned dimension that cannot be halved often enough
        ((1, 2, 1, 1, 1), (1, 64, 36, 64, 1), 8, 3, None,
         r"height 36 .* at resolution level 3 \(after 2 downsamplings\) it is 9, which cannot be halved; use height 32 "
         r"or 40 \(multiples of 8\)"),
        # 2D: width split
        ((1, 1, 4, 1), (1, 64, 50, 3), 8, 1, None, r"width 50 .* use width 48 or 56 \(multiples of 8\)"),
        # a 2-voxel axis cut in 2 at the coarsest level (XLA gathers there, and with a second split axis the
        # gradients came out 4x: docs/partitioning.md, "What is refused, and why")
        ((1, 2, 2, 1, 1), (1, 32, 16, 16, 1), 4, 3, None,
         r"height 16 \(input_partition_dims\[2\] = 2\) is 2 voxels at resolution level 4, 1 on each of its 2 "
         r"devices, where XLA gathers whole activations and can compute wrong gradients; use height 32 or more, or do "
         r"not split height"),
        ((1, 2, 1, 1), (1, 4, 64, 3), 2, 1, None, r"height 4 \(input_partition_dims\[1\] = 2\) is 2 voxels"),
    ],
)
def test_validate_refuses_with_fix(dims, shape, devices, levels, batch, message):
    with pytest.raises(PartitionError, match=message):
        replicas.validate(PartitionConfig(dims), devices, batch)
        partitioning.validate(PartitionConfig(dims), shape, downsampling_levels=levels)


def test_validate_refuses_labels_split_unlike_features():
    config = PartitionConfig((1, 4, 1, 1, 1), label_partition_dims=(1, 2, 1, 1))
    with pytest.raises(PartitionError, match=r"label_partition_dims \[1, 2, 1, 1\] must split the labels like the "
                                             r"features \[1, 4, 1, 1, 1\]; use \[1, 4, 1, 1\], or None"):
        partitioning.validate(config, (1, 64, 64, 64, 1))


def test_validate_refuses_unsupported_rank():
    with pytest.raises(PartitionError, match=r"are 3-D; fullres partitions 4-D .* or 5-D"):
        partitioning.validate(PartitionConfig((1, 2, 1)), (1, 64, 1))


@pytest.mark.parametrize(
    "dims, shape, devices, levels, batch",
    [
        ((1, 4, 1, 1, 1), (2, 64, 64, 64, 1), 8, 3, 2),
        ((1, 2, 2, 1, 1), (1, 64, 64, 32, 1), 4, 3, 1),
        ((1, 16, 1, 1, 1), (1, 256, 256, 256, 1), 16, 3, 1),
        ((1, 4, 1, 1), (8, 2560, 2560, 3), 8, 7, 8),
        ((1, 1, 1, 1, 1), (8, 32, 32, 32, 1), 8, 2, 8),
        ((1, 4, 2, 1, 1), (1, 32, 32, 16, 1), 8, 3, 1),  # 1 voxel per device on 4 devices: exact, measured
    ],
)
def test_validate_accepts_working_configs(dims, shape, devices, levels, batch):
    replicas.validate(PartitionConfig(dims), devices, batch)
    partitioning.validate(PartitionConfig(dims), shape, downsampling_levels=levels)


@pytest.mark.parametrize(
    "dims, num_devices, mesh_shape, axis_names",
    [
        ((1, 4, 1, 1, 1), 8, (2, 4), ("replica", "depth")),
        ((1, 2, 2, 1, 1), 8, (2, 2, 2), ("replica", "depth", "height")),
        ((1, 8, 1, 1, 1), 8, (1, 8), ("replica", "depth")),
        ((1, 1, 1, 1, 1), 8, (8,), ("replica",)),
        ((1, 2, 2, 1), 4, (1, 2, 2), ("replica", "height", "width")),
    ],
)
def test_build_mesh(dims, num_devices, mesh_shape, axis_names):
    mesh = device_mesh.build_mesh(PartitionConfig(dims), jax.devices()[:num_devices])
    assert mesh.shape == mesh_shape
    assert tuple(mesh.axis_names) == axis_names


def test_data_and_label_layouts():
    distribution = device_mesh.make_distribution(PartitionConfig((1, 2, 2, 1, 1)))
    assert distribution.num_replicas == 2
    assert distribution.get_data_layout((2, 32, 32, 32, 1)).axes == ("replica", "depth", "height", None, None)
    assert distribution.get_label_layout((2, 32, 32, 32)).axes == ("replica", None, None, None)
    split_labels = device_mesh.make_distribution(PartitionConfig((1, 2, 2, 1, 1), (1, 2, 2, 1)))
    assert split_labels.get_label_layout((2, 32, 32, 32)).axes == ("replica", "depth", "height", None)
    assert distribution.replicated_layout(5).axes == (None,) * 5


@pytest.mark.parametrize(
    "text, dims",
    [("1,4,1,1", (1, 4, 1, 1)), ("[1, 16, 1, 1, 1]", (1, 16, 1, 1, 1)), ("none", None), ("", None), (None, None)],
)
def test_parse_dims(text, dims):
    assert partitioning.parse_dims(text) == dims


def test_parse_dims_refuses_garbage():
    with pytest.raises(PartitionError, match=r"'1,x,1' are not a comma-separated list of integers; write e.g."):
        partitioning.parse_dims("1,x,1")
