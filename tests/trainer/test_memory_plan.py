"""`fullres plan`: memory read from the compiled step, and communication found in its HLO."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from trainer import losses, memory_plan, partitioning, step

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def rows():
    from trainer import unet

    config = unet.UNetConfig(spatial_dims=3, num_levels=3, base_filters=8)
    return memory_plan.plan("unet3d", (32, 32, 32), [1, 2, 4], model_config=config, device_memory=8 * 2**20)


@pytest.mark.slow
def test_memory_per_device_falls_with_partitions(rows):
    temps = [r.temp_bytes for r in rows]
    assert temps[0] > temps[1] > temps[2]
    for r in rows:
        assert r.efficiency == pytest.approx(rows[0].temp_bytes / (r.partitions * r.temp_bytes), abs=1e-4)
        assert r.total_bytes >= r.temp_bytes
    assert [r.fits for r in rows] == [r.total_bytes <= 8 * 2**20 for r in rows]


@pytest.mark.slow
def test_unet_step_has_halo_exchange_and_no_activation_all_gather(rows):
    assert [r.activation_all_gathers for r in rows] == [0, 0, 0]
    assert rows[0].halo_bytes == 0 and rows[1].halo_bytes > 0 and rows[2].halo_bytes > 0


def test_all_gather_of_an_activation_is_counted():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("replica", "depth"))
    split = NamedSharding(mesh, PartitionSpec("replica", "depth"))

    def gather(x):  # forces every device to hold the whole (1, 16, 8, 8, 4) activation
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, PartitionSpec())) + 1

    compiled = jax.jit(gather, in_shardings=split).lower(jnp.zeros((1, 16, 8, 8, 4))).compile()
    assert memory_plan.communication(compiled.as_text(), feature_rank=5, replica_batch=1)[0] >= 1


def test_transposed_convolution_gradient_is_caught():
    """The layer the UNet no longer uses: its partitioned gradient gathers the activation."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, None, None, 4))
    outputs = keras.layers.Conv3D(3, 1)(keras.layers.Conv3DTranspose(4, 2, strides=2)(inputs))
    model = keras.Model(inputs, outputs)
    state = step.initial_state(model, keras.optimizers.SGD(0.1))
    distribution = partitioning.make_distribution(partitioning.PartitionConfig((1, 4, 1, 1, 1)), jax.devices()[:4])
    placed = step.place_state(state, distribution)
    images, labels = step.place_batch(distribution, np.zeros((1, 16, 8, 8, 4), np.float32), np.zeros((1, 32, 16, 16), np.int32))
    function = jax.jit(step.make_loss_and_grads(model, losses.dice_cross_entropy),
                       in_shardings=(step.state_shardings(placed, distribution), images.sharding, labels.sharding))
    text = function.lower(placed, images, labels).compile().as_text()
    assert memory_plan.communication(text, feature_rank=5, replica_batch=1)[0] >= 1


@pytest.mark.parametrize("text, expected", [("16GiB", 16 * 2**30), ("32 GB", 32 * 10**9), ("512MiB", 512 * 2**20),
                                            ("1e9", 10**9)])
def test_parse_bytes(text, expected):
    assert memory_plan.parse_bytes(text) == expected


def test_parse_bytes_refuses_nonsense():
    with pytest.raises(ValueError, match=r"--device-memory 'lots' is not a size; write e.g. 16GiB"):
        memory_plan.parse_bytes("lots")


@pytest.mark.slow
def test_plan_command_json():
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "--image-size", "16,16,16", "--partitions", "1,2",
         "--num-levels", "2", "--base-filters", "4", "--json"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert [r["partitions"] for r in rows] == [1, 2]
    assert set(rows[0]) == {"partitions", "temp_bytes", "argument_bytes", "total_bytes", "efficiency",
                            "activation_all_gathers", "halo_bytes"}
    assert rows[1]["activation_all_gathers"] == 0 and rows[1]["halo_bytes"] > 0


@pytest.mark.slow
def test_retinanet_plan_partitions_without_all_gathers():
    from trainer import retinanet

    config = retinanet.RetinaNetConfig(stackwise_num_blocks=(1, 1, 1, 1), stackwise_num_filters=(64, 32, 32, 32),
                                       head_filters=32, head_conv_layers=2)
    rows = memory_plan.plan("retinanet", (256, 256), [1, 4], model_config=config)
    assert rows[1].temp_bytes < rows[0].temp_bytes
    assert [r.activation_all_gathers for r in rows] == [0, 0]
    assert rows[1].halo_bytes > 0 and rows[1].input_partition_dims == (1, 4, 1, 1)


def test_plan_refuses_an_image_the_pyramid_cannot_split():
    with pytest.raises(partitioning.PartitionError, match=r"height 200 \(input_partition_dims\[1\] = 8\)"):
        memory_plan.plan("retinanet", (200, 256), [8])
