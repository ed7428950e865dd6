"""The augmentation presets and their composition in the step: nnU-Net's defaults, mirroring switchable per axis."""

import dataclasses
import itertools

import jax
import numpy as np

from trainer.augment.keys import row_keys
from trainer.augment import recipe


def test_presets_are_nnunets_set_and_its_parts():
    full = recipe.preset("nnunet")
    assert (full.rotation_probability, full.rotation_degrees, full.scale_probability, full.scale) == (0.2, 30, 0.2,
                                                                                                      (0.7, 1.4))
    assert (full.noise_probability, full.blur_probability, full.brightness_probability, full.contrast_probability,
            full.low_resolution_probability, full.inverted_gamma_probability, full.gamma_probability) == (
        0.1, 0.2, 0.15, 0.15, 0.25, 0.1, 0.3)
    flips, intensity, none = recipe.preset("flips"), recipe.preset("intensity"), recipe.preset("none")
    assert flips == dataclasses.replace(none, mirror_axes=(0, 1, 2))
    assert intensity.mirror_axes == () and intensity.rotation_probability == intensity.scale_probability == 0
    assert intensity.noise_probability == 0.1 and intensity.gamma_probability == 0.3


def test_mirroring_leaves_out_the_axes_it_is_told_to():
    """A model that must tell left from right keeps the last axis as it is: over 64 rows every flip of depth and
    height turns up, and no row is flipped left-right."""
    rng = np.random.default_rng(0)
    volume = rng.normal(size=(4, 4, 4)).astype(np.float32)
    images = np.broadcast_to(volume[None, ..., None], (64, 4, 4, 4, 1))
    labels = np.zeros((64, 4, 4, 4), np.int32)
    config = dataclasses.replace(recipe.preset("flips"), mirror_axes=(0, 1))
    out, _ = jax.jit(lambda x, y, k: recipe.compose(config, x, y, k, num_classes=2))(images, labels,
                                                                                       row_keys(0, 1, 64))
    flips = {axes: np.flip(volume, axes) if axes else volume
             for n in range(4) for axes in itertools.combinations((0, 1, 2), n)}
    found = [next(axes for axes, flipped in flips.items() if np.array_equal(np.asarray(row[..., 0]), flipped))
             for row in out]
    assert set(found) == {(), (0,), (1,), (0, 1)}


def test_none_leaves_the_batch_as_it_is():
    images = np.random.default_rng(1).normal(size=(2, 8, 8, 8, 1)).astype(np.float32)
    labels = np.ones((2, 8, 8, 8), np.int32)
    out, out_labels = recipe.compose(recipe.preset("none"), images, labels, row_keys(0, 0, 2), num_classes=2)
    np.testing.assert_array_equal(out, images)
    np.testing.assert_array_equal(out_labels, labels)
