"""Networks written here, not in trainer/models/, trained through the public API (`fullres.SpatialParallel` and
Keras's own `model.train_on_batch`) split 2, 4 and 2×2 ways, equal the one-device step: loss and gradients within
the 1e-5 tolerance of test_parity.py, and the split is real (the logits are split in space inside the step).

The gradients are read off an SGD step with a learning rate of 2^20: `w1 = w0 - 2^20·g` is exact up to one
rounding of w1, so `(w0 - w1) / 2^20` is g to about 1e-7 relative wherever 2^20·|g| is well above |w0| (and
contributes nothing to the norm elsewhere), far inside the tolerance.
"""

import math

import jax
import keras
import numpy as np
import pytest

import fullres
from tests.trainer import user_networks
from tests.trainer.parallel.test_parity import TOLERANCE, _relative

pytestmark = pytest.mark.slow  # compiles each network's training step four times

LEARNING_RATE = 2.0**20
SPLITS = {3: [(1, 2, 1, 1, 1), (1, 4, 1, 1, 1), (1, 2, 2, 1, 1)], 2: [(1, 2, 1, 1), (1, 4, 1, 1), (1, 2, 2, 1)]}
NETWORKS = {  # function, one example's spatial size
    "residual_groupnorm": (user_networks.residual_groupnorm, (32, 16, 16)),
    "transposed_upsampling": (user_networks.transposed_upsampling, (32, 16, 16)),
    "hub_backbone": (user_networks.hub_backbone, (64, 64)),
}


class ShardingProbe(keras.layers.Layer):
    """Records how the logits lie on the mesh inside the compiled step (`jax.debug.inspect_array_sharding`)."""

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self.record = record  # a function: Keras would copy a list given to a layer into one of its own

    def call(self, x):
        jax.debug.inspect_array_sharding(x, callback=self.record)
        return x


def _one_step(function, dims, images, labels):
    """(loss, gradients, the logits' sharding) of one `train_on_batch` under `fullres.SpatialParallel(dims)`."""
    seen = []
    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(fullres.SpatialParallel(dims, devices=jax.devices()[:math.prod(dims)]))
    try:
        network = function(num_classes=3, in_channels=1)
        model = keras.Sequential([network, ShardingProbe(seen.append)])
        before = [np.asarray(v.value) for v in network.trainable_variables]
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        loss = float(model.train_on_batch(images, labels))
        gradients = [(b - np.asarray(v.value)) / LEARNING_RATE for b, v in zip(before, network.trainable_variables)]
    finally:
        keras.distribution.set_distribution(None)
    return loss, gradients, seen


@pytest.fixture(scope="module", params=sorted(NETWORKS))
def reference(request):
    function, spatial = NETWORKS[request.param]
    rng = np.random.default_rng(0)
    images = rng.normal(size=(1, *spatial, 1)).astype(np.float32)  # (1, [D,] H, W, 1)
    labels = rng.integers(0, 3, size=(1, *spatial)).astype(np.int32)  # (1, [D,] H, W)
    loss, gradients, _ = _one_step(function, (1,) * (len(spatial) + 2), images, labels)
    return function, images, labels, loss, gradients


@pytest.mark.parametrize("split", [0, 1, 2], ids=["2", "4", "2x2"])
def test_a_users_network_split_through_the_public_api_matches_one_device(reference, split):
    function, images, labels, reference_loss, reference_gradients = reference
    dims = SPLITS[images.ndim - 2][split]
    loss, gradients, seen = _one_step(function, dims, images, labels)
    assert abs(loss - reference_loss) / abs(reference_loss) <= TOLERANCE
    assert all(np.isfinite(g).all() for g in gradients) and any(np.abs(g).max() > 0 for g in gradients)
    worst = max(_relative(g, r) for g, r in zip(gradients, reference_gradients))
    assert worst <= TOLERANCE, f"largest relative gradient difference {worst:.2e}"
    # The split is real: inside the compiled step the logits lie split in space as `dims` says.
    names = ("depth", "height", "width")[-(images.ndim - 2):]
    expected = tuple(name if parts > 1 else None for name, parts in zip(names, dims[1:-1]))
    assert seen and all(tuple(s.spec[1:1 + len(expected)]) + (None,) * (len(expected) - len(s.spec[1:]))
                        == expected for s in seen), seen
