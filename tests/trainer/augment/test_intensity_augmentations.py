"""nnU-Net's intensity augmentations on the device: each computes what batchgeneratorsv2's transform computes, draws
per (seed, step, row), and leaves the rows it did not draw untouched. (Split over devices: test_augment_parity.py.)"""

import functools

import jax
import numpy as np
import pytest
from scipy import ndimage

from trainer.augment import draws, intensity
from trainer.augment.keys import row_keys


def apply(transform, images, labels, keys, **params):
    """`transform` jitted as the train step runs it (op by op it is slower than compiling), compiled once per
    transform, parameters and shapes."""
    return _jitted(transform, tuple(sorted(params.items())))(images, labels, keys)


@functools.cache
def _jitted(transform, params):
    return jax.jit(functools.partial(transform, **dict(params)))


def _volume(shape=(2, 12, 10, 8, 1), seed=0):
    rng = np.random.default_rng(seed)
    images = ndimage.gaussian_filter(rng.normal(size=shape), (0, 1, 1, 1, 0)).astype(np.float32)
    labels = rng.integers(0, 3, size=shape[:-1]).astype(np.int32)
    return images, labels


def test_gaussian_blur_is_batchgenerators_kernel_mirrored_at_the_border():
    """sigma 0.8 gives batchgeneratorsv2 a 5-tap kernel (round to odd of 0.8 × 6 + 0.5); torch's reflect padding is
    scipy's 'mirror'."""
    images, labels = _volume()
    out, same_labels = apply(intensity.gaussian_blur, images, labels, row_keys(0, 0, 2), probability=1.0, sigma=(0.8, 0.8),
                                               probability_per_channel=1.0)
    expected = images
    for axis in (1, 2, 3):
        expected = ndimage.gaussian_filter1d(expected, 0.8, axis=axis, mode="mirror", radius=2)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_array_equal(same_labels, labels)


def test_low_resolution_is_nearest_down_then_linear_up():
    """torch's interpolate: nearest-exact to round(n × scale) voxels, then linear (align_corners=False) back."""
    images, labels = _volume((1, 12, 10, 8, 1))
    out, _ = apply(intensity.low_resolution, images, labels, row_keys(0, 0, 1), probability=1.0, scale=(0.6, 0.6),
                                      probability_per_channel=1.0)

    def along(x, axis, n):
        size = round(n * 0.6)
        down = np.take(x, np.minimum(np.floor((np.arange(size) + 0.5) * n / size), n - 1).astype(int), axis=axis)
        position = np.maximum((np.arange(n) + 0.5) * size / n - 0.5, 0)
        first = np.minimum(np.floor(position), size - 1).astype(int)
        second = np.minimum(first + 1, size - 1)
        shape = [1] * x.ndim
        shape[axis] = n
        fraction = (position - first).reshape(shape)
        return np.take(down, first, axis=axis) * (1 - fraction) + np.take(down, second, axis=axis) * fraction

    expected = images
    for axis, n in zip((1, 2, 3), images.shape[1:4]):
        expected = along(expected, axis, n)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert not np.allclose(out, images)


@pytest.mark.slow  # 4 compilations
def test_gamma_keeps_mean_and_spread_and_inverted_gamma_bends_the_other_way():
    images, labels = _volume()
    keys = row_keys(3, 1, 2)
    for transform in (intensity.gamma, intensity.inverted_gamma):
        out, _ = apply(transform, images, labels, keys, probability=1.0)
        np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), images.mean(axis=(1, 2, 3)), atol=1e-5)
        np.testing.assert_allclose(out.std(axis=(1, 2, 3), ddof=1), images.std(axis=(1, 2, 3), ddof=1), rtol=1e-4)
        assert not np.allclose(out, images, atol=1e-3)
    # The same exponent on the negated image: x -> -f(-x), with f the plain transform.
    plain = intensity._gamma(-images, keys, 999, 1.0, (1.3, 1.3), 0.0, True)
    inverted = intensity._gamma(images, keys, 999, 1.0, (1.3, 1.3), 1.0, True)
    np.testing.assert_allclose(inverted, -np.asarray(plain), atol=1e-5)


def test_contrast_scales_about_the_mean_within_the_former_range():
    images, labels = _volume()
    out, _ = apply(intensity.contrast, images, labels, row_keys(0, 5, 2), probability=1.0)
    assert np.all(out.min(axis=(1, 2, 3)) >= images.min(axis=(1, 2, 3)) - 1e-6)
    assert np.all(out.max(axis=(1, 2, 3)) <= images.max(axis=(1, 2, 3)) + 1e-6)
    centred_in, centred_out = images - images.mean(axis=(1, 2, 3), keepdims=True), out - images.mean(
        axis=(1, 2, 3), keepdims=True)
    inside = np.abs(centred_in) < 0.5 * np.abs(centred_in).max()  # away from the clipping
    ratio = centred_out[inside] / centred_in[inside]
    assert np.all((ratio >= 0.75 - 1e-4) & (ratio <= 1.25 + 1e-4)) and not np.allclose(ratio, 1)


@pytest.mark.slow  # 4 compilations each
@pytest.mark.parametrize("transform", [intensity.gaussian_noise, intensity.gaussian_blur, intensity.brightness,
                                       intensity.contrast, intensity.low_resolution, intensity.inverted_gamma,
                                       intensity.gamma])
def test_rows_not_drawn_stay_as_they_were_and_draws_follow_seed_step_and_row(transform):
    images, labels = _volume((3, 8, 8, 8, 1))
    untouched, _ = apply(transform, images, labels, row_keys(0, 0, 3), probability=0.0)
    np.testing.assert_array_equal(untouched, images)
    a, _ = apply(transform, images, labels, row_keys(0, 7, 3), probability=1.0)
    b, _ = apply(transform, images, labels, row_keys(0, 7, 3), probability=1.0)
    c, _ = apply(transform, images, labels, row_keys(0, 8, 3), probability=1.0)
    np.testing.assert_array_equal(a, b)  # a resumed run at step 7 draws what the uninterrupted one drew
    assert not np.array_equal(a, c)
    # Row 1 of a batch of 3 is augmented as row 1 of a batch of 2 (a draw belongs to its row, not the batch).
    d, _ = apply(transform, images[:2], labels[:2], row_keys(0, 7, 2), probability=1.0)
    np.testing.assert_array_equal(a[1], d[1])


def test_bg_contrast_draws_below_and_above_one_equally_often():
    factors = np.asarray(draws.bg_contrast(row_keys(0, 0, 4000), 0.75, 1.25))
    assert factors.min() >= 0.75 and factors.max() <= 1.25
    assert 0.45 < np.mean(factors < 1) < 0.55
