"""The sliding window of patch-trained models (predict, evaluation, the benchmarks) follows nnU-Net's."""

import numpy as np
import pytest

from trainer.engine import sliding_window


@pytest.mark.parametrize("size, patch", [(100, 32), (75, 32), (33, 32), (32, 32), (20, 32)])
def test_windows_cover_the_axis_at_most_half_a_patch_apart(size, patch):
    starts = sliding_window.window_starts(size, patch, 0.5)
    assert starts[0] == 0 and starts[-1] == max(size - patch, 0)
    assert all(0 < b - a <= patch // 2 for a, b in zip(starts, starts[1:]))


def test_gaussian_peaks_at_the_centre_and_has_no_zeros():
    weights = sliding_window.gaussian_weights((16, 24, 8))
    assert weights.shape == (16, 24, 8) and weights[8, 12, 4] == 1.0 and weights.max() == 1.0
    assert weights.min() > 0 and weights[0, 0, 0] < weights[8, 12, 0] < weights[8, 12, 4]


def test_a_voxelwise_model_is_reproduced_exactly_on_every_voxel():
    # Blending can only change outputs that differ between patches: a per-voxel function must come back unchanged,
    # on an odd-sized volume whose patches overlap unevenly, and on one smaller than a patch (padded).
    rng = np.random.default_rng(0)
    for shape in [(45, 37, 29, 1), (10, 40, 20, 1)]:
        volume = rng.normal(size=shape).astype(np.float32)
        calls = []

        def forward(patches, calls=calls):
            calls.append(patches.shape)
            return np.concatenate([np.tanh(patches), patches ** 2], axis=-1)

        blended, count = sliding_window.predict(volume, (16, 16, 16), forward, batch_size=4)
        np.testing.assert_allclose(blended, np.concatenate([np.tanh(volume), volume ** 2], axis=-1), rtol=1e-5,
                                   atol=1e-6)
        assert count == np.prod([len(sliding_window.window_starts(max(s, 16), 16, 0.5)) for s in shape[:3]])
        assert all(c[1:4] == (16, 16, 16) and c[0] <= 4 for c in calls)


def test_patch_outputs_are_weighted_towards_their_centres():
    # A model that answers each patch with a constant (its patch index): where two patches overlap, the blend
    # leans to the patch whose centre is nearer, as nnU-Net's Gaussian weighting does.
    volume = np.zeros((8, 8, 48, 1), np.float32)
    order = iter(range(100))
    blended, count = sliding_window.predict(
        volume, (8, 8, 32), lambda p: np.full((*p.shape[:4], 1), float(next(order)), np.float32))
    assert count == 2  # starts 0 and 16 along the last axis
    row = blended[4, 4, :, 0]
    assert row[0] == 0.0 and row[-1] == 1.0 and row[20] < 0.5 < row[27]
    assert np.all(np.diff(row[16:32]) > 0)


def test_the_gaussian_has_sigma_an_eighth_of_the_patch_along_each_axis():
    patch = (32, 64, 16)
    weights = sliding_window.gaussian_weights(patch)
    for axis, size in enumerate(patch):
        centre = [p // 2 for p in patch]
        sigma = size / 8
        for offset in (1, 2, 3):  # exp(-d²/2σ²) of the peak, d in voxels, along this axis alone
            at = list(centre)
            at[axis] += int(round(offset * sigma))
            expected = np.exp(-((int(round(offset * sigma))) ** 2) / (2 * sigma**2))
            assert weights[tuple(at)] == pytest.approx(expected, rel=0.02, abs=1e-4), (axis, offset)
