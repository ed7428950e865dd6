"""Mirroring on the device: drawn per (seed, step, row), image and label together, the same on any split, no gather."""

import jax
import numpy as np
import pytest

from trainer.augment import keys, mirror
from trainer.engine import placement
from trainer.parallel import device_mesh, partitioning
from trainer.plan import gathers


MIRROR = jax.jit(mirror.mirror, static_argnames="axes")  # compiled once per shape, not run op by op


def _batch():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 16, 8, 8, 1)).astype(np.float32)  # (B, D, H, W, C)
    return images, (images[..., 0] > 0).astype(np.int32)


def test_draws_depend_on_seed_step_and_row_only():
    images, labels = _batch()
    a = MIRROR(images, labels, keys.row_keys(0, 7, 2))
    b = MIRROR(images, labels, keys.row_keys(0, 7, 2))
    np.testing.assert_array_equal(a[0], b[0])
    different = [not np.array_equal(MIRROR(images, labels, keys.row_keys(0, step, 2))[0], a[0])
                 for step in range(8, 16)]
    assert any(different)
    # A row's draw does not depend on the rows beside it: row 1 of a batch of 2 is row 1 of a batch of 4.
    four = MIRROR(np.concatenate([images, images]), np.concatenate([labels, labels]), keys.row_keys(0, 7, 4))
    np.testing.assert_array_equal(four[0][:2], a[0])
    # Image and label flip together: the label is still the image's sign.
    np.testing.assert_array_equal((np.asarray(a[0])[..., 0] > 0).astype(np.int32), np.asarray(a[1]))


def test_an_axis_left_out_is_never_flipped_and_the_others_keep_their_draws():
    images, labels = _batch()
    for step in range(6):
        row_keys = keys.row_keys(1, step, 2)
        everything = np.asarray(MIRROR(images, labels, row_keys)[0])
        no_depth = np.asarray(MIRROR(images, labels, row_keys, axes=(1, 2))[0])
        # Without depth flips, the result equals the all-axes one with its depth flip undone (or unchanged).
        assert all(np.array_equal(no_depth[r], everything[r]) or np.array_equal(no_depth[r], everything[r, ::-1])
                   for r in range(2))


@pytest.mark.parametrize("dims", [(1, 2, 1, 1, 1), (1, 4, 1, 1, 1), (1, 2, 2, 1, 1)])
def test_split_volumes_mirror_as_one_device_does_without_gathering(dims):
    images, labels = _batch()
    reference = MIRROR(images, labels, keys.row_keys(0, 5, 2))
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims), jax.devices()[:int(np.prod(dims))])
    image_sharding = distribution.get_data_layout(images.shape).backend_layout
    label_sharding = placement.sharding(distribution, distribution.get_data_layout(images.shape).axes[:-1])
    function = jax.jit(lambda i, lab, step: mirror.mirror(i, lab, keys.row_keys(0, step, 2)),
                       in_shardings=(image_sharding, label_sharding, None), out_shardings=(image_sharding, label_sharding))
    placed = jax.device_put(images, image_sharding), jax.device_put(labels, label_sharding)
    result = function(*placed, 5)
    np.testing.assert_array_equal(result[0], reference[0])
    np.testing.assert_array_equal(result[1], reference[1])
    text = function.lower(*placed, 5).compile().as_text()
    assert gathers.activation_gathers(text, replica_batch=2) == []
