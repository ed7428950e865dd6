"""A measured kernel choice (`kernels.choose=measure`) computes what the fixed kernels compute: a per-layer choice over
the network of every op the candidates replace (`tests/trainer/kernel_network.py`), some layers of each kind on a
candidate and the others on XLA's, gives the loss and every gradient of `fixed` within 1e-12 in float64, on one device
and split 2×2 (0 activation all-gathers), and each layer ran the value the choice gave its signature."""

import functools
from unittest import mock

import pytest

from tests.trainer import kernel_network
from tests.trainer.zoo import step
from trainer.parallel import conv_taps, fused_norm, kernels

SPLITS = {"one device": (1, 1, 1, 1), "split 2x2": (1, 2, 2, 1)}


def _run(dims, layers=None):
    images, labels = step.example((8, 8), seed=2)
    with kernels.using(kernels.KernelsConfig(), layers):
        return step.run(functools.partial(kernel_network.network, 2), dims, images, labels, dtype="float64")


# Two float64 compiles of a 9-layer network, 4-5 s each on the loaded machine: split 2×2 (signatures with a split) in
# the fast tier, one device in the slow one.
@pytest.mark.parametrize("split", [pytest.param("one device", marks=pytest.mark.slow), "split 2x2"])
def test_a_per_layer_choice_equals_the_fixed_kernels_in_float64(split):
    with kernels.recording() as found:
        reference = _run(SPLITS[split])
    assert reference.gathered == [] and reference.float32_values == 0
    signatures = {}
    for _, signature in found:
        signatures.setdefault(signature.kind, {})[signature.key] = signature
    assert {kind: len(keys) >= 2 for kind, keys in signatures.items()} == {
        "convolution": True, "normalization": True, "transposed convolution": True}
    # The first signature of each kind on its candidate, the others on XLA's: the lookup is per layer.
    candidate = {"convolution": "taps", "normalization": "fused", "transposed convolution": "subpixel"}
    table = {next(iter(keys)): candidate[kind] for kind, keys in signatures.items()}
    chosen = [signature for _, signature in found if signature.key in table]
    with mock.patch.object(conv_taps, "weight_gradient", wraps=conv_taps.weight_gradient) as taps, \
            mock.patch.object(fused_norm, "_statistics", wraps=fused_norm._statistics) as statistics:
        ours = _run(SPLITS[split], table)
    convolutions = sum(1 for signature in chosen if signature.kind == "convolution")
    assert taps.call_count == convolutions >= 1
    assert statistics.call_count >= 1  # only the chosen normalization's statistics are one-pass
    assert ours.gathered == [] and ours.float32_values == 0
    assert abs(ours.loss - reference.loss) <= 1e-12 * abs(reference.loss)
    assert step.worst_gradient(ours, reference) <= 1e-12
