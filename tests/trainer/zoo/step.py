"""One training step of a zoo network (loss and gradients of softmax cross-entropy, Keras's `stateless_call`), jitted
under `fullres.SpatialParallel`, compiled ahead of time and run: its loss, its gradients and the activation
all-gathers of its compiled HLO (`trainer/plan/gathers.py`, the check `fullres train` makes before its first step).
"""

import contextlib
import dataclasses
import math
from unittest import mock

import jax
import keras
import numpy as np
from keras.src.backend.common import dtypes as keras_dtypes
from keras.src.backend.common import global_state

import fullres
from trainer.plan import gathers

SPLITS = {"2": (1, 2, 1, 1, 1), "4": (1, 4, 1, 1, 1), "2x2": (1, 2, 2, 1, 1)}


@dataclasses.dataclass
class Step:
    loss: float
    gradients: list
    gathered: list  # gathers.Gather, one per activation all-gather in the compiled step
    permutes: int  # collective-permutes (halo exchanges) in the compiled step
    all_to_alls: int  # all-to-alls (a split moved to another axis) in the compiled step
    float32_values: int  # f32 values in the compiled step (0 in a float64 step)


def example(spatial, seed: int = 0):
    """A random (1, D, H, W, 1) volume and its (1, D, H, W) labels of 3 classes."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(1, *spatial, 1)).astype(np.float32),
            rng.integers(0, 3, size=(1, *spatial)).astype(np.int32))


@contextlib.contextmanager
def precision(dtype: str):
    """Keras and JAX in `dtype` for the block: floatx, JAX's x64 and, for "float64", Keras's type promotion.

    Keras's `backend.result_type` on JAX turns every float64 it returns into float32 (keras 3.15,
    `keras/src/backend/common/dtypes.py:BIT64_TO_BIT32_DTYPE`, whatever JAX's x64 says; keras-team/keras#21604
    leaves "a flag to enable 64-bit dtypes" as a TODO). `GroupNormalization` (the zoo's InstanceNorm),
    `LayerNormalization` and `keras.ops.mean` (the loss) compute "in at least float32" as
    `result_type(x.dtype, "float32")`, so they cast float64 down to float32 and back: without this, the "float64"
    step's statistics and loss were float32. For "float64" the table maps float64 to itself for the block only
    (float32 and mixed precision stay Keras's own). JAX's `jax.nn.dot_product_attention` (Keras's
    `dot_product_attention` and `MultiHeadAttention` on one device) casts its logits to float32 for the softmax
    whatever the dtype (`jax/_src/nn/functions.py`, `_dot_product_attention_core`), so for "float64" it is the same
    formula with the softmax in float64 (`_attention_in_float64`).
    """
    floatx, x64 = keras.config.floatx(), jax.config.jax_enable_x64
    # The global dtype policy too: Keras pins it to floatx's the first time any layer is built in the process
    # (`keras.config.dtype_policy()` sets what it returns), so floatx alone built float32 layers after any other
    # test had built one.
    policy = global_state.get_global_attribute("dtype_policy", None)
    promotion = {"float64": "float64"} if dtype == "float64" else {}
    jax.config.update("jax_enable_x64", dtype == "float64")
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    attention = _attention_in_float64 if dtype == "float64" else jax.nn.dot_product_attention
    try:
        with mock.patch.dict(keras_dtypes.BIT64_TO_BIT32_DTYPE, promotion), \
                mock.patch.object(jax.nn, "dot_product_attention", attention):
            yield
    finally:
        keras.config.set_floatx(floatx)
        global_state.set_global_attribute("dtype_policy", policy)
        jax.config.update("jax_enable_x64", x64)


def _attention_in_float64(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          implementation=None, **unused):
    """`jax.nn.dot_product_attention`'s XLA formula (B, T, N, H), its softmax in the inputs' dtype."""
    import jax.numpy as jnp

    logits = jnp.einsum("BTNH,BSNH->BNTS", query, key) * (scale if scale is not None else query.shape[-1] ** -0.5)
    if bias is not None:
        logits = logits + bias
    keep = jnp.ones(logits.shape, bool) if mask is None else jnp.broadcast_to(mask, logits.shape)
    if is_causal:
        keep = keep & jnp.tril(jnp.ones(logits.shape[-2:], bool))
    logits = jnp.where(keep, logits, -0.7 * jnp.finfo(logits.dtype).max)
    return jnp.einsum("BNTS,BSNH->BTNH", jax.nn.softmax(logits, axis=-1), value)


def run(function, dims, images, labels, dtype: str = "float32") -> Step:
    """The step of `function(num_classes=3, in_channels=1)` split as `dims`, on the first prod(dims) devices.

    `dtype="float64"` builds and runs the network in double precision (JAX's x64 on for the call): a ReLU's kink
    then no longer turns a float32 rounding difference into a different derivative (a pre-activation of −6e-8 on
    one device and +6e-8 split), so what differs is the split's doing alone. Every value of that step is float64
    (`precision`; tests/trainer/zoo/test_zoo.py checks its jaxpr).
    """
    return run_each(function, dims, [images], labels, dtype)[0]


def run_each(function, dims, batches, labels, dtype: str = "float32") -> list[Step]:
    """`run`'s step, compiled once and run on each of `batches` (images of one shape, the same labels)."""
    keras.utils.set_random_seed(0)
    distribution = fullres.SpatialParallel(dims, label_partition_dims=dims, devices=jax.devices()[:math.prod(dims)])
    with precision(dtype):
        keras.distribution.set_distribution(distribution)
        try:
            model = function(num_classes=3, in_channels=1)
            trainable = [v.value for v in model.trainable_variables]
            non_trainable = [v.value for v in model.non_trainable_variables]

            def loss_of(trainable, non_trainable, x, y):
                logits, _ = model.stateless_call(trainable, non_trainable, x, training=True)
                return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

            layout = distribution.get_data_layout(batches[0].shape).backend_layout
            y = jax.device_put(labels, distribution.get_label_layout(labels.shape).backend_layout)
            x = jax.device_put(batches[0].astype(dtype), layout)
            compiled = jax.jit(jax.value_and_grad(loss_of)).lower(trainable, non_trainable, x, y).compile()
            text = compiled.as_text()
            results = [compiled(trainable, non_trainable, jax.device_put(images.astype(dtype), layout), y)
                       for images in batches]
        finally:
            keras.distribution.set_distribution(None)
    weights = {tuple(v.shape) for v in model.weights}
    gathered = gathers.activation_gathers(text, 1, weights)
    return [Step(float(loss), [np.asarray(g) for g in grads], gathered, text.count("collective-permute("),
                 text.count("all-to-all("), text.count("f32[")) for loss, grads in results]


def relative(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def worst_gradient(step: Step, reference: Step) -> float:
    """The largest relative difference over the weights' gradients (each against its own norm).

    A gradient that is 0 in exact arithmetic (a conv's bias before an InstanceNorm, which subtracts it away: below
    1e-6 of the largest) is rounding noise on both sides, and noise over noise is no parity figure; those count as
    their difference over the largest gradient's norm instead.
    """
    largest = max(float(np.linalg.norm(r)) for r in reference.gradients)
    worst = 0.0
    for g, r in zip(step.gradients, reference.gradients):
        norm = float(np.linalg.norm(r))
        worst = max(worst, float(np.linalg.norm(g - r)) / (norm if norm >= 1e-6 * largest else largest))
    return worst
