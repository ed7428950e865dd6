"""XLA's GPU compiler (jax 0.10.2's CUDA 12 plug-in) cannot tile one of SwinUNETR's attention matrix products for
Triton ("Couldn't find output tile sizes that satisfy hlo"), at any size from 32³: `fullres plan --target h100x1`
compiles it again without Triton's GEMMs (cuBLAS computes them) and says so in the row, rather than a traceback.
The default compile is asserted to fail: once XLA tiles it, this test says the fallback can go.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SWIN = os.path.join("tests", "trainer", "zoo", "swin_unetr.py") + ":tiny"


def test_a_step_xla_cannot_tile_for_triton_is_planned_without_triton_gemms(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    environment["FULLRES_PLAN_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "--model", SWIN, "--image-size", "32,32,32",
         "--partitions", "1", "--target", "h100x1", "--json"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(result.stdout)["rows"]
    assert row["compiler_options"] == "xla_gpu_enable_triton_gemm=false"  # "": XLA tiles it now, drop the fallback
    assert row["total_bytes"] > 0 and row["total_bytes"] != row["cpu_total_bytes"]  # the GPU compiler's own figure
    assert "without Triton GEMMs" in result.stderr  # the progress line says so
