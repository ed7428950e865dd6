"""`ring_attention.dot_product_attention` on its own: tokens split over a mesh, keys and values around the ring, the
output and its gradients equal to the dense formula in float64, with a causal mask, a mask and a bias; and what it
does not take stays Keras's (the zoo's test_ring_attention.py trains networks with it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tests.trainer.zoo import step
from trainer.parallel import ring_attention, split_ops


def _mesh(shape, names):
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def _inputs(tokens=16, heads=2, dim=4, batch=2):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(batch, tokens, heads, dim)) for _ in range(3))
    bias = rng.normal(size=(batch, 1, tokens, tokens))
    mask = rng.random((1, heads, tokens, tokens)) > 0.3
    return q, k, v, bias, mask


# Each compiles a ring of 4 and its gradient (3-4 s alone, 35-70 s beside other compiles): the causal one, which
# also slices the mask's and the bias's columns by the block a device holds, in the fast tier.
@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True])
def test_the_ring_equals_the_dense_formula_and_so_do_its_gradients(causal):
    mesh = _mesh((2, 2, 2), ("replica", "depth", "height"))
    with step.precision("float64"):
        q, k, v, bias, mask = _inputs()
        tokens = NamedSharding(mesh, PartitionSpec("replica", ("depth", "height")))

        def ring(q, k, v, bias):
            return jnp.sum(jnp.sin(ring_attention.dot_product_attention(mesh, q, k, v, bias, mask, 0.4, causal)))

        def dense(q, k, v, bias):
            return jnp.sum(jnp.sin(step._attention_in_float64(q, k, v, bias, mask, scale=0.4, is_causal=causal)))

        placed = [jax.device_put(x, tokens) for x in (q, k, v)]
        compiled = jax.jit(jax.value_and_grad(ring, argnums=(0, 1, 2, 3))).lower(*placed, bias).compile()
        text = compiled.as_text()
        ring_value, ring_grads = compiled(*placed, bias)
        value, grads = jax.value_and_grad(dense, argnums=(0, 1, 2, 3))(q, k, v, bias)
    assert abs(float(ring_value) - float(value)) <= 1e-12 * abs(float(value))
    for got, expected in zip(ring_grads, grads):
        assert np.linalg.norm(got - expected) <= 1e-12 * np.linalg.norm(expected)
    assert "collective-permute" in text and "all-gather" not in text


def test_what_the_ring_does_not_take_stays_keras():
    mesh = _mesh((1, 4), ("replica", "depth"))
    q = jax.ShapeDtypeStruct((1, 18, 2, 4), np.float32)  # 18 tokens do not divide by 4
    assert not ring_attention.supported(mesh, q, q, q)
    assert not ring_attention.supported(None, *(jax.ShapeDtypeStruct((1, 16, 2, 4), np.float32),) * 3)
    assert ring_attention.supported(mesh, *(jax.ShapeDtypeStruct((1, 16, 2, 4), np.float32),) * 3)
    with split_ops.splitting((1, 4, 1, 1, 1)):  # a shape-only trace: no mesh, Keras's own attention
        assert split_ops.mesh() is None
    with split_ops.splitting((1, 4, 1, 1, 1), mesh):
        assert split_ops.mesh() is mesh
