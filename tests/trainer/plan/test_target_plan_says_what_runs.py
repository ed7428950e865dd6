"""On a target, the plan says what the device gives and what will run there: a GPU's memory apart from the share
JAX's allocator may take (XLA_PYTHON_CLIENT_MEM_FRACTION where the user set it: fitted against, not fullres's 95 %),
and on a TPU a kernel setting its program does not take, left out of the launch line in a sentence (before: the
launch carried it, and nothing was said). The smoke UNet at 8×8×4 keeps each compile to seconds (the TPU's 5 s here, 20 s at 16³)."""

import json

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.slow, pytest.mark.target]

SMOKE = ["plan", "--preset", "smoke", "--image-size", "8,8,4", "--no-cache"]


def _plan(*arguments):
    from pipelines import cli

    result = CliRunner().invoke(cli.app, [*SMOKE, *arguments])
    assert result.exit_code == 0, result.output
    return result


def test_a_gpu_plan_fits_against_the_users_allocator_share_and_shows_the_memory_apart(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    plan = json.loads(_plan("--target", "h100x1", "--json").stdout)
    assert ("on h100x1 (NVIDIA H100 SXM5 80GB, 80.00 GiB per device, of which JAX's allocator may take 50% "
            "(40.00 GiB), as XLA_PYTHON_CLIENT_MEM_FRACTION sets it), ") in plan["header"]
    assert plan["device_memory_bytes"] == 40 * 2**30 and plan["compiler"]["allocator_fraction"] == 0.5
    assert "fits: within 50% of the GPU's memory" in plan["compiler"]["device_bytes"]


def test_a_tpu_plan_leaves_out_the_weight_gradient_its_program_does_not_take_and_says_so():
    result = _plan("--target", "v5e:2x2", "--input-partition-dims", "1,2,2,1,1",
                   "--set", "kernels.conv_weight_grad=taps", "--set", "kernels.norm=fused")
    lines = result.stdout.splitlines()
    assert ("--set kernels.conv_weight_grad=taps is left out of the launch: a TPU program computes conv_weight_grad "
            "as xla whatever it says") in result.stdout
    (submit,) = [line for line in lines if line.startswith("fullres pipeline submit ")]
    assert "conv_weight_grad" not in submit and "kernels.norm" in submit, submit
