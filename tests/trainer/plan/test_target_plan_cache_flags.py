"""The plan cache's key holds the compiler flags of the environment: a plan for a target
made under other `XLA_FLAGS` read back the figures compiled under the first, though a flag can change what the
compile needs. Two plans of one step under two flags: the second compiles again."""

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _plan(cache: str, flags: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    environment.update(FULLRES_PLAN_CACHE=cache, XLA_FLAGS=flags)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "--preset", "smoke", "--image-size", "16,16,16",
         "--partitions", "1", "--target", "h100x1"], capture_output=True, text=True, env=environment, cwd=REPOSITORY,
        timeout=900)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    said = (result.stdout + result.stderr).splitlines()
    return next(line for line in said if line.startswith("[h100x1 1/1] 1,1,1,1,1: "))


def test_a_plan_under_other_compiler_flags_compiles_again(tmp_path):
    cache = str(tmp_path / "cache")
    first = _plan(cache, "--xla_cpu_enable_fast_math=false")
    assert not first.endswith("(from the plan cache)"), first
    again = _plan(cache, "--xla_cpu_enable_fast_math=true")  # was read back "from the plan cache"
    assert not again.endswith("(from the plan cache)"), again
    assert len(os.listdir(cache)) == 2  # one entry per flags
