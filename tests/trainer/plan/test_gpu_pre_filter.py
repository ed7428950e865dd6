"""`fullres plan --target h100x1` compiles for the GPU a bfloat16 step whose CPU figure alone is over the H100's
memory: XLA:CPU lays out more bytes for a bfloat16 step than for the float32 one, 1.6 to 4.9 times what the H100's
compiler does (docs/plan-targets.md, "The GPU's bytes against the CPU's"), so the CPU figure is no lower bound there.
The plan used to leave such a layout uncompiled (its CPU figure exceeded the memory) and call it too big.

The tiny UNet (2 levels, 4 filters) at 672³ keeps both compiles to seconds while its CPU figure passes 80 GiB.
"""

import importlib.metadata

import pytest

from trainer.plan import memory_plan, target_search, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]


def test_a_bfloat16_step_over_the_memory_on_the_cpu_is_compiled_for_the_h100_and_fits():
    lines = []
    plan = memory_plan.run(model="unet3d", preset="smoke", settings={"precision": "bfloat16"},
                           image_size=(672, 672, 672), partitions=[1], target="h100x1", use_cache=False,
                           log=lines.append)
    memory = targets.memory_per_device(targets.parse("h100x1"))
    (result,) = plan.results
    assert not result.over_estimate and "not compiled" not in "\n".join(lines)
    assert any(line.startswith("[h100x1 1/1] compiling 1,1,1,1,1") for line in lines)
    (row,) = result.rows
    assert row.cpu_total_bytes > memory  # the old pre-filter (CPU figure over the memory) stopped here
    assert row.total_bytes * 2 < row.cpu_total_bytes  # the H100's compiler's own figure, well under the CPU's
    assert row.total_bytes <= memory and row.fits  # and it fits one H100
    # The total is the device's: the compiler's figure and what the device adds (workspace, held state, margin).
    assert row.device_terms["compiler_bytes"] == row.compiler_total_bytes < row.total_bytes
    assert row.device_terms["workspace_bytes"] > 0 and row.device_terms["margin"] == 1.05
    assert plan.to_json()["compiler"]["compiler_versions"]["jax"] == importlib.metadata.version("jax")
    assert plan.launch is not None and plan.launch["input_partition_dims"] == [1, 1, 1, 1, 1]
    # What the pre-filter still skips on a GPU: a CPU figure over ten times the memory (`LEAST_SHARE_OF_CPU`).
    assert row.cpu_total_bytes * target_search.LEAST_SHARE_OF_CPU["cuda"] <= memory
