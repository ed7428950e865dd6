"""The train step compiled by a real target's compiler, on this CPU machine: TPU slices (libtpu) and GPUs (JAX's CUDA plug-in).

A tiny UNet (2 levels, 4 filters, 16³) keeps a TPU compile to seconds on 2
cores; the over-budget layout is the same net at 256³, which the TPU compiler
refuses within a second of lowering.
"""

import os
import subprocess
import sys

import pytest

from trainer import memory_plan
from trainer.plan import target_compile, targets

pytestmark = pytest.mark.slow


def _tiny(size: int, dims: str = "1,4,1,1,1"):
    config = memory_plan.plan_config("unet3d", "smoke", {"partition.input_partition_dims": dims})
    assert (config.model.num_levels, config.model.base_filters) == (2, 4)
    return config, memory_plan.example_shape(config, (size,) * 3)


@pytest.fixture(scope="module")
def cpu_row():
    return target_compile.compile_layout(*_tiny(16), targets.parse("cpu"))


def test_a_tpu_slice_reports_the_tpu_compilers_memory(cpu_row):
    row = target_compile.compile_layout(*_tiny(16), targets.parse("v5e:2x2"))
    assert isinstance(row, memory_plan.PlanRow) and row.fits
    assert row.total_bytes != cpu_row.total_bytes
    # TPUs tile the two minor dimensions of every array by (8, 128): the 4-channel weights and their optimizer
    # slots are padded toward 128 lanes, so the TPU holds many times the CPU's argument bytes.
    assert row.argument_bytes > 4 * cpu_row.argument_bytes
    assert row.activation_all_gathers == 0 and row.halo_bytes > 0  # halo exchange, and nothing gathered


def test_a_gpu_target_reports_the_gpu_compilers_memory(cpu_row):
    row = target_compile.compile_layout(*_tiny(16), targets.parse("h100x8"))
    assert isinstance(row, memory_plan.PlanRow) and row.fits
    assert row.temp_bytes != cpu_row.temp_bytes
    assert row.activation_all_gathers == 0 and row.halo_bytes > 0


def test_a_layout_over_the_tpus_memory_is_a_needs_x_of_y_row():
    refusal = target_compile.compile_layout(*_tiny(256), targets.parse("v5e:2x2"))
    assert isinstance(refusal, target_compile.Refusal)
    assert refusal.available_bytes == targets.memory_per_device(targets.parse("v5e:2x2"))  # 15.75 GiB
    assert refusal.needed_bytes > refusal.available_bytes
    assert refusal.describe(targets.parse("v5e:2x2")).startswith(
        f"needs {memory_plan.human(refusal.needed_bytes)} of 15.75 GiB per device")
    assert refusal.to_json()["fits"] is False


HIDE_LIBTPU = """
import sys
sys.modules["libtpu"] = None  # `import libtpu` fails, as where the wheel is not installed
from trainer.plan import targets
try:
    targets.devices(targets.parse("v5e:2x2"))
except targets.MissingCompiler as error:
    print(error)
"""


def test_without_libtpu_a_tpu_target_says_how_to_install_it_in_one_sentence():
    environment = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}
    result = subprocess.run([sys.executable, "-c", HIDE_LIBTPU], capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    sentence = result.stdout.strip()
    assert "\n" not in sentence and sentence.endswith(".") and sentence.count(". ") == 0
    assert sentence.startswith("--target v5e:2x2 compiles with the TPU compiler, libtpu (libtpu==")
    assert "uv sync --group tpu" in sentence
