"""`--set kernels.choose=measure` (trainer/engine/kernel_choice.py) on this CPU: a slowed candidate is never chosen,
the second run takes the cache and measures nothing, another jax version or device kind misses it, the record holds
every layer's choice, the time bound holds, and a corrupt or unwritable cache is said in one line and ignored.

The network is small (a 2D convolution, an InstanceNorm, a transposed convolution and a 1×1 convolution at 16²) so
each test compiles a few programs of one op; the step comparison compiles the network's gradient with and without
the choice, as `fullres train` compiles its step (`test_kernel_choice_run.py` runs that)."""

import functools
import json
import time
import types

import jax
import jax.numpy as jnp
import keras
import pytest

from trainer.engine import kernel_cache, kernel_choice, kernel_measure
from trainer.parallel import conv_taps, kernels

CPU = jax.devices()[0]


ALL = ("conv", "norm", "up", "logits")


@functools.lru_cache(maxsize=None)
def _network(names=ALL, channels=4):
    """The network of `names`' layers in this order (a convolution, an InstanceNorm, a transposed convolution, a 1×1
    convolution) on 16² inputs of `channels`, its state, and an input."""
    keras.utils.set_random_seed(0)
    layers = {"conv": keras.layers.Conv2D(channels, 3, padding="same", name="conv"),
              "norm": keras.layers.GroupNormalization(groups=4, name="norm"),
              "up": keras.layers.Conv2DTranspose(4, 2, strides=2, name="up"),
              "logits": keras.layers.Conv2D(3, 1, name="logits")}
    inputs = x = keras.Input((16, 16, channels))
    for name in names:
        x = layers[name](x)
    model = keras.Model(inputs, x)
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
    return model, state, jnp.ones((2, 16, 16, channels), jnp.float32)


def _gradient(model):
    def loss(trainable, non_trainable, x):
        return jnp.sum(model.stateless_call(trainable, non_trainable, x, training=True)[0] ** 2)

    return jax.grad(loss)


def _discover(names=ALL, channels=4):
    model, state, x = _network(names, channels)
    with kernels.recording() as found:
        jax.make_jaxpr(_gradient(model))(*state, x)
    return found


def _time_step(names=ALL, channels=4):
    def time_step(config, layers):
        """The network's gradient compiled under (config, layers), timed as a candidate is."""
        model, state, x = _network(names, channels)
        compiled = jax.jit(kernels.traced(_gradient(model), config, "cpu", layers)).lower(*state, x).compile()
        return kernel_measure.seconds(compiled, (*state, x), repeats=3)

    return time_step


def _choose(tmp_path, lines=None, device=CPU, names=ALL, channels=4, **settings):
    config = kernels.KernelsConfig(choose="measure", cache=str(tmp_path / "choices.json"), **settings)
    return kernel_choice.choose(config, device, 1, functools.partial(_discover, names, channels),
                                _time_step(names, channels), None, (lines if lines is not None else []).append)


def _slowed(function):
    """`function`'s value plus 0 × 24 more evaluations of it on other inputs (XLA would merge equal ones, or hoist
    them out of the loop; it keeps a product with 0, which is not 0 for every float)."""
    def slow(x, *arguments):
        extra = jax.lax.fori_loop(0, 24, lambda number, total: total + jnp.sum(function(x + number, *arguments)),
                                  jnp.zeros((), x.dtype))
        return function(x, *arguments) + 0.0 * extra

    return slow


@pytest.mark.parametrize("slowed", ["xla", "taps"])
def test_a_slowed_candidate_is_never_chosen(tmp_path, monkeypatch, slowed):
    kernels.install()
    if slowed == "xla":
        monkeypatch.setitem(kernels._ORIGINAL, "conv", _slowed(kernels._ORIGINAL["conv"]))
    else:
        monkeypatch.setattr(conv_taps, "keras_conv", _slowed(conv_taps.keras_conv))
    record = _choose(tmp_path, names=("conv",), channels=16).record  # 16 channels: work beyond the host's noise
    assert [row["layer"] for row in record["layers"]] == ["conv"]
    for row in record["layers"]:
        assert set(row["times"]) == {"xla", "taps"}
        assert row["times"][slowed] > row["times"][{"xla": "taps", "taps": "xla"}[slowed]], row
        assert row["choice"] != slowed, row


def test_the_record_holds_every_layers_choice_and_the_second_run_measures_nothing(tmp_path, monkeypatch):
    lines = []
    first = _choose(tmp_path, lines)
    record = first.record
    assert {row["layer"]: row["kind"] for row in record["layers"]} == {
        "conv": "convolution", "norm": "normalization",
        "up": "transposed convolution", "logits": "convolution"}
    for row in record["layers"]:
        assert set(row["times"]) == set(kernels.candidates(row["kind"], "cpu")) and row["reached"]
        assert row["choice"] == min(row["times"], key=row["times"].get) or \
            row["times"][row["choice"]] == min(row["times"].values())
    assert record["served"] == "measured" and record["measurements"] >= 4
    assert first.layers == {row["signature"]: row["choice"] for row in record["layers"]
                            if row["choice"] != "xla"} or record["step"]["kept"] == "fixed"
    assert len(lines) == 1 and lines[0].startswith("kernels: ") and "of 4 layers" not in lines[0]
    assert "4 layers of 4 signatures" in lines[0]

    def no_measuring(*arguments, **keywords):
        raise AssertionError("the second run measured")

    monkeypatch.setattr(kernel_measure, "measure", no_measuring)
    again_lines = []
    again = _choose(tmp_path, again_lines)
    assert again.record["served"] == "cache" and again.record["measurements"] == 0
    assert (again.kernels, again.layers) == (first.kernels, first.layers)
    assert [row["choice"] for row in again.record["layers"]] == [row["choice"] for row in record["layers"]]
    assert "from the cache" in again_lines[0]


def test_another_jax_version_or_device_kind_misses_the_cache(tmp_path, monkeypatch):
    norm = ("norm",)
    assert _choose(tmp_path, names=norm).record["served"] == "measured"
    assert _choose(tmp_path, names=norm).record["served"] == "cache"
    other_kind = types.SimpleNamespace(device_kind="another CPU", platform="cpu")
    assert _choose(tmp_path, device=other_kind, names=norm).record["served"] == "measured"
    monkeypatch.setattr(jax, "__version__", "0.0.1")
    assert _choose(tmp_path, names=norm).record["served"] == "measured"
    with open(tmp_path / "choices.json") as file:
        assert len(json.load(file)["devices"]) == 3  # each key its own entry; none overwrote another


def test_fixed_measures_nothing_and_auto_measures_on_a_gpu_only(tmp_path):
    config = kernels.KernelsConfig(cache=str(tmp_path / "choices.json"))
    for platform in ("cpu", "tpu"):
        device = types.SimpleNamespace(device_kind="x", platform=platform)
        assert kernel_choice.choose(config, device, 1, _discover, _time_step(), None, print) == \
            kernel_choice.Choice(config, {})
    assert config.resolved_choose("gpu") == "measure" and config.resolved_choose("tpu") == "fixed"
    assert kernels.candidates("convolution", "tpu") == ("xla",)  # a TPU keeps XLA's weight gradients
    assert not (tmp_path / "choices.json").exists()


def test_the_time_bound_holds(tmp_path, monkeypatch):
    """No candidate starts after `measure_seconds`; the signatures it did not reach keep the fields' values."""
    starts, timed, lower = [], kernel_measure.seconds, kernel_measure.lower

    def slow_timing(compiled, arguments, repeats=kernel_measure.REPEATS):
        time.sleep(0.4)
        return timed(compiled, arguments, repeats)

    def noted_start(*arguments):
        starts.append(time.perf_counter())
        return lower(*arguments)

    monkeypatch.setattr(kernel_measure, "seconds", slow_timing)
    monkeypatch.setattr(kernel_measure, "lower", noted_start)
    started = time.perf_counter()
    record = _choose(tmp_path, measure_seconds=0.5).record
    assert starts and all(start < started + 0.5 for start in starts)
    unreached = [row for row in record["layers"] if not row["reached"]]
    assert unreached and all(row["choice"] == "xla" and row["times"] == {} for row in unreached)
    assert record["served"] == "measured"
    with open(tmp_path / "choices.json") as file:  # what was not measured is not remembered
        assert len(json.load(file)["devices"].popitem()[1]["signatures"]) < 4
    nothing = _choose(tmp_path / "none", measure_seconds=0).record
    assert nothing["measurements"] == 0 and all(row["choice"] == "xla" for row in nothing["layers"])


def test_a_corrupt_or_unwritable_cache_is_said_in_one_line_and_ignored(tmp_path):
    corrupt = tmp_path / "choices.json"
    corrupt.write_text("{not json")
    lines = []
    choice = _choose(tmp_path, lines, names=("norm",))
    assert choice.record["served"] == "measured" and choice.record["measurements"] > 0
    said = [line for line in lines if "cache" in line and "cannot be read" in line]
    assert len(said) == 1 and str(corrupt) in said[0] and "Traceback" not in "".join(lines)
    assert corrupt.read_text() == "{not json"  # not fullres's to overwrite
    assert len(lines) == 2  # that line and the choice's

    blocked = tmp_path / "a file"
    blocked.write_text("x")
    lines = []
    config = kernels.KernelsConfig(choose="measure", cache=str(blocked / "choices.json"))
    choice = kernel_choice.choose(config, CPU, 1, functools.partial(_discover, ("norm",)), _time_step(("norm",)),
                                  None, lines.append)
    said = [line for line in lines if "cannot be written" in line]
    assert len(said) == 1 and len(lines) == 2 and choice.record["served"] == "measured"
    assert blocked.read_text() == "x"


def test_the_cache_file_is_keyed_by_device_kind_and_versions():
    key = kernel_cache.device_key(CPU)
    assert key["device_kind"] == CPU.device_kind and key["jax"] == jax.__version__
    assert key["jaxlib"] and key["platform"] == "cpu"


def test_a_bad_choice_setting_is_one_sentence():
    from trainer import config_resolution

    with pytest.raises(ValueError, match=r"^kernels.choose 'sometimes' is not known; use one of auto, measure, fixed "
                                         r"\(--set kernels.choose=...\).$"):
        config_resolution.resolve(preset="smoke", overrides={"kernels.choose": "sometimes"})
    with pytest.raises(ValueError, match=r"kernels.measure_seconds must be a number >= 0, got -1 "):
        kernels.KernelsConfig(measure_seconds=-1)
    assert config_resolution.resolve(preset="smoke", overrides={"kernels.choose": "measure"}).kernels.choose == \
        "measure"
