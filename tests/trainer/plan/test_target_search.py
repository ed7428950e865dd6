"""The layout search on a target's compiler: pruned by the CPU's figures first, bounded in time, and a refusal in
the plan cache (the README's test command runs these with the `tpu` and `cuda` groups, apart). The command
end to end, its cache and the submission: test_target_plan_submit.py (a file of its own, so that xdist runs it
beside this one).

The tiny UNet (2 levels, 4 filters, 16³) keeps each compile to seconds: the GPU compiler (JAX's CUDA plug-in,
no GPU present) for the search itself, the TPU compiler for the refusal the cache keeps.
"""

import pytest

from trainer.plan import compiled_step, layout_measure, memory_plan, plan_row, target_compile, target_search, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]


def _tiny(size: int = 16):
    config = compiled_step.plan_config("unet3d", "smoke", {"partition.input_partition_dims": "1,4,1,1,1"})
    assert (config.model.num_levels, config.model.base_filters) == (2, 4)
    return config, compiled_step.example_shape(config, (size,) * 3)


def test_a_gpu_target_reports_the_cuda_compilers_memory():
    cpu = layout_measure.compile_layout(*_tiny(), targets.parse("cpu"))
    gpu = layout_measure.compile_layout(*_tiny(), targets.parse("h100x8"))
    assert isinstance(gpu, plan_row.PlanRow) and gpu.fits
    assert gpu.total_bytes != cpu.total_bytes and gpu.temp_bytes != cpu.temp_bytes
    assert gpu.activation_all_gathers == 0 and gpu.halo_bytes > 0


def test_the_search_prunes_by_the_cpu_figure_before_compiling_for_the_target():
    config, shape = _tiny()
    lines = []
    # A GPU layout is left uncompiled only where its CPU figure times the GPU compiler's least measured share of it
    # (with a margin: `LEAST_SHARE_OF_CPU`) exceeds the memory. The budget lies between that share of the CPU figures
    # of the one-axis splits (659.8-667.8 KiB) and of the two-axis ones (688.4 KiB), as measured after the step took
    # its inputs as int16 and uint8 (before: 674.6 and 705.7 KiB).
    share = target_search.LEAST_SHARE_OF_CPU["cuda"]
    assert share < 1  # XLA's GPU compiler lays out less than the CPU's bytes for bfloat16 steps (docs/plan-targets.md)
    budget = int(678 * 1024 * share)
    (result,) = target_search.search(config, shape, [4], targets.parse("h100x8"), layouts_to_try="all",
                                     device_memory=budget, log=lines.append)
    over = {dims for dims, _ in result.over_estimate}
    assert over == {(1, 2, 2, 1, 1), (1, 2, 1, 2, 1), (1, 1, 2, 2, 1)}
    assert all(cpu_bytes * share > budget for _, cpu_bytes in result.over_estimate)
    assert result.over_estimate_why.startswith(f"exceeds {1 / share:g} times ")  # the plan says why, not just that
    assert any(line.startswith("3 layout(s) not compiled for h100x8: their CPU figure per device exceeds")
               for line in lines)
    compiled = [line for line in lines if line.startswith("[h100x8") and "compiling" in line]
    assert len(compiled) == 3 and not any(",".join(map(str, d)) in " ".join(compiled) for d in over)
    assert {r.input_partition_dims for r in result.rows} == {(1, 4, 1, 1, 1), (1, 1, 4, 1, 1), (1, 1, 1, 4, 1)}
    for row in result.rows:  # the CPU figure beside the target's, and a roofline estimate from XLA:CPU's counts
        assert row.cpu_total_bytes * share <= budget < row.total_bytes and row.fits is False
        assert row.estimate["seconds"] > 0 and row.estimate["bound"] in ("compute", "memory", "interconnect")
        assert row.estimate["counts_from"] == "XLA:CPU"  # the CUDA compiler gives no cost analysis ahead of time


def test_max_minutes_starts_no_target_compile_after_the_bound_and_a_plan_of_nothing_is_refused():
    lines = []
    with pytest.raises(ValueError) as refused:  # the plan command: not "none fits, try more partitions"
        memory_plan.run(model="unet3d", preset="smoke", image_size=(16, 16, 16), partitions=[4], layouts_to_try="all",
                        target="h100x8", max_minutes=1e-9, use_cache=False, log=lines.append)
    assert not any("compiling" in line for line in lines)
    assert lines[-1].startswith("--max-minutes 1e-09 reached: 6 layout(s) not compiled for h100x8: ")
    assert str(refused.value).startswith("--max-minutes 1e-09 ran out after the CPU estimates (")
    assert str(refused.value).endswith("before any of the 6 layout(s) was compiled for h100x8, so nothing was planned "
                                       "on it; give it more time (a h100x8 compile takes about a minute here), e.g. "
                                       "--max-minutes 30, or leave --max-minutes out.")


def test_a_refusal_is_cached_as_a_refusal(tmp_path):
    config, shape = _tiny(256)  # the TPU compiler refuses it within seconds (needs 17.25 GiB of 15.75 GiB)
    builder = compiled_step.StepBuilder(config, shape)
    devices = targets.devices(targets.parse("v5e:2x2"))[:4]
    cache = target_compile.PlanCache(str(tmp_path))
    first = layout_measure.measure(builder, (1, 4, 1, 1, 1), devices, None, compile_only=True, cache=cache)
    again = layout_measure.measure(builder, (1, 4, 1, 1, 1), devices, None, compile_only=True, cache=cache)
    assert isinstance(first, target_compile.Refusal) and isinstance(again, target_compile.Refusal)
    assert not first.cached and again.cached and again.needed_bytes == first.needed_bytes
