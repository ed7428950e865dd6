"""Every device augmentation gives the same batch split 2, 4 and 2×2 ways as on one device, without an all-gather.

One program per split computes each augmentation (every one drawn for every row) side by side from the same
batch, so the 8 of them cost 4 compilations. The bar is test_parity.py's: ||split − one device|| / ||one device||
≤ 1e-5 per augmentation; labels equal.
"""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.augment.keys import row_keys
from trainer.augment import intensity, spatial
from trainer.plan import compiled_step

pytestmark = pytest.mark.slow  # 4 compilations of the 8 augmentations

TOLERANCE = 1e-5
ALWAYS = {"probability": 1.0}
AUGMENTATIONS = {
    "gaussian_noise": functools.partial(intensity.gaussian_noise, **ALWAYS),
    "gaussian_blur": functools.partial(intensity.gaussian_blur, probability_per_channel=1.0, **ALWAYS),
    "brightness": functools.partial(intensity.brightness, **ALWAYS),
    "contrast": functools.partial(intensity.contrast, **ALWAYS),
    "low_resolution": functools.partial(intensity.low_resolution, probability_per_channel=1.0, **ALWAYS),
    "inverted_gamma": functools.partial(intensity.inverted_gamma, **ALWAYS),
    "gamma": functools.partial(intensity.gamma, **ALWAYS),
}
SHAPE = (2, 16, 16, 8)  # (B, D, H, W): 16 voxels of depth split 4 ways leave 4 per device, the blur's reach 3


def _run(dims):
    """Each augmentation's output for the batch split `dims` (replicas, depth, height), and the compiled HLO."""
    mesh = Mesh(np.array(jax.devices()[:int(np.prod(dims))]).reshape(dims), ("replica", "depth", "height"))
    image_sharding = NamedSharding(mesh, PartitionSpec("replica", "depth", "height", None, None))
    label_sharding = NamedSharding(mesh, PartitionSpec("replica", "depth", "height", None))
    rotate_and_scale = functools.partial(spatial.rotate_and_scale, num_classes=3, rotation_probability=1.0,
                                         scale_probability=1.0, image_sharding=image_sharding,
                                         label_sharding=label_sharding)

    def every(images, labels, keys):
        outputs = {name: f(images, labels, keys)[0] for name, f in AUGMENTATIONS.items()}
        outputs["rotate_and_scale"], outputs["rotated_labels"] = rotate_and_scale(images, labels, keys)
        return outputs

    rng = np.random.default_rng(0)
    images = rng.normal(size=(*SHAPE, 1)).astype(np.float32)
    labels = rng.integers(0, 3, size=SHAPE).astype(np.int32)
    keys = row_keys(0, 3, SHAPE[0])
    compiled = jax.jit(every, in_shardings=(image_sharding, label_sharding, None)).lower(images, labels, keys).compile()
    outputs = compiled(jax.device_put(images, image_sharding), jax.device_put(labels, label_sharding), keys)
    return {name: np.asarray(value) for name, value in outputs.items()}, compiled.as_text(), images


@pytest.fixture(scope="module")
def one_device():
    return _run((1, 1, 1))


@pytest.mark.parametrize("dims", [(1, 2, 1), (1, 4, 1), (1, 2, 2)], ids=["2", "4", "2x2"])
def test_each_augmentation_split_equals_one_device(one_device, dims):
    reference, _, images = one_device
    found, hlo, _ = _run(dims)
    for name, expected in reference.items():
        if name == "rotated_labels":
            np.testing.assert_array_equal(found[name], expected)
            continue
        assert not np.allclose(expected, images[..., :1], atol=1e-3), f"{name} left the batch as it was"
        difference = np.linalg.norm(found[name] - expected) / np.linalg.norm(expected)
        assert difference <= TOLERANCE, f"{name}: relative difference {difference:.2e}"
    gathers, _ = compiled_step.communication(hlo, replica_batch=SHAPE[0])
    assert gathers == [] and " all-gather(" not in hlo
    assert "collective-permute" in hlo  # the blur and the low resolution exchange halos ...
    assert compiled_step.all_to_all_bytes(hlo) > 0  # ... and rotation moves the depth split aside and back
