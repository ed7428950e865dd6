"""A partitioned training step equals the unpartitioned one, and the split is real.

Relative difference is measured per tensor as ||partitioned − reference|| / ||reference||
(the largest over all gradient tensors), which is what float32 rounding of
reordered sums can move; the bar is 1e-5.
"""

import functools
import jax
import keras
import numpy as np
import pytest

from trainer.engine import placement, program, step
from trainer.models import losses, unet
from trainer.parallel import device_mesh, partitioning

pytestmark = pytest.mark.slow  # compiles and runs partitioned and reference steps side by side

TOLERANCE = 1e-5


def _model_and_state(spatial_dims):
    keras.utils.set_random_seed(0)
    config = unet.UNetConfig(spatial_dims=spatial_dims, num_classes=3, num_levels=3, base_filters=4, stem="none")
    model = unet.build_unet(config)
    return model, program.initial_state(model, keras.optimizers.Adam(1e-3))


def _batch(shape, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(*shape, 1)).astype(np.float32)  # (B, [D,] H, W, 1)
    labels = rng.integers(0, 3, size=shape).astype(np.int32)  # (B, [D,] H, W)
    return images, labels


def _loss_and_grads(model, state, dims, devices, images, labels, label_dims=None, loss=losses.dice_cross_entropy):
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims, label_dims), devices)
    placed_state = placement.place_state(state, distribution)
    placed_images, placed_labels = placement.place_batch(distribution, images, labels)
    function = jax.jit(
        step.make_loss_and_grads(model, loss),
        in_shardings=(placement.state_shardings(placed_state, distribution), placed_images.sharding, placed_labels.sharding),
    )
    compiled = function.lower(placed_state, placed_images, placed_labels).compile()
    loss, grads, _ = compiled(placed_state, placed_images, placed_labels)
    return float(loss), [np.asarray(g) for g in grads], placed_images, compiled


def _relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _assert_parity(loss, grads, reference_loss, reference_grads):
    assert abs(loss - reference_loss) / abs(reference_loss) <= TOLERANCE
    worst = max(_relative(g, r) for g, r in zip(grads, reference_grads))
    assert worst <= TOLERANCE, f"largest relative gradient difference {worst:.2e}"


@pytest.fixture(scope="module")
def unet3d():
    model, state = _model_and_state(3)
    images, labels = _batch((1, 32, 16, 16))
    reference = _loss_and_grads(model, state, (1, 1, 1, 1, 1), jax.devices()[:1], images, labels)
    return model, state, images, labels, reference


@pytest.mark.parametrize(
    "dims, label_dims",
    [
        ((1, 2, 1, 1, 1), None),
        ((1, 4, 1, 1, 1), None),
        ((1, 8, 1, 1, 1), None),
        ((1, 8, 1, 1, 1), (1, 8, 1, 1)),
        ((1, 2, 2, 1, 1), None),
        ((1, 2, 2, 1, 1), (1, 2, 2, 1)),
    ],
)
def test_unet3d_partitioned_step_matches_unpartitioned(unet3d, dims, label_dims):
    model, state, images, labels, (reference_loss, reference_grads, _, _) = unet3d
    cores = int(np.prod(dims))
    loss, grads, placed_images, compiled = _loss_and_grads(
        model, state, dims, jax.devices()[:cores], images, labels, label_dims
    )
    _assert_parity(loss, grads, reference_loss, reference_grads)

    # The split is real: every device holds 1/N of the volume, a distinct block of it ...
    shards = placed_images.addressable_shards
    assert len({shard.device for shard in shards}) == cores
    expected_block = tuple(size // parts for size, parts in zip(images.shape, dims))
    assert all(shard.data.shape == expected_block for shard in shards)
    assert len({tuple((s.start or 0) for s in shard.index) for shard in shards}) == cores
    # ... and the compiled step exchanges halos between neighbouring devices, and
    # never gathers a whole activation onto every device (forward or backward).
    assert "collective-permute" in compiled.as_text()
    assert " all-gather(" not in compiled.as_text()


def test_unet2d_partitioned_step_matches_unpartitioned():
    model, state = _model_and_state(2)
    images, labels = _batch((1, 64, 32))
    reference_loss, reference_grads, _, _ = _loss_and_grads(model, state, (1, 1, 1, 1), jax.devices()[:1], images, labels)
    loss, grads, placed_images, compiled = _loss_and_grads(model, state, (1, 4, 1, 1), jax.devices()[:4], images, labels)
    _assert_parity(loss, grads, reference_loss, reference_grads)
    assert all(shard.data.shape == (1, 16, 32, 1) for shard in placed_images.addressable_shards)
    assert "collective-permute" in compiled.as_text()
    assert " all-gather(" not in compiled.as_text()


def test_two_replicas_of_four_cores_match_one_device(unet3d):
    model, state, _, _, _ = unet3d
    images, labels = _batch((2, 32, 16, 16), seed=1)
    reference_loss, reference_grads, _, _ = _loss_and_grads(
        model, state, (1, 1, 1, 1, 1), jax.devices()[:1], images, labels
    )
    loss, grads, placed_images, compiled = _loss_and_grads(model, state, (1, 4, 1, 1, 1), jax.devices(), images, labels)
    _assert_parity(loss, grads, reference_loss, reference_grads)
    # Each of the 8 devices holds one example's quarter: batch over replicas, depth over cores.
    assert all(shard.data.shape == (1, 8, 16, 16, 1) for shard in placed_images.addressable_shards)
    assert placed_images.sharding.spec == jax.sharding.PartitionSpec("replica", "depth", None, None, None)
    # Gradients are reduced over the replicas.
    assert "all-reduce" in compiled.as_text()


def test_train_step_updates_identically_when_partitioned(unet3d):
    """The whole jitted step (gradients + optimizer update) lands on the same weights.

    SGD, because its update is linear in the gradient, so the float32 bar stays
    meaningful. (Adam's first update is about lr × sign(g): a gradient element
    within rounding of zero can flip sign and move its weight by 2 × lr; that is
    Adam's arithmetic, not partitioning, and measured 2e-5 here.)
    """
    model, state, images, labels, _ = unet3d
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    state = placement.TrainState(state.trainable, state.non_trainable, [v.value for v in optimizer.variables])
    train_step = step.make_train_step(model, optimizer, losses.dice_cross_entropy)
    results = []
    for dims, devices in (((1, 1, 1, 1, 1), jax.devices()[:1]), ((1, 8, 1, 1, 1), jax.devices())):
        distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims), devices)
        placed = placement.place_state(state, distribution)
        jitted = step.jit_train_step(train_step, distribution, placed, image_ndim=5, label_ndim=4)
        new_state, metrics = jitted(placed, *placement.place_batch(distribution, images, labels), np.int32(0))
        results.append(([np.asarray(w) for w in new_state.trainable], float(metrics["loss"])))
    (reference, reference_loss), (partitioned, loss) = results
    assert abs(loss - reference_loss) / reference_loss <= TOLERANCE
    assert max(_relative(p, r) for p, r in zip(partitioned, reference)) <= TOLERANCE


def test_bfloat16_partitioned_step_runs_and_stays_close():
    keras.utils.set_random_seed(0)
    config = unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=4, stem="none")
    model = unet.build_unet(config, dtype="mixed_bfloat16")
    state = program.initial_state(model, keras.optimizers.Adam(1e-3))
    assert all(np.asarray(w).dtype == np.float32 for w in state.trainable)  # weights stay float32
    images, labels = _batch((1, 32, 16, 16))
    reference_loss, _, _, _ = _loss_and_grads(model, state, (1, 1, 1, 1, 1), jax.devices()[:1], images, labels)
    loss, _, _, compiled = _loss_and_grads(model, state, (1, 4, 1, 1, 1), jax.devices()[:4], images, labels)
    assert "bf16" in compiled.as_text()
    # bfloat16 keeps 8 bits of mantissa: the partitioned loss agrees to bfloat16 rounding.
    assert abs(loss - reference_loss) / reference_loss <= 1e-2


@pytest.mark.parametrize("dims", [(1, 8, 1, 1, 1), (1, 2, 2, 1, 1), (1, 1, 2, 2, 1)])
def test_space_to_depth_unet_partitioned_step_matches_unpartitioned(dims):
    """The TPU-shaped stem (2×2×2 voxels folded into channels, logits unfolded) partitions like every other layer.

    32 voxels of depth over 8 devices leave 4 per device, 2 after the fold and 1
    after the pooling: the smallest blocks the stem allows, so a fold that
    crossed a device boundary would change the gradients.
    """
    keras.utils.set_random_seed(0)
    config = unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=2, base_filters=16, stem="space_to_depth")
    model = unet.build_unet(config)
    state = program.initial_state(model, keras.optimizers.Adam(1e-3))
    images, labels = _batch((1, 32, 16, 16))
    reference_loss, reference_grads, _, _ = _loss_and_grads(model, state, (1, 1, 1, 1, 1), jax.devices()[:1],
                                                            images, labels)
    cores = int(np.prod(dims))
    loss, grads, placed_images, compiled = _loss_and_grads(model, state, dims, jax.devices()[:cores], images, labels)
    _assert_parity(loss, grads, reference_loss, reference_grads)
    expected_block = tuple(size // parts for size, parts in zip(images.shape, dims))
    assert all(shard.data.shape == expected_block for shard in placed_images.addressable_shards)
    assert "collective-permute" in compiled.as_text()
    assert " all-gather(" not in compiled.as_text()


@pytest.fixture(scope="module")
def deep_supervised():
    """The TPU-shaped UNet (stem, 3 levels) with deep supervision: logits at full resolution and at 1/2."""
    keras.utils.set_random_seed(0)
    config = unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=4, deep_supervision=True)
    model = unet.build_unet(config)
    state = program.initial_state(model, keras.optimizers.Adam(1e-3))
    images, labels = _batch((1, 32, 32, 16))

    def loss(outputs, labels):  # the whole-volume recipe's loss: its class counts are sums over the split batch
        balanced = functools.partial(losses.dice_cross_entropy, class_balance=losses.WHOLE_VOLUME_CLASS_BALANCE)
        return losses.deep_supervision(outputs, labels, config.output_weights, balanced)

    reference = _loss_and_grads(model, state, (1, 1, 1, 1, 1), jax.devices()[:1], images, labels, loss=loss)
    return model, state, images, labels, loss, reference


@pytest.mark.parametrize("dims", [(1, 2, 1, 1, 1), (1, 4, 1, 1, 1), (1, 2, 2, 1, 1)])
def test_deep_supervision_partitioned_step_matches_unpartitioned(deep_supervised, dims):
    """The auxiliary logits and the labels downsampled for them (on the device, in blocks) split like the features:
    the same loss and gradients split 2, 4 and 2x2 ways as on one device, and no all-gather."""
    model, state, images, labels, loss, (reference_loss, reference_grads, _, _) = deep_supervised
    cores = int(np.prod(dims))
    found_loss, grads, _, compiled = _loss_and_grads(model, state, dims, jax.devices()[:cores], images, labels,
                                                     (1, *dims[1:-1]), loss=loss)
    _assert_parity(found_loss, grads, reference_loss, reference_grads)
    assert " all-gather(" not in compiled.as_text()
    # The auxiliary head learns: its kernel's gradient is not zero.
    head = [i for i, v in enumerate(model.trainable_variables) if v.path.startswith("logits_2/")]
    assert head and all(np.linalg.norm(grads[i]) > 0 for i in head)
