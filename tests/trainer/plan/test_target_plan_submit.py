"""`fullres plan --target v5e:2x2 --json` end to end: the TPU compiler's figures, cached for the next plan, with a
roofline estimate, and the launch parameters `fullres pipeline submit --plan` sends to Vertex AI (a local endpoint
speaking its REST protocol). The tiny UNet (2 levels, 4 filters) at 16×4×4 keeps the TPU compile to seconds (3 s here; 24 s at 16³); it is the
target tier's one compile of that program, so the TPU compiler's own memory figures are judged here too.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.pipelines.test_vertex import vertex  # noqa: F401  (the local Vertex AI endpoint, a fixture)
from trainer.plan import compiled_step, layout_measure, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _plan(cache: str, *arguments: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    environment["FULLRES_PLAN_CACHE"] = cache
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "plan", *arguments], capture_output=True, text=True,
                          env=environment, cwd=REPOSITORY, timeout=900)


def test_a_tpu_plan_is_cached_estimated_and_submitted_as_planned(tmp_path, vertex):  # noqa: F811
    arguments = ("--preset", "smoke", "--image-size", "16,4,4", "--partitions", "4", "--target", "v5e:2x2", "--json")
    first = _plan(str(tmp_path / "cache"), *arguments)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _plan(str(tmp_path / "cache"), *arguments)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1,4,1,1,1: " in second.stderr and "(from the plan cache)" in second.stderr
    planned, again = json.loads(first.stdout), json.loads(second.stdout)
    (row,), (cached,) = planned["rows"], again["rows"]
    assert not row["cached"] and cached["cached"]
    assert {k: v for k, v in cached.items() if k not in ("cached", "compile_seconds")} == \
        {k: v for k, v in row.items() if k not in ("cached", "compile_seconds")}
    assert row["total_bytes"] != row["cpu_total_bytes"]  # the TPU compiler's figure, the CPU's beside it
    # TPUs tile the two minor dimensions of every array by (8, 128): the 4-channel weights and their optimizer
    # slots are padded toward 128 lanes, so the TPU holds many times the CPU's argument bytes.
    config = compiled_step.plan_config("unet3d", "smoke", {"partition.input_partition_dims": "1,4,1,1,1"})
    cpu_row = layout_measure.compile_layout(config, compiled_step.example_shape(config, (16, 4, 4)),
                                           targets.parse("cpu"))
    assert row["argument_bytes"] > 4 * cpu_row.argument_bytes
    assert row["activation_all_gathers"] == 0 and row["halo_bytes"] > 0  # halo exchange, and nothing gathered
    assert row["flops"] > 0 and row["compiler_seconds"] > 0  # the TPU compiler's own cost analysis
    assert row["estimate"]["counts_from"] == "target compiler" and row["estimate"]["seconds"] > 0
    launch = planned["launch"]
    assert launch["parameters"] == {"input_partition_dims": "1,4,1,1,1", "batch_size": 2, "precision": "float32",
                                    "preset": "smoke", "accelerator_type": "TPU_V5_LITEPOD",
                                    "machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2",
                                    "accelerator_count": 1, "replica_count": 1}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(first.stdout)
    endpoint, requests = vertex
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GOOGLE_")}
    environment["STORAGE_EMULATOR_HOST"] = endpoint
    submitted = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "submit", "--project", "p", "--region", "us-central1",
         "--pipeline-root", "gs://bkt/root", "--plan", str(plan_file), "--param", "steps=100",
         # Named, as test_vertex.py's submit does: without one, aiplatform asks Resource Manager (which the local
         # endpoint does not speak) for the project's default account and retries for 60 s before it goes on.
         "--service-account", "trainer@p.iam.gserviceaccount.com",
         "--param", "train_input_uri=gs://bkt/train", "--param", "eval_input_uri=gs://bkt/eval",
         "--api-endpoint", endpoint],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=300)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    (job,) = [r["body"] for r in requests if r["method"] == "POST" and "/pipelineJobs" in r["path"]]
    assert job["runtimeConfig"]["parameterValues"] == {**launch["parameters"], "steps": 100,
                                                       "train_input_uri": "gs://bkt/train",
                                                       "eval_input_uri": "gs://bkt/eval"}
