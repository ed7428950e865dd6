"""Rotation and scaling on the device: three one-axis passes that compose to nnU-Net's affine map, trilinear where
the map is separable, labels following the image. (Split over devices: test_augment_parity.py.)"""

import functools
import math

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from scipy import ndimage

from trainer.augment.keys import row_keys
from trainer.augment import spatial


def _rotation(angles):
    (cx, cy, cz), (sx, sy, sz) = np.cos(angles), np.sin(angles)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx


def test_the_three_passes_compose_to_the_affine_map():
    """Pass 0 sets coordinate 0 from the output coordinates, pass 1 coordinate 1 from those, pass 2 the last:
    together, v = A u for every u."""
    matrix = _rotation([0.5, -0.4, 0.3]) * 1.3
    coefficients = [np.asarray(spatial.pass_coefficients(np.asarray(matrix, np.float32)[None], axis))[0]
                    for axis in range(3)]
    u = np.random.default_rng(0).normal(size=(3, 50))
    w = u.copy()
    for axis in range(3):
        w[axis] = coefficients[axis] @ w
    np.testing.assert_allclose(w, matrix @ u, atol=1e-4)


def _smooth_volume(shape=(1, 16, 12, 10)):
    rng = np.random.default_rng(1)
    return ndimage.gaussian_filter(rng.normal(size=shape), (0, 2, 2, 2)).astype(np.float32) * 10


def test_scaling_is_trilinear_with_zeros_outside_as_grid_sample():
    """Scaling alone is separable, so the passes equal one trilinear resampling (scipy's, zero outside: torch
    grid_sample's padding_mode='zeros'), about the volume's centre; 1.3 shrinks the anatomy."""
    volume = _smooth_volume()
    labels = (volume > 0).astype(np.int32)
    images, out_labels = jax.jit(functools.partial(
        spatial.rotate_and_scale, num_classes=2, rotation_probability=0.0, scale_probability=1.0, scale=(1.3, 1.3)
    ))(volume[..., None], labels, row_keys(0, 0, 1))
    centre = (np.array(volume.shape[1:]) - 1) / 2
    expected = ndimage.affine_transform(volume[0], np.eye(3) * 1.3, centre - 1.3 * centre, order=1,
                                        mode="grid-constant")
    np.testing.assert_allclose(images[0, ..., 0], expected, atol=1e-4)
    # Labels: each class's indicator resampled the same way, the largest taken (nnU-Net's linear label sampling).
    indicators = [ndimage.affine_transform((labels[0] == k).astype(float), np.eye(3) * 1.3, centre - 1.3 * centre,
                                           order=1, mode="grid-constant") for k in (0, 1)]
    np.testing.assert_array_equal(out_labels[0], np.argmax(indicators, axis=0))


def test_rotation_matches_trilinear_resampling_closely():
    """Three linear passes interpolate about as much as one trilinear resampling (not identically)."""
    volume = _smooth_volume((1, 24, 24, 24))
    matrix = _rotation([0.35, -0.2, 0.25]).astype(np.float32)
    out = jax.jit(spatial._resample, static_argnums=2)(volume[..., None], matrix[None], None)[0, ..., 0]
    centre = (np.array(volume.shape[1:]) - 1) / 2
    expected = ndimage.affine_transform(volume[0], matrix, centre - matrix @ centre, order=1, mode="grid-constant")
    inner = (slice(6, -6),) * 3  # away from the corners that a pass moves outside before the next reads them
    error = np.abs(np.asarray(out)[inner] - expected[inner]).max()
    assert error < 0.05 * np.abs(expected[inner]).max(), error
    assert np.abs(np.asarray(out) - volume[0]).max() > 0.3 * np.abs(volume).max()  # it did rotate


@pytest.mark.slow  # the drawn rows resampled: the largest program of these tests
def test_rows_not_drawn_stay_and_draws_follow_seed_step_and_row():
    volume = _smooth_volume((3, 8, 8, 8))[..., None]
    labels = (volume[..., 0] > 0).astype(np.int32)
    run = jax.jit(functools.partial(spatial.rotate_and_scale, num_classes=2, rotation_probability=0.5,
                                    scale_probability=0.5))
    matrices, active = spatial.affine(row_keys(0, 4, 3), 3, 0.5, (-math.pi / 6, math.pi / 6), 0.5, (0.7, 1.4))
    out, out_labels = run(volume, labels, row_keys(0, 4, 3))
    for row in range(3):
        same = np.array_equal(out[row], volume[row]) and np.array_equal(out_labels[row], labels[row])
        assert same == (not active[row]), (row, active)
    again, _ = run(volume, labels, row_keys(0, 4, 3))
    np.testing.assert_array_equal(again, out)


def test_a_split_that_no_other_axis_can_take_is_refused_in_a_sentence():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(1, 2, 2, 2), ("replica", "depth", "height", "width"))
    sharding = NamedSharding(mesh, PartitionSpec("replica", "depth", "height", "width", None))
    with pytest.raises(ValueError, match=r"no other spatial axis can take its 2 parts; split fewer axes"):
        spatial._whole_along(sharding, (1, 4, 6, 2, 1), 1)
    moved = spatial._whole_along(NamedSharding(mesh, PartitionSpec("replica", "depth", None, None, None)),
                                 (1, 8, 8, 8, 1), 1)
    assert moved.spec == PartitionSpec("replica", None, "depth", None, None)


def test_rotations_of_45_degrees_are_refused():
    with pytest.raises(ValueError, match="reaches 45 degrees"):
        spatial.affine(row_keys(0, 0, 1), 3, rotation=(-math.pi / 4, math.pi / 4))
