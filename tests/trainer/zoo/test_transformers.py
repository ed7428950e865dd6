"""The transformers that ring attention unlocks, ported from their published configurations: MONAI's
UNETR (a ViT on 16³ patches, global attention over all the volume's tokens, its convolutional decoder) split along
depth, and TimeSformer's divided space-time attention on a clip split over time (its attention over time a ring,
over space each device's own). Each split step gathers no activation and equals the one-device step to float64
rounding (≤ 1e-12). UNETR 4-way and 2×2 are docs/zoo.md's figures (measured, not in the suite: 2-4 minutes each on
the shared machine)."""

import pytest

from tests.trainer.zoo import step, timesformer, unetr

pytestmark = pytest.mark.slow  # a small transformer's step compiled twice (20-90 s on the shared machine)


@pytest.mark.parametrize("network, size", [(unetr.tiny, (64, 32, 32)), (timesformer.tiny, (8, 16, 16))],
                         ids=["unetr", "timesformer"])
def test_split_two_ways_gathers_nothing_and_equals_one_device(network, size):
    def build(num_classes, in_channels):
        return network(num_classes=num_classes, in_channels=in_channels)

    images, labels = step.example(size)
    split = step.run(build, step.SPLITS["2"], images, labels, dtype="float64")
    reference = step.run(build, (1,) * 5, images, labels, dtype="float64")
    assert split.gathered == [], [(g.layer, g.describe()) for g in split.gathered]
    assert split.permutes > 0  # keys and values around the ring
    assert abs(split.loss - reference.loss) / abs(reference.loss) <= 1e-12
    assert step.worst_gradient(split, reference) <= 1e-12
