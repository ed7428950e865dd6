"""`fit` on a GPU is against the share of its memory JAX's allocator may take: XLA_PYTHON_CLIENT_MEM_FRACTION where
the user set it (before, the plan fitted against fullres's 95 % whatever it said, so a step it called fitting ran out
of memory under 0.5), else fullres's 95 %. A value JAX cannot read is one sentence naming the variable (before: a
NotImplementedError traceback from the CUDA plug-in, "topology not implemented for cuda")."""

import os

import pytest
from typer.testing import CliRunner

from trainer.plan import device_bytes, targets

H100_BYTES = 80 * 2**30
VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def test_the_users_share_is_the_one_fitted_against(monkeypatch):
    h100 = targets.parse("h100x1")
    monkeypatch.setenv(VARIABLE, "0.5")
    assert targets.memory_per_device(h100) == H100_BYTES // 2
    assert device_bytes.plan_json("cuda", {})["allocator_fraction"] == 0.5
    assert targets.memory_words(h100) == ("80.00 GiB per device, of which JAX's allocator may take 50% (40.00 GiB), "
                                          f"as {VARIABLE} sets it")
    monkeypatch.delenv(VARIABLE, raising=False)  # unset: fullres's share (trainer/__init__.py sets it in every process)
    assert targets.memory_per_device(h100) == int(H100_BYTES * 0.95)
    assert targets.memory_words(h100) == ("80.00 GiB per device, of which JAX's allocator may take 95% (76.00 GiB), "
                                          "as fullres sets it")
    assert targets.memory_words(h100, 2**30) == "1.00 GiB per device"  # --device-memory, as given
    monkeypatch.setenv(VARIABLE, "abc")  # a TPU's memory is its compiler's, whatever the GPU variable says
    assert targets.memory_per_device(targets.parse("v5e:2x2")) == round(15.75 * 2**30)


@pytest.mark.parametrize("value", ["abc", "0", "1.5", "nan"])
def test_a_share_jax_cannot_read_is_one_sentence_before_anything_is_built(monkeypatch, tmp_path, value):
    from pipelines import cli

    monkeypatch.setenv(VARIABLE, value)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16", "--target",
                                          "h100x1"])
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    assert result.stderr.strip() == (
        f"fullres: error: {VARIABLE}={value!r} is not a share of the GPU's memory: JAX reads it as a number above 0 "
        f"and at most 1; set it like {VARIABLE}=0.9, or unset it (fullres then lets JAX take 0.95).")
    assert os.listdir(tmp_path) == []
