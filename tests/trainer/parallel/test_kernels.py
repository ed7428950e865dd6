"""The kernels fullres computes itself (`trainer/parallel/kernels.py`) equal Keras's own ops in float64: a network
of every layer kind they replace (`tests/trainer/kernel_network.py`), its loss and every gradient within 1e-12
relative, 2D and 3D, on one device and split 2×2 (0 activation all-gathers split), each candidate alone; and the
setting is a run's. Hostile values (large means, tiny spreads, float32's extremes): `test_kernels_hostile.py`."""

import functools
from unittest import mock

import numpy as np
import pytest

from tests.trainer import kernel_network
from tests.trainer.zoo import step
from trainer import config as config_lib
from trainer import config_resolution, presets
from trainer.parallel import conv_taps, fused_norm, kernels, padded_transpose, subpixel

CANDIDATES = {"taps": kernels.KernelsConfig(conv_weight_grad="taps"),
              "float32": kernels.KernelsConfig(conv_weight_grad="float32"),
              "subpixel": kernels.KernelsConfig(conv_transpose="subpixel"),
              "padded": kernels.KernelsConfig(conv_transpose="padded"),
              "fused": kernels.KernelsConfig(norm="fused")}


SPLITS = {2: (1, 2, 2, 1), 3: (1, 2, 2, 1, 1)}


def _step(spatial_dims: int, split: bool, config: kernels.KernelsConfig | None) -> step.Step:
    images, labels = step.example((8,) * spatial_dims, seed=spatial_dims)
    dims = SPLITS[spatial_dims] if split else (1,) * (spatial_dims + 2)
    with kernels.using(config):
        return step.run(functools.partial(kernel_network.network, spatial_dims), dims, images, labels, dtype="float64")


@pytest.mark.slow  # 4 float64 compiles of a 9-layer network: 10-20 s on 2 idle cores
@pytest.mark.parametrize("spatial_dims", [2, 3])
@pytest.mark.parametrize("split", [False, True], ids=["one device", "split 2x2"])
def test_every_candidate_equals_kerass_ops_in_float64(spatial_dims, split):
    reference = _step(spatial_dims, split, None)
    assert reference.float32_values == 0 and reference.gathered == []
    for name, config in CANDIDATES.items():
        with mock.patch.object(conv_taps, "weight_gradient", wraps=conv_taps.weight_gradient) as taps, \
                mock.patch.object(fused_norm, "_statistics", wraps=fused_norm._statistics) as statistics, \
                mock.patch.object(conv_taps, "wide_weight_gradient", wraps=conv_taps.wide_weight_gradient) as wide, \
                mock.patch.object(subpixel, "conv_transpose", wraps=subpixel.conv_transpose) as phases, \
                mock.patch.object(padded_transpose, "conv_transpose", wraps=padded_transpose.conv_transpose) as padded:
            ours = _step(spatial_dims, split, config)
        # The candidate ran: per-tap (or widened) weight gradients for every convolution, one-pass statistics for
        # every norm, sub-pixel transposed convolutions (split: unless padded), padded ones.
        assert taps.call_count == (4 if config.conv_weight_grad == "taps" else 0), name
        assert wide.call_count == (4 if config.conv_weight_grad == "float32" else 0), name
        assert phases.call_count == (2 if config.conv_transpose == "subpixel" or split and name != "padded" else 0), \
            name
        assert padded.call_count == (2 if config.conv_transpose == "padded" else 0), name
        assert (statistics.call_count > 0) == (config.norm == "fused"), name
        print(spatial_dims, split, name, abs(ours.loss - reference.loss) / abs(reference.loss),
              step.worst_gradient(ours, reference))  # the figures a report quotes
        assert ours.float32_values == 0, name
        assert ours.gathered == [], f"{name}: {ours.gathered}"
        assert abs(ours.loss - reference.loss) <= 1e-12 * abs(reference.loss), name
        assert step.worst_gradient(ours, reference) <= 1e-12, (name, step.worst_gradient(ours, reference))
        assert len(ours.gradients) == len(reference.gradients)


def test_taps_computes_the_weight_gradient_itself_and_xla_the_rest():
    """In float32 with a stride of 2: the forward pass and the input's gradient are XLA's, bit for bit, and the
    per-tap weight gradient equals XLA's to float32 rounding (in float64 to 1e-12: above)."""
    import jax

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 6, 6, 5)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 5, 7)).astype(np.float32)
    arguments = ((2, 2, 2), ((1, 1),) * 3, (1, 1, 1))
    cotangent = rng.normal(size=(2, 3, 3, 3, 7)).astype(np.float32)

    @jax.jit
    def both(x, w, cotangent):  # (value, (dx, dw)) of each, compiled once
        ours = jax.vjp(lambda x, w: conv_taps.conv(x, w, *arguments), x, w)
        xlas = jax.vjp(lambda x, w: conv_taps._forward(x, w, *arguments), x, w)
        return (ours[0], ours[1](cotangent)), (xlas[0], xlas[1](cotangent))

    (value, (dx, dw)), (value_xla, (dx_xla, dw_xla)) = both(x, w, cotangent)
    np.testing.assert_array_equal(value, value_xla)
    np.testing.assert_array_equal(dx, dx_xla)
    np.testing.assert_allclose(dw, dw_xla, rtol=1e-4, atol=1e-4)


def test_the_setting_is_a_runs():
    config = config_resolution.resolve(preset="smoke", overrides={"kernels.conv_weight_grad": "taps",
                                                           "kernels.xla_flags": "conv_nhwc"})
    assert config.kernels == kernels.KernelsConfig(conv_weight_grad="taps", xla_flags="conv_nhwc")
    recorded = config_lib.to_dict(config)
    assert recorded["kernels"]["conv_weight_grad"] == "taps"  # train_config.json holds it
    assert config_lib.from_dict(recorded) == config
    del recorded["kernels"]  # a run recorded before the setting: XLA's own ops
    assert config_lib.from_dict(recorded).kernels == kernels.KernelsConfig()
    with pytest.raises(ValueError, match=r"kernels.norm 'fast' is not known; use one of xla, fused"):
        config_resolution.resolve(preset="smoke", overrides={"kernels.norm": "fast"})


def test_each_flag_set_names_options_the_locked_xla_has():
    """A compile with an option XLA does not know is refused ("No such compile option"): every named set compiles."""
    import jax
    import jax.numpy as jnp

    assert kernels.compiler_options(kernels.KernelsConfig()) is None
    for name in kernels.FLAG_SETS:
        options = kernels.compiler_options(kernels.KernelsConfig(xla_flags=name))
        jax.jit(jnp.sin, compiler_options=options).lower(jnp.zeros(3)).compile()
    with pytest.raises(Exception, match="No such compile option"):
        jax.jit(jnp.sin, compiler_options={"xla_gpu_no_such_option": True}).lower(jnp.zeros(3)).compile()


def test_a_resume_with_other_kernels_is_logged_not_refused():
    """The kernels compute the same values otherwise: a resume may change them (`run_record.MAY_CHANGE`, as
    `remat`), and its log says so; a run recorded before the setting resumes as it was."""
    import dataclasses

    from trainer.engine import run_record

    config = presets.smoke()
    recorded = config_lib.to_dict(config)
    changed = dataclasses.replace(config, kernels=kernels.KernelsConfig(norm="fused", xla_flags="conv_nhwc"))
    assert run_record._settings(recorded) == run_record._settings(config_lib.to_dict(changed))  # not refused
    lines = []
    run_record._log_changed_freely(recorded, changed, config.steps, 1, {}, lines.append)
    assert lines == ["resuming with --set kernels.norm=fused (was xla), --set kernels.xla_flags=conv_nhwc (was none)"]
    del recorded["kernels"]
    assert run_record._settings(recorded) == run_record._settings(config_lib.to_dict(config))


def test_in_bfloat16_the_taps_multiply_bfloat16_and_accumulate_in_float32():
    """Mixed precision: Keras hands the convolution bfloat16 inputs and kernel; each tap's product takes them as
    they are (no float32 copy of the activation) and accumulates in float32; the gradient comes back bfloat16."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((1, 6, 6, 6, 4), jnp.bfloat16)
    w = jnp.zeros((3, 3, 3, 4, 5), jnp.bfloat16)
    gradient = jax.grad(lambda w: conv_taps.keras_conv(x, w, 1, "same").astype(jnp.float32).sum())
    jaxpr = jax.make_jaxpr(gradient)(w)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 27
    assert all(e.invars[0].aval.dtype == jnp.bfloat16 and e.invars[1].aval.dtype == jnp.bfloat16 for e in dots)
    assert all(e.params["preferred_element_type"] == jnp.float32 for e in dots)
    assert jaxpr.out_avals[0].dtype == jnp.bfloat16


def test_a_tpu_program_keeps_xlas_weight_gradients():
    taps = kernels.KernelsConfig(conv_weight_grad="taps", norm="fused")
    assert kernels.for_platform(taps, "tpu") == kernels.KernelsConfig(norm="fused")
    assert kernels.for_platform(taps, "gpu") == taps and kernels.for_platform(taps, "cpu") == taps
    assert kernels.traced(len, kernels.KernelsConfig(conv_weight_grad="taps"), "tpu") is len  # nothing to swap
