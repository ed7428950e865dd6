"""Every kernel candidate (`trainer/parallel/kernels.py`) on hostile values: inputs with a large mean and a tiny
spread, and float32's extremes (magnitudes near its largest, near and below its smallest normal number).

In float64, through the network of every op the candidates replace (`tests/trainer/kernel_network.py`), one device
and split 2×2: loss and every gradient within 1e-12 of Keras's own ops, relative. The large-mean input is 1000 ± 1:
a condition (mean over spread) of 1e3, so float64's rounding (1.1e-16), amplified by it and by the network, stays
near 1e-13; the network's first convolution ("same" padding) widens the spread its normalization sees, so the
statistics' own test is op by op: in float64 on 1000 ± 1e-3, the fused variance within 100 ε of NumPy's two-pass
one (one-pass Σx²/n − mean² loses ε·mean²/var ≈ 1e-4 there).

In float32, op by op, against the float64 value of the same float32 inputs: within float32's rounding of the sum
(n terms: n·ε·Σ|term|, plus n times float32's smallest normal number where products underflow), the bound every
summation order meets; and the normalization's statistics within 100 ε of the variance (the fused form's shift
leaves it that; one-pass sums cancelled to no digit at mean 1000, spread 1e-3, and overflowed at 1e19).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer import kernel_network
from tests.trainer.parallel import test_kernels
from tests.trainer.zoo import step
from trainer.parallel import conv_taps, fused_norm, kernels, padded_transpose, subpixel

FLOAT32 = np.finfo(np.float32)
HOSTILE = {"large mean": (1000.0, 1.0), "near float32's largest": (0.0, 1e37),
           "near float32's smallest": (0.0, 1e-37)}  # (mean, spread) of the input volume


@pytest.mark.slow  # 12 float64 compiles of a 9-layer 3D network, each run on three inputs: 1-2 min on 2 idle cores
@pytest.mark.parametrize("split", [False, True], ids=["one device", "split 2x2"])
def test_every_candidate_equals_kerass_ops_on_hostile_values_in_float64(split):
    noise, labels = step.example((8, 8, 8), seed=5)
    batches = [mean + spread * noise for mean, spread in HOSTILE.values()]
    dims = test_kernels.SPLITS[3] if split else (1,) * 5
    network = functools.partial(kernel_network.network, 3)

    def steps(config):
        with kernels.using(config):
            return step.run_each(network, dims, batches, labels, dtype="float64")

    references = steps(None)
    for name, config in test_kernels.CANDIDATES.items():
        for values, ours, reference in zip(HOSTILE, steps(config), references):
            print(name, values, abs(ours.loss - reference.loss) / abs(reference.loss),
                  step.worst_gradient(ours, reference))  # the figures a report quotes
            assert np.isfinite(reference.loss) and ours.gathered == [], (name, values, ours.gathered)
            assert abs(ours.loss - reference.loss) <= 1e-12 * abs(reference.loss), (name, values, ours.loss,
                                                                                    reference.loss)
            assert step.worst_gradient(ours, reference) <= 1e-12, (name, values,
                                                                   step.worst_gradient(ours, reference))


def _float32_cases(seed: int):
    """(name, x, w, cotangent scale) in float32: a large mean with a tiny spread, magnitudes near float32's largest
    (products near 1e36, sums below its 3.4e38), and near and below its smallest normal (1.2e-38)."""
    rng = np.random.default_rng(seed)
    return [("large mean", 1000.0 + 1e-3 * rng.normal(size=(2, 6, 6, 6, 5)), rng.normal(size=(3, 3, 3, 5, 4))),
            ("large", 1e31 * rng.normal(size=(2, 6, 6, 6, 5)), 1e5 * rng.normal(size=(3, 3, 3, 5, 4))),
            ("tiny", 1e-19 * rng.normal(size=(2, 6, 6, 6, 5)), 1e-19 * rng.normal(size=(3, 3, 3, 5, 4)))]


def _within_float32_rounding(ours, exact, magnitude, terms: int, what):
    """|ours − exact| <= terms·ε·magnitude + terms·tiny, elementwise (`magnitude`: Σ|term| of each output)."""
    ours, exact = np.asarray(ours, np.float64), np.asarray(exact, np.float64)
    assert np.all(np.isfinite(ours)), what
    bound = terms * FLOAT32.eps * np.asarray(magnitude) + terms * FLOAT32.tiny
    worst = float(np.max(np.abs(ours - exact) - bound))
    assert worst <= 0, (what, worst, float(np.max(np.abs(ours - exact) / np.maximum(bound, FLOAT32.tiny))))


def _check_bilinear(ours, xlas, x, w, cotangent_shape, terms: int, name: str):
    """`ours(x, w)` (float32) and its gradients against `xlas` in float64 on the same float32 values."""
    rng = np.random.default_rng(7)
    cotangent = rng.normal(size=cotangent_shape).astype(np.float32)
    with_gradients = jax.jit(lambda function, x, w, cotangent: (lambda value, vjp: (value, *vjp(cotangent)))(
        *jax.vjp(function, x, w)), static_argnums=0)  # (value, dx, dw), compiled once
    got = with_gradients(ours, x, w, cotangent)
    with jax.enable_x64(True):
        wide = [np.asarray(a, np.float64) for a in (x, w, cotangent)]
        exact = with_gradients(xlas, *wide)
        magnitudes = with_gradients(xlas, *map(np.abs, wide))  # Σ|term| of each output: the op on |x|, |w|, |c|
        for what, value, truth, size in zip(("value", "input gradient", "weight gradient"), got, exact, magnitudes):
            _within_float32_rounding(value, truth, size, terms, f"{name}: {what}")


@pytest.mark.parametrize("method", ["taps", "float32"])
def test_weight_gradient_candidates_on_float32_extremes(method):
    arguments = ((2, 1, 2), ((1, 1), (0, 2), (1, 1)), (1, 1, 1))
    for name, x, w in _float32_cases(0):
        x, w = x.astype(np.float32), w.astype(np.float32)
        ours = functools.partial(conv_taps.conv, strides=arguments[0], padding=arguments[1],
                                 dilation=arguments[2], method=method)
        xlas = functools.partial(conv_taps._forward, strides=arguments[0], padding=arguments[1],
                                 dilation=arguments[2])
        shape = jax.eval_shape(xlas, x, w).shape
        _check_bilinear(ours, xlas, x, w, shape, x.size, f"{method}, {name}")


@pytest.mark.parametrize("form", ["subpixel", "padded"])
@pytest.mark.parametrize("kernel, padding", [(2, ((1, 1),) * 3), (3, ((2, 1),) * 3), (3, ((2, 2),) * 3)],
                         ids=["k2 valid", "k3 same", "k3 valid"])
def test_transposed_convolution_candidates_on_float32_extremes(form, kernel, padding):
    import jax.lax as lax

    module = {"subpixel": subpixel, "padded": padded_transpose}[form]
    for name, x, w in _float32_cases(1):
        x, w = x.astype(np.float32), w[:kernel, :kernel, :kernel].transpose(0, 1, 2, 4, 3).astype(np.float32)

        ours = functools.partial(module.conv_transpose, strides=2, padding=padding)
        xlas = functools.partial(lax.conv_transpose, strides=(2, 2, 2), padding=padding,
                                 dimension_numbers=("NDHWC", "DHWIO", "NDHWC"), transpose_kernel=True)

        shape = jax.eval_shape(xlas, x, w).shape
        _check_bilinear(ours, xlas, x, w, shape, x.size, f"{form} k{kernel} {padding[0]}, {name}")


@pytest.mark.parametrize("mean, spread", [(1000.0, 1e-3), (1e19, 1e16), (1e-15, 1e-17)],
                         ids=["large mean", "near float32's largest squares", "tiny"])
@pytest.mark.parametrize("axes", [(1, 2, 3), (0, 1, 2, 3)], ids=["instance", "batch"])
def test_fused_statistics_on_float32_extremes(mean, spread, axes):
    """Mean and variance within 100 ε of the float64 ones (Keras's two-pass float32 ones: 8e-3 of the variance at
    mean 1000, spread 1e-3), and their gradient within float32's rounding of the exact one."""
    x = (mean + spread * np.random.default_rng(3).normal(size=(2, 8, 8, 8, 3))).astype(np.float32)
    ours_mean, ours_variance = fused_norm.moments(jnp.asarray(x), axes)
    exact = x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(ours_mean, np.float64), exact.mean(axes, keepdims=True), rtol=100 * FLOAT32.eps)
    np.testing.assert_allclose(np.asarray(ours_variance, np.float64), exact.var(axes, keepdims=True),
                               rtol=100 * FLOAT32.eps)
    # The gradient, dx = (d_mean + 2 d_var (x − mean)) / n: x − mean in float32 is off by the mean's rounding
    # (a few ε·|mean|), the rest by a few ε of each term.
    rng = np.random.default_rng(4)
    d_mean, d_var = (rng.normal(size=ours_mean.shape).astype(np.float32) / spread for _ in range(2))
    _, vjp = jax.vjp(lambda x: fused_norm.moments(x, axes), jnp.asarray(x))
    (gradient,) = vjp((jnp.asarray(d_mean), jnp.asarray(d_var)))
    count = x.size // d_mean.size
    centred = exact - exact.mean(axes, keepdims=True)
    exact_gradient = (d_mean + 2 * d_var * centred) / count
    bound = 8 * FLOAT32.eps * (np.abs(d_mean) + 2 * np.abs(d_var) * (np.abs(centred) + np.abs(mean))) / count
    assert np.all(np.abs(np.asarray(gradient, np.float64) - exact_gradient) <= bound)


def test_fused_statistics_on_a_large_mean_in_float64():
    x = 1000.0 + 1e-3 * np.random.default_rng(3).normal(size=(2, 8, 8, 8, 3))
    with jax.enable_x64(True):
        mean, variance = fused_norm.moments(jnp.asarray(x), (1, 2, 3))
    epsilon = np.finfo(np.float64).eps
    np.testing.assert_allclose(np.asarray(mean), x.mean((1, 2, 3), keepdims=True), rtol=100 * epsilon)
    np.testing.assert_allclose(np.asarray(variance), x.var((1, 2, 3), keepdims=True), rtol=100 * epsilon)
