"""The train step compiled by a real target's compiler, on this CPU machine: TPU slices (libtpu).

The README's test command runs these with the `tpu` group, after the rest of the suite: libtpu, once installed,
writes its start-up warnings from every JAX process not pinned to the CPU. The `cuda` group stays out of the
suite: with JAX's CUDA plug-in installed, every JAX process on a machine without a GPU writes CUDA-driver lines
to stderr. GPU figures come from `benchmarks/results/target_plans.json` (measured with the `cuda` group); here
the GPU path is checked up to its install sentence.

A tiny UNet (2 levels, 4 filters, 16³) keeps a TPU compile to seconds on 2
cores; the over-budget layout is the same net at 256³, which the TPU compiler
refuses within a second of lowering. The figures the TPU compiler gives for the
16³ layout that fits are judged in test_target_plan_submit.py, whose plan
compiles that program (about 30 s here; once for both).
"""

import os
import subprocess
import sys

import pytest

from common import sizes
from trainer.plan import compiled_step, layout_measure, target_compile, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]


def _tiny(size: int, dims: str = "1,4,1,1,1"):
    config = compiled_step.plan_config("unet3d", "smoke", {"partition.input_partition_dims": dims})
    assert (config.model.num_levels, config.model.base_filters) == (2, 4)
    return config, compiled_step.example_shape(config, (size,) * 3)


def test_a_layout_over_the_tpus_memory_is_a_needs_x_of_y_row():
    refusal = layout_measure.compile_layout(*_tiny(256), targets.parse("v5e:2x2"))
    assert isinstance(refusal, target_compile.Refusal)
    assert refusal.available_bytes == targets.memory_per_device(targets.parse("v5e:2x2"))  # 15.75 GiB
    assert refusal.needed_bytes > refusal.available_bytes
    assert refusal.describe() == f"needs {sizes.human_bytes(refusal.needed_bytes)} of 15.75 GiB per device"
    assert refusal.to_json()["fits"] is False


REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINY = ["--preset", "smoke", "--partitions", "4"]  # smoke: the 2-level, 4-filter UNet


def _fullres(*arguments: str, hide_libtpu: bool = False, hide_cuda_plugin: str = "",
             cache: str | None = None) -> subprocess.CompletedProcess:
    """`fullres ARGUMENTS` in a fresh process (the plan command chooses the JAX platform before JAX starts)."""
    code = ("import runpy, sys\n"
            + ("sys.modules['libtpu'] = None  # `import libtpu` fails, as where the wheel is not installed\n"
               if hide_libtpu else "")
            + ("sys.modules['jax_plugins.xla_cuda12'] = None  # as where the CUDA plug-in is not installed\n"
               if hide_cuda_plugin == "plug-in" else "")
            + ("sys.modules['jax_plugins'] = None  # as where neither plug-in group is: no jax_plugins package\n"
               if hide_cuda_plugin == "package" else "")
            + f"sys.argv = ['fullres', *{list(arguments)!r}]\n"
            + "runpy.run_module('pipelines.cli', run_name='__main__')\n")
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "TPU_LIBRARY_PATH")}
    if cache is not None:
        environment["FULLRES_PLAN_CACHE"] = cache  # the test's own: figures from no earlier run
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=REPOSITORY, timeout=900)


def test_plan_command_turns_a_layout_over_the_tpus_memory_into_a_needs_x_of_y_row(tmp_path):
    result = _fullres("plan", *TINY, "--image-size", "256,256,256", "--target", "v5e:2x2", cache=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on v5e:2x2 (TPU v5 lite, 15.75 GiB per device), that compiler's figures" in result.stdout
    row = [line for line in result.stdout.splitlines() if "N=4: 1,4,1,1,1 needs" in line]
    assert len(row) == 1 and row[0].endswith("of 15.75 GiB per device: the target's compiler refuses it"), result.stdout
    assert "none of [4] fits 15.75 GiB per device" in result.stdout
    assert "Traceback" not in result.stderr


def _the_one_sentence(result: subprocess.CompletedProcess) -> str:
    """The command failed with exit 2 and exactly one `fullres: error:` line, no traceback; returns its sentence."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0].removeprefix("fullres: error: ")


def test_without_libtpu_the_plan_command_says_how_to_install_it_in_one_sentence():
    sentence = _the_one_sentence(_fullres("plan", *TINY, "--image-size", "16,16,16", "--target", "v5e:2x2",
                                          hide_libtpu=True))
    assert sentence.startswith("--target v5e:2x2 compiles with the TPU compiler, libtpu (libtpu==")
    assert sentence.endswith(".") and ". " not in sentence and "uv sync --group tpu" in sentence


@pytest.mark.parametrize("hidden", ["plug-in", "package"])  # "package": find_spec raised, a traceback before
def test_without_the_cuda_plugin_a_gpu_target_says_how_to_install_it_in_one_sentence(hidden):
    sentence = _the_one_sentence(_fullres("plan", *TINY, "--image-size", "16,16,16", "--target", "h100x8",
                                          hide_cuda_plugin=hidden))
    assert sentence.startswith("--target h100x8 compiles with JAX's CUDA 12 plug-in, which is not installed; ")
    assert sentence.endswith(".") and "uv sync --group cuda" in sentence
