"""`fullres plan --model FILE.py:FUNCTION --target v5e:2x2` sizes a user's network with the TPU compiler, without a
TPU: per-device memory and halo of its training step, and what to submit (the network's file passed on with it)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NETWORK = os.path.join("tests", "trainer", "user_networks.py") + ":residual_groupnorm"


def test_a_users_network_is_planned_on_a_tpu_slice(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    environment["FULLRES_PLAN_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "--model", NETWORK, "--image-size", "16,16,16",
         "--partitions", "4", "--target", "v5e:2x2", "--json"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(result.stdout)
    assert plan["header"].startswith("segmentation user_networks.py:residual_groupnorm [16, 16, 16]")
    (row,) = plan["rows"]
    assert row["input_partition_dims"] == [1, 4, 1, 1, 1] and row["fits"]
    assert row["total_bytes"] > 0 and row["total_bytes"] != row["cpu_total_bytes"]  # the TPU compiler's own figure
    assert row["halo_bytes"] > 0 and row["activation_all_gathers"] == 0 and row["gathered"] == []
    assert plan["launch"]["model"] == NETWORK and plan["launch"]["parameters"]["tpu_topology"] == "2x2"
