"""The layout search on a target's compiler: pruned by the CPU's figures first, bounded in time, cached, and
ending in what to launch (the README's test command runs these with the `tpu` and `cuda` groups, apart).

The tiny UNet (2 levels, 4 filters, 16³) keeps each compile to seconds: the GPU compiler (JAX's CUDA plug-in,
no GPU present) for the search itself, the TPU compiler once for the command, its cache and the submission.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.pipelines.test_vertex import vertex  # noqa: F401  (the local Vertex AI endpoint, a fixture)
from trainer.plan import compiled_step, layout_search, target_compile, target_search, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _tiny(size: int = 16):
    config = compiled_step.plan_config("unet3d", "smoke", {"partition.input_partition_dims": "1,4,1,1,1"})
    assert (config.model.num_levels, config.model.base_filters) == (2, 4)
    return config, compiled_step.example_shape(config, (size,) * 3)


def test_a_gpu_target_reports_the_cuda_compilers_memory():
    cpu = layout_search.compile_layout(*_tiny(), targets.parse("cpu"))
    gpu = layout_search.compile_layout(*_tiny(), targets.parse("h100x8"))
    assert isinstance(gpu, layout_search.PlanRow) and gpu.fits
    assert gpu.total_bytes != cpu.total_bytes and gpu.temp_bytes != cpu.temp_bytes
    assert gpu.activation_all_gathers == 0 and gpu.halo_bytes > 0


def test_the_search_prunes_by_the_cpu_figure_before_compiling_for_the_target():
    config, shape = _tiny()
    lines = []
    # Between the CPU figures of the one-axis splits (674.6 KiB) and the two-axis ones (705.7 KiB).
    budget = 690 * 1024
    (result,) = target_search.search(config, shape, [4], targets.parse("h100x8"), layouts_to_try="all",
                                     device_memory=budget, log=lines.append)
    over = {dims for dims, _ in result.over_estimate}
    assert over == {(1, 2, 2, 1, 1), (1, 2, 1, 2, 1), (1, 1, 2, 2, 1)}
    assert all(cpu_bytes > budget for _, cpu_bytes in result.over_estimate)
    compiled = [line for line in lines if line.startswith("[h100x8") and "compiling" in line]
    assert len(compiled) == 3 and not any(",".join(map(str, d)) in " ".join(compiled) for d in over)
    assert {r.input_partition_dims for r in result.rows} == {(1, 4, 1, 1, 1), (1, 1, 4, 1, 1), (1, 1, 1, 4, 1)}
    for row in result.rows:  # the CPU figure beside the target's, and a roofline estimate from XLA:CPU's counts
        assert row.cpu_total_bytes <= budget < row.total_bytes and row.fits is False
        assert row.estimate["seconds"] > 0 and row.estimate["bound"] in ("compute", "memory", "interconnect")
        assert row.estimate["counts_from"] == "XLA:CPU"  # the CUDA compiler gives no cost analysis ahead of time


def test_max_minutes_starts_no_target_compile_after_the_bound():
    config, shape = _tiny()
    lines = []
    (result,) = target_search.search(config, shape, [4], targets.parse("h100x8"), layouts_to_try="all",
                                     max_minutes=1e-9, log=lines.append)
    assert result.rows == [] and len(result.not_compiled) == 6
    assert not any("compiling" in line for line in lines)
    assert lines[-1].startswith("--max-minutes 1e-09 reached: 6 layout(s) not compiled for h100x8: ")


def test_a_refusal_is_cached_as_a_refusal(tmp_path):
    config, shape = _tiny(256)  # the TPU compiler refuses it within seconds (needs 17.25 GiB of 15.75 GiB)
    builder = compiled_step.StepBuilder(config, shape)
    devices = targets.devices(targets.parse("v5e:2x2"))[:4]
    cache = target_compile.PlanCache(str(tmp_path))
    first = layout_search.measure(builder, (1, 4, 1, 1, 1), devices, None, compile_only=True, cache=cache)
    again = layout_search.measure(builder, (1, 4, 1, 1, 1), devices, None, compile_only=True, cache=cache)
    assert isinstance(first, target_compile.Refusal) and isinstance(again, target_compile.Refusal)
    assert not first.cached and again.cached and again.needed_bytes == first.needed_bytes


def _plan(cache: str, *arguments: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    environment["FULLRES_PLAN_CACHE"] = cache
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "plan", *arguments], capture_output=True, text=True,
                          env=environment, cwd=REPOSITORY, timeout=900)


def test_a_tpu_plan_is_cached_estimated_and_submitted_as_planned(tmp_path, vertex):  # noqa: F811
    arguments = ("--preset", "smoke", "--image-size", "16,16,16", "--partitions", "4", "--target", "v5e:2x2", "--json")
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
         "--pipeline-root", "gs://b/root", "--plan", str(plan_file), "--param", "steps=100",
         "--param", "train_input_uri=gs://b/train", "--api-endpoint", endpoint],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=300)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    (job,) = [r["body"] for r in requests if r["method"] == "POST" and "/pipelineJobs" in r["path"]]
    assert job["runtimeConfig"]["parameterValues"] == {**launch["parameters"], "steps": 100,
                                                       "train_input_uri": "gs://b/train"}
