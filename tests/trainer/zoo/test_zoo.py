"""The zoo of public segmentation networks, ported to Keras 3 from their published configurations (one file each,
beside this one), split in space through the public API (`fullres.SpatialParallel`): one training step equals the
one-device step (loss and every weight's gradient within the 1e-5 of test_parity.py) and its compiled program
all-gathers no activation. In float64 here, every value of the step (step.run's docstring: float32's rounding at
a ReLU's kink can flip one voxel's derivative, by chance of the weights and the compile; benchmarks/partitioning/zoo.py
measures both). Split 2×2 here, at a test size of each network's own structure; 2-way, 4-way and 2×2 at the
networks' `tiny` sizes, and memory at 128³, are `benchmarks/partitioning/zoo.py`'s (docs/zoo.md).
"""

import keras
import numpy as np
import pytest

from tests.trainer.parallel.test_parity import TOLERANCE
from tests.trainer.zoo import mednext, monai_unet, nnunet_plain, nnunet_resenc, segresnet, step, swin_unetr
from trainer.models import user_model

# Each network at a test size: its own layer kinds and structure, fewer levels and blocks, so that the coarsest
# level still holds 2 voxels a device along each split axis (at 1, XLA's partitioner miscomputes a convolution's
# gradient on a 2×2 mesh: docs/zoo.md).
NETWORKS = {
    "nnunet_plain": (lambda **kw: nnunet_plain.plain_conv_unet(
        **kw, features=(4, 8, 8), strides=(1, 2, 2), convs_per_stage=2, convs_per_decoder_stage=2), (16, 16, 8)),
    "nnunet_resenc": (lambda **kw: nnunet_resenc.residual_encoder_unet(
        **kw, features=(4, 8, 8), strides=(1, 2, 2), blocks=(1, 2, 2), convs_per_decoder_stage=1), (16, 16, 8)),
    "monai_unet": (lambda **kw: monai_unet.unet(**kw, channels=(4, 8, 8), strides=(2, 2), num_res_units=2),
                   (16, 16, 8)),
    "segresnet": (lambda **kw: segresnet.segresnet(**kw, init_filters=4, groups=4, blocks_down=(1, 2, 2),
                                                    blocks_up=(1, 1)), (16, 16, 8)),
    "mednext": (lambda **kw: mednext.mednext(**kw, channels=4, levels=2, expansion=2, blocks=1, kernel=3),
                (16, 16, 8)),
    "swin_unetr": (lambda **kw: swin_unetr.swin_unetr(**kw, feature_size=12, depths=(2, 2), num_heads=(2, 4),
                                                       window=2), (32, 32, 8)),
}
MODULES = (nnunet_plain, nnunet_resenc, monai_unet, segresnet, mednext, swin_unetr)


def _normalized(num_classes, in_channels):
    """conv → GroupNorm → LayerNorm → conv: the two Keras normalizations that compute through
    `keras.backend.result_type` (step.precision's docstring)."""
    inputs = keras.Input((None, None, None, in_channels))
    x = keras.layers.Conv3D(4, 3, padding="same")(inputs)
    x = keras.layers.GroupNormalization(groups=2)(x)
    x = keras.layers.LayerNormalization()(x)
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 1)(x))


def test_the_float64_step_computes_in_float64_throughout():
    """step.run's "float64" holds no float32 value: Keras's promotion no longer turns the normalizations' and the
    loss's statistics into float32 (3,471 f32 values in MONAI's UNet's step, and a float32 loss difference of
    3.6e-7, before), so the split's loss equals one device's to float64 rounding."""
    images, labels = step.example((8, 8, 4))
    reference = step.run(_normalized, (1, 1, 1, 1, 1), images, labels, dtype="float64")
    split = step.run(_normalized, step.SPLITS["2"], images, labels, dtype="float64")
    assert (reference.float32_values, split.float32_values) == (0, 0)
    assert {g.dtype for g in split.gradients} == {np.dtype("float64")}
    assert abs(split.loss - reference.loss) / abs(reference.loss) <= 1e-12
    assert keras.config.floatx() == "float32" and keras.backend.result_type("float64", "float32") == "float32"


@pytest.mark.slow  # the shape-only traces at fullres's 256³ probe take 2-22 s a network on this shared machine
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_zoo_file_keeps_fullres_model_contract(module):
    """`fullres train --model FILE.py:tiny` takes it: one input, logits of num_classes at the input's resolution,
    halving each axis 3 times (measured from the traced forward pass, as fullres does)."""
    config = user_model.UserModelConfig(file=module.__file__, function="tiny", num_classes=4, in_channels=2)
    user_model.check(user_model.build(config), config)
    assert config.downsampling_levels == (3, 3, 3)


# The suite trains three of the six split 2×2 (14-31 s each without the compilation cache, 2026-11-27): nnU-Net's
# PlainConvUNet (Conv3DTranspose k2 s2, InstanceNorm), MedNeXt (depthwise k3, LayerNorm-like GroupNorm, transposed
# upsampling) and MONAI's UNet (Conv3DTranspose k3 s2 "same", PReLU); the windows of SwinUNETR are
# test_attention.py's. All six, split 2, 4 and 2×2, in float64 and float32, are benchmarks/partitioning/zoo.py's table
# (docs/zoo.md): float64 within 1e-13 everywhere; float32's two figures over 1e-5 (ResEnc-M's 2-way, one voxel's
# LeakyReLU kink; MONAI's UNet 4-way, its PReLU slope's near-cancelling sum) are said there, not hidden by a
# looser tolerance.
IN_THE_SUITE = ("nnunet_plain", "mednext", "monai_unet")


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_THE_SUITE)
def test_a_zoo_network_split_2x2_trains_as_on_one_device_without_gathers(name):
    function, spatial = NETWORKS[name]
    images, labels = step.example(spatial)
    reference = step.run(function, (1, 1, 1, 1, 1), images, labels, dtype="float64")
    split = step.run(function, step.SPLITS["2x2"], images, labels, dtype="float64")
    assert split.gathered == [], [(g.layer, g.describe()) for g in split.gathered]
    assert (reference.float32_values, split.float32_values) == (0, 0)
    assert split.permutes > 0  # the split is real: the convolutions exchange halos
    assert abs(split.loss - reference.loss) / abs(reference.loss) <= TOLERANCE
    worst = step.worst_gradient(split, reference)
    assert worst <= TOLERANCE, f"largest relative gradient difference {worst:.2e}"
