"""Every layer kind that XLA would gather, split 2 ways and 2×2 (2×2×2 in 3D), equals the one-device step and compiles
with 0 activation all-gathers: transposed convolutions (`split_ops`, `subpixel`), interpolating upsampling
(`interpolation`) and normalizations whose statistics cover split axes.

Each case is a tiny network (a convolution, the layer, a 1×1 convolution), its loss a mean squared error against a
random target, so that the gradient reaches through the layer to the first convolution. The reference is plain
Keras on one device; the split step is traced as fullres traces every step (`split_ops.traced_split`). The
gradients are compared per tensor, relative norm ≤ 1e-5 (test_parity.py's bar).
"""

import functools
import math

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from tests.trainer.parallel.test_parity import TOLERANCE, _relative
from trainer.engine import placement, program, step
from trainer.parallel import device_mesh, partitioning, split_ops
from trainer.plan import gathers

pytestmark = pytest.mark.slow  # each case compiles its step once per split

# 2-way along the first axis, along the others (2×2 in 3D), and along every axis (2×2, 2×2×2).
# 2 ways along the first spatial axis, 2×2, and in 3D 2×2×2.
SPLITS = {2: [(1, 2, 1, 1), (1, 2, 2, 1)], 3: [(1, 2, 1, 1, 1), (1, 2, 2, 1, 1), (1, 2, 2, 2, 1)]}
SIZE = 8  # voxels per spatial axis of the input (the output sizes in LAYERS are from it)


@keras.saving.register_keras_serializable(package="tests")
class Resize(keras.layers.Layer):
    """`jax.image.resize` by an integer factor per spatial axis (what a 3D user writes for trilinear upsampling:
    Keras's own resize and UpSampling3D are 2D or nearest only)."""

    def __init__(self, factor, method, **kwargs):
        super().__init__(**kwargs)
        self.factor, self.method = factor, method

    def call(self, x):
        size = (x.shape[0], *(n * self.factor for n in x.shape[1:-1]), x.shape[-1])
        return jax.image.resize(x, size, self.method)


class OpsConvTranspose(keras.layers.Layer):
    """`keras.ops.conv_transpose` with a kernel of its own (kernel 3, stride 2, "same"), as a custom layer calls it."""

    def build(self, input_shape):
        d = len(input_shape) - 2
        self.kernel = self.add_weight(shape=(3,) * d + (4, input_shape[-1]), initializer="glorot_uniform")

    def call(self, x):
        return keras.ops.conv_transpose(x, self.kernel, 2, padding="same")


def _conv(d, *args, **kwargs):
    return (keras.layers.Conv3D if d == 3 else keras.layers.Conv2D)(*args, **kwargs)


def _transposed(d, *args, **kwargs):
    return (keras.layers.Conv3DTranspose if d == 3 else keras.layers.Conv2DTranspose)(*args, **kwargs)


def _cropping(d, cropping):
    return (keras.layers.Cropping3D if d == 3 else keras.layers.Cropping2D)((cropping,) * d)


def _zero_padding(d, padding):
    return (keras.layers.ZeroPadding3D if d == 3 else keras.layers.ZeroPadding2D)((padding,) * d)


def _uneven_transposed(d, *more, **kwargs):
    """An output that is not stride × the input (e.g. "valid", kernel 3, stride 2: 2n + 1), and what follows it in
    the ported networks that use it (`more`: a crop to the skip's size, MedNeXt's crop and pad)."""
    return keras.Sequential([_transposed(d, 4, kwargs.pop("kernel", 3), strides=2, **kwargs),
                             *(layer(d) for layer in more)])


LAYERS = {  # name -> (function of spatial_dims that makes the layer, its output size along each axis from SIZE)
    "conv_transpose_k2_s2": (lambda d: _transposed(d, 4, 2, strides=2), 16),
    "conv_transpose_k3_s2_same": (lambda d: _transposed(d, 4, 3, strides=2, padding="same"), 16),
    "conv_transpose_k4_s2_same": (lambda d: _transposed(d, 4, 4, strides=2, padding="same"), 16),
    "conv_transpose_k3_s2_same_output_padding": (
        lambda d: _transposed(d, 4, 3, strides=2, padding="same", output_padding=1), 16),
    # 2n + 1 cropped to the skip's 2n (PyTorch UNets' center-or-corner crop)
    "conv_transpose_k3_s2_valid_cropped": (lambda d: _uneven_transposed(d, lambda d: _cropping(d, (0, 1))), 16),
    # the uneven 2n + 1 through a convolution and a GroupNorm (split unevenly, as XLA pads it) before the crop
    "conv_transpose_k3_s2_valid_conv_norm_cropped": (lambda d: _uneven_transposed(
        d, lambda d: _conv(d, 4, 3, padding="same"), lambda d: keras.layers.GroupNormalization(groups=2),
        lambda d: _cropping(d, (0, 1))), 16),
    # MedNeXt's up block: PyTorch's padding 1 (2n − 1: Keras's 2n + 1 cropped 1 each side), then F.pad (1, 0)
    "conv_transpose_k3_s2_valid_mednext": (lambda d: _uneven_transposed(
        d, lambda d: _cropping(d, (1, 1)), lambda d: _zero_padding(d, (1, 0))), 16),
    # 2n + 2: n + 1 phases, which split unevenly
    "conv_transpose_k3_s2_valid_output_padding": (lambda d: _uneven_transposed(d, output_padding=1), 18),
    # 2n − 2: n − 1 phases
    "conv_transpose_k4_s2_same_output_padding_0": (
        lambda d: _uneven_transposed(d, kernel=4, padding="same", output_padding=0), 14),
    "conv_transpose_k3_s1_same": (lambda d: _transposed(d, 4, 3, padding="same"), 8),
    "ops_conv_transpose": (lambda d: OpsConvTranspose(), 16),
    "upsampling2d_bilinear_2": (lambda d: keras.layers.UpSampling2D(2, interpolation="bilinear"), 16),
    "upsampling2d_bilinear_4": (lambda d: keras.layers.UpSampling2D(4, interpolation="bilinear"), 32),
    "upsampling2d_bilinear_8": (lambda d: keras.layers.UpSampling2D(8, interpolation="bilinear"), 64),
    "ops_image_resize_bilinear": (lambda d: keras.layers.Lambda(
        lambda x: keras.ops.image.resize(x, (2 * x.shape[1], 2 * x.shape[2]), interpolation="bilinear")), 16),
    "resize_trilinear_2": (lambda d: Resize(2, "trilinear"), 16),
    "resize_nearest_2": (lambda d: Resize(2, "nearest"), 16),
    "batch_normalization": (lambda d: keras.layers.BatchNormalization(), 8),
    "group_normalization": (lambda d: keras.layers.GroupNormalization(groups=2), 8),
    "instance_normalization": (lambda d: keras.layers.GroupNormalization(groups=-1), 8),
    "layer_normalization_channels": (lambda d: keras.layers.LayerNormalization(), 8),
    "layer_normalization_all_axes": (lambda d: keras.layers.LayerNormalization(axis=list(range(1, d + 2))), 8),
}
TWO_D_ONLY = {"upsampling2d_bilinear_2", "upsampling2d_bilinear_4", "upsampling2d_bilinear_8",
              "ops_image_resize_bilinear"}
CASES = [(name, d) for name in LAYERS for d in (2, 3) if d == 2 or name not in TWO_D_ONLY]


def _network(name, d):
    keras.utils.set_random_seed(0)
    make, _ = LAYERS[name]
    inputs = keras.Input((SIZE,) * d + (2,))
    # No bias: before a normalization that removes each channel's mean its gradient is 0 up to rounding noise,
    # which no relative bar can compare.
    x = _conv(d, 4, 3, padding="same", use_bias=False)(inputs)
    x = make(d)(x)
    return keras.Model(inputs, _conv(d, 3, 1)(x))


def _mean_squared(outputs, targets):
    return jnp.mean(jnp.square(outputs - targets))


def _batch(name, d):
    _, size = LAYERS[name]
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, *(SIZE,) * d, 2)).astype(np.float32)
    targets = rng.normal(size=(2, *(size,) * d, 3)).astype(np.float32)
    return images, targets


def split_step(model, state, dims, images, targets):
    """(loss, gradients, activation all-gathers) of one compiled loss-and-gradient step split as `dims`."""
    cores = math.prod(dims)
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims), jax.devices()[:cores])
    placed = placement.place_state(state, distribution)
    layout = distribution.get_data_layout(images.shape).backend_layout
    images, targets = jax.device_put(images, layout), jax.device_put(targets, layout)
    function = jax.jit(split_ops.traced_split(step.make_loss_and_grads(model, _mean_squared), dims),
                       in_shardings=(placement.state_shardings(placed, distribution), layout, layout))
    lowered = function.lower(placed, images, targets)
    compiled = lowered.compile()
    found = gathers.of_step(lowered, compiled, replica_batch=images.shape[0], weight_shapes=gathers.weight_shapes(state))
    loss, grads, _ = compiled(placed, images, targets)
    return float(loss), [np.asarray(g) for g in grads], found


@functools.cache
def _reference(name, d):
    """The network, its weights, a batch, and plain Keras's one-device loss and gradients (once per case)."""
    model = _network(name, d)
    state = program.initial_state(model, keras.optimizers.SGD(0.1))
    images, targets = _batch(name, d)
    loss, grads, _ = jax.jit(step.make_loss_and_grads(model, _mean_squared))(state, images, targets)
    return model, state, images, targets, float(loss), [np.asarray(g) for g in grads]


SPLIT_CASES = [(name, d, dims) for name, d in CASES for dims in SPLITS[d]]


@pytest.mark.parametrize("name, d, dims", SPLIT_CASES,
                         ids=[f"{name}-{d}d-{'x'.join(str(p) for p in dims if p > 1)}" for name, d, dims in SPLIT_CASES])
def test_layer_splits_exactly_without_gathers(name, d, dims):
    model, state, images, targets, reference_loss, reference_grads = _reference(name, d)
    loss, grads, found = split_step(model, state, dims, images, targets)
    assert found == [], gathers.summary(found)
    assert abs(loss - reference_loss) / abs(reference_loss) <= TOLERANCE
    worst = max(_relative(g, r) for g, r in zip(grads, reference_grads) if np.linalg.norm(r) > 0)
    assert worst <= TOLERANCE, f"largest relative gradient difference {worst:.2e}"

def test_bilinear_upsampling_from_one_eighth_resolution_split_4_ways():
    """KerasHub's ResNet at 64² upsampled ×8 bilinear (tests/trainer/user_networks.py:hub_backbone), split 1,4,1,1: XLA
    gathered the 8-row input of the upsampling (4 KiB); computed as a stencil, it is exact without gathers."""
    from tests.trainer import user_networks

    keras.utils.set_random_seed(0)
    model = user_networks.hub_backbone(num_classes=3, in_channels=1)
    state = program.initial_state(model, keras.optimizers.SGD(0.1))
    rng = np.random.default_rng(0)
    images = rng.normal(size=(1, 64, 64, 1)).astype(np.float32)
    targets = rng.normal(size=(1, 64, 64, 3)).astype(np.float32)
    reference_loss, reference_grads, _ = jax.jit(step.make_loss_and_grads(model, _mean_squared))(state, images, targets)
    loss, grads, found = split_step(model, state, (1, 4, 1, 1), images, targets)
    assert found == [], gathers.summary(found)
    assert abs(loss - float(reference_loss)) / abs(float(reference_loss)) <= TOLERANCE
    assert max(_relative(g, np.asarray(r)) for g, r in zip(grads, reference_grads) if np.linalg.norm(r) > 0) \
        <= TOLERANCE
