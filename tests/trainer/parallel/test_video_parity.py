"""Video clips train alike split over time, or time and height, as on one device: the whole step from the clip
records (uint8 RGB, read through `ct_input`) through the task's on-device cast and video augmentation, the UNet over
(B, T, H, W, 3), to the loss and its gradients. The bar is test_parity.py's, 1e-5."""

import dataclasses

import jax
import keras
import numpy as np
import pytest

from tests.preprocessing.video import video_makers
from tests.trainer.parallel import test_parity as parity
from trainer import presets
from trainer.augment import recipe
from trainer.engine import placement, program, step
from trainer.models import unet
from trainer.parallel import device_mesh, partitioning
from trainer.tasks import registry

pytestmark = pytest.mark.slow  # three compilations of a small 3D UNet's step

CLIP = (16, 32, 32)  # (T, H, W): 3 levels leave 4 frames at the bottom, 2 on each of 2 devices


@pytest.fixture(scope="module")
def video_task(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("clips") / "data-00000-of-00001.tfrecord")
    video_makers.write_motion_clip_records(path, CLIP)
    always = dataclasses.replace(recipe.preset("video"), noise_probability=1.0, brightness_probability=1.0,
                                 contrast_probability=1.0, gamma_probability=1.0)
    config = presets.video(
        train_data=path, augmentation=always,
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, in_channels=3, num_levels=3, base_filters=4, stem="none"))
    task = registry.make_task(config)
    batches = task.batches(0, log=lambda line: None)
    batch = next(batches)
    keras.utils.set_random_seed(0)
    model = task.build_model()
    state = program.initial_state(model, keras.optimizers.Adam(1e-3))
    yield task, batch, model, state
    batches.close()


def _loss_and_grads(task, batch, model, state, dims):
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims),
                                                  jax.devices()[:int(np.prod(dims))])
    placed_state = placement.place_state(state, distribution)
    inputs, labels = task.place(distribution, batch)
    loss_and_grads = step.make_loss_and_grads(model, task.loss)

    def prepared(state, inputs, labels):
        images, prepared_labels = task.prepare(inputs, labels, 7, distribution)
        return loss_and_grads(state, images, prepared_labels)

    compiled = jax.jit(prepared, in_shardings=(placement.state_shardings(placed_state, distribution),
                                               task.input_sharding(distribution, 5),
                                               task.label_sharding(distribution, 5))
                       ).lower(placed_state, inputs, labels).compile()
    loss, grads, _ = compiled(placed_state, inputs, labels)
    return float(loss), [np.asarray(g) for g in grads], inputs["image"], compiled.as_text()


def test_the_clip_records_reach_the_step_as_uint8_rgb(video_task):
    task, batch, _, _ = video_task
    assert task.example_shape() == (*CLIP, 3)
    assert batch.inputs["image"].shape == (2, *CLIP, 3) and batch.inputs["image"].dtype == np.uint8
    assert set(np.unique(batch.labels)) == {0, 1, 2}


@pytest.fixture(scope="module")
def one_device(video_task):
    return _loss_and_grads(*video_task, (1, 1, 1, 1, 1))


@pytest.mark.parametrize("dims", [(1, 2, 1, 1, 1), (1, 2, 2, 1, 1)], ids=["time", "time-height"])
def test_a_clip_split_over_time_and_space_steps_as_on_one_device(video_task, one_device, dims):
    task, batch, model, state = video_task
    reference_loss, reference_grads, _, _ = one_device
    loss, grads, placed, hlo = _loss_and_grads(task, batch, model, state, dims)
    parity._assert_parity(loss, grads, reference_loss, reference_grads)
    block = tuple(size // parts for size, parts in zip((2, *CLIP, 3), dims))
    assert all(shard.data.shape == block for shard in placed.addressable_shards)  # each device a block of frames
    assert len(placed.sharding.device_set) == int(np.prod(dims))
    assert "collective-permute" in hlo and " all-gather(" not in hlo  # halos in time (and height), no gather
