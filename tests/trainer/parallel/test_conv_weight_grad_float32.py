"""`kernels.conv_weight_grad=float32` under mixed precision: a bfloat16 convolution whose weight gradient is XLA's own,
its operands cast up to float32 and its result cast back (`conv_taps.wide_weight_gradient`). Its value and the
input's gradient stay XLA's bfloat16 ones, bit for bit; the weight gradient is the float64 one of the same bfloat16
values up to bfloat16's rounding of the result (unit roundoff 2^-8) and float32's of the sum."""

import jax
import jax.numpy as jnp
import numpy as np

from trainer.parallel import conv_taps, kernels

ARGUMENTS = dict(strides=(2, 1, 1), padding=((1, 1), (1, 1), (0, 2)), dilation=(1, 1, 1))


def _gradients(function, x, w, cotangent):
    value, vjp = jax.vjp(function, x, w)
    return (value, *vjp(cotangent))


def test_the_weight_gradient_is_float64s_within_bfloat16_rounding_on_hostile_values():
    rng = np.random.default_rng(0)
    cases = {"ordinary": 1.0 * rng.normal(size=(2, 6, 6, 6, 5)),
             "large mean": 1000.0 + 4 * rng.normal(size=(2, 6, 6, 6, 5)),  # bfloat16 keeps 1000 ± 4 to 3 bits
             "large": 1e30 * rng.normal(size=(2, 6, 6, 6, 5)),
             "tiny": 1e-30 * rng.normal(size=(2, 6, 6, 6, 5))}
    w = jnp.asarray(rng.normal(size=(3, 3, 3, 5, 4)), jnp.bfloat16)
    cotangent = jnp.asarray(rng.normal(size=(2, 3, 6, 6, 4)), jnp.bfloat16)
    ours = jax.jit(lambda x, w, c: _gradients(lambda x, w: conv_taps.conv(x, w, **ARGUMENTS, method="float32"),
                                              x, w, c))
    xlas = jax.jit(lambda x, w, c: _gradients(lambda x, w: conv_taps._forward(x, w, **ARGUMENTS), x, w, c))
    for name, values in cases.items():
        x = jnp.asarray(values, jnp.bfloat16)
        value, dx, dw = ours(x, w, cotangent)
        xla_value, xla_dx, xla_dw = xlas(x, w, cotangent)
        assert dw.dtype == jnp.bfloat16 and dx.dtype == jnp.bfloat16, name
        np.testing.assert_array_equal(np.asarray(value, np.float32), np.asarray(xla_value, np.float32))
        np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(xla_dx, np.float32))
        with jax.enable_x64(True):
            wide = [np.asarray(a, np.float64) for a in (x, w, cotangent)]
            _, _, exact = xlas(*wide)
            _, _, magnitude = xlas(*map(np.abs, wide))  # Σ|x·dy| per weight
        exact, magnitude = np.asarray(exact), np.asarray(magnitude)
        bound = 2.0 ** -8 * np.abs(exact) + x.size * 2.0 ** -24 * magnitude + x.size * np.finfo(np.float32).tiny
        ours_error = np.abs(np.asarray(dw, np.float64) - exact)
        assert np.all(np.isfinite(np.asarray(dw, np.float32))) and np.all(ours_error <= bound), \
            (name, float(np.max(ours_error / bound)))


def test_only_the_weight_gradient_is_computed_in_float32():
    """The jaxpr of a bfloat16 convolution's gradients: the forward pass and the input's gradient are bfloat16
    convolutions, the weight gradient one float32 convolution of the cast operands, cast back to bfloat16."""
    x = jnp.zeros((1, 6, 6, 6, 4), jnp.bfloat16)
    w = jnp.zeros((3, 3, 3, 4, 5), jnp.bfloat16)
    with kernels.using(kernels.KernelsConfig(conv_weight_grad="float32")):
        jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: kernels._conv(x, w, 1, "same").astype(jnp.float32).sum(),
                                        (0, 1)))(x, w)
    convolutions = []

    def collect(jaxpr):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "conv_general_dilated":
                convolutions.append((tuple(str(v.aval.dtype) for v in equation.invars),
                                     equation.outvars[0].aval.shape))
            for parameter in equation.params.values():
                for inner in (parameter if isinstance(parameter, (tuple, list)) else [parameter]):
                    if hasattr(inner, "jaxpr"):
                        collect(inner.jaxpr if hasattr(inner.jaxpr, "eqns") else inner.jaxpr.jaxpr)

    collect(jaxpr.jaxpr)
    weight_gradients = [dtypes for dtypes, shape in convolutions if shape == w.shape]
    assert weight_gradients == [("float32", "float32")], convolutions
    assert all(dtypes == ("bfloat16", "bfloat16") for dtypes, shape in convolutions if shape != w.shape), \
        convolutions
    assert [v.dtype for v in jaxpr.out_avals] == [jnp.bfloat16, jnp.bfloat16]


def test_a_tpu_program_keeps_xlas_weight_gradient_and_transposed_convolutions():
    config = kernels.KernelsConfig(conv_weight_grad="float32", conv_transpose="padded", norm="fused")
    assert kernels.for_platform(config, "tpu") == kernels.KernelsConfig(norm="fused")
    assert kernels.for_platform(config, "gpu") == config and kernels.for_platform(config, "cpu") == config
    subpixel = kernels.KernelsConfig(conv_transpose="subpixel")
    assert kernels.for_platform(subpixel, "tpu") == subpixel
