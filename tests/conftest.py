"""Test set-up: 8 virtual CPU devices and the JAX backend, before anything imports JAX.

Every partitioning test runs on these 8 devices (docs/design.md, "Testing without
accelerators"); nothing skips for lack of devices.
"""

import os
import sys

# Bytecode is written where Python writes it by default, by the processes that import a module first. This
# project's CI machine sets PYTHONDONTWRITEBYTECODE, so pytest rewrote and compiled every test file in every worker
# (collecting the fast tier: 14.6-16.5 s, 12.2-14.0 s with the rewritten files kept; measured 2026-11-26), and every
# command a test starts compiled TensorFlow, JAX and Keras from source (`import tensorflow` 13.9 s of CPU, 5.0 s from
# bytecode). The README's test command no longer writes the environment's bytecode at install
# (`uv run --no-compile-bytecode`: 18,669 files, 41 s of its set-up, when the suite's processes import ~6,700):
# the test processes and the commands they start write what they import, once.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from common import startup  # noqa: E402

startup.collect_after_imports()  # as every fullres command does: each worker imports every test module's libraries

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    + ["--xla_force_host_platform_device_count=8"]
)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import pytest  # noqa: E402

import trainer  # noqa: E402,F401  (chooses the Keras backend before TensorFlow loads)


# The suite's longest files, longest first (test-seconds in the last full run, 2026-11-24). With
# `--no-loadscope-reorder` (pyproject's addopts) xdist hands files to its workers in collection order, so these
# start first and the short files fill in around them (longest-processing-time-first); xdist's own order, by the
# number of tests in a file, left one worker idle for the last minutes. Files not listed keep their order.
LONGEST_FIRST = (
    # The target tier (its own session, `-m target tests/trainer/plan`), longest first (test-seconds in the clean-clone
    # run of 2026-12-07, 132 s in all): the GPU search ~50 s, the Triton fallback ~43 s, the TPU kernels ~25 s, the
    # smallest-slice search ~22 s, the submitted TPU plan ~20 s, the plan that says what runs ~16 s; the rest (cache
    # flags, a user's network, the compile refusals: 5-15 s each) fill in around them.
    "tests/trainer/plan/test_target_search.py",
    "tests/trainer/plan/test_gpu_compile_fallback.py",
    "tests/trainer/plan/test_target_kernels.py",
    "tests/trainer/plan/test_target_rent.py",
    "tests/trainer/plan/test_target_plan_submit.py",
    "tests/trainer/plan/test_target_plan_says_what_runs.py",
    # The suite.
    "tests/trainer/parallel/test_multiprocess.py",  # ~190 s: 2-process runs, kills and reruns
    "tests/container/test_container_image.py",  # ~340 s: the image, the DockerRunner pipeline
    "tests/pipelines/test_detection_pipeline.py",  # ~165 s
    "tests/trainer/test_detection_train.py",  # ~85 s: the 8-step golden run, the border test
    "tests/trainer/test_train.py",  # ~100 s: kill -9 and resume, a damaged checkpoint
    "tests/pipelines/test_no_patient_names.py",  # a whole pseudonymized pipeline run with a user's network
    "tests/trainer/parallel/test_user_network_parity.py",  # three networks, four compiles each
    "tests/trainer/test_user_model_run.py",  # train a user's network twice, predict in a fresh process
    "tests/pipelines/test_cli.py",  # ~65 s with the disk-full runs
    "tests/benchmarks/test_peer_bench.py",  # ~60 s (2026-12-07): the tiny side-by-side run, the weights held equal
    "tests/trainer/test_transposed_network_run.py",  # ~40 s: a user's network with transposed convolutions, split
    "tests/trainer/plan/test_memory_plan.py",  # ~33 s
    "tests/trainer/test_attention_network_run.py",  # ~30 s
    "tests/trainer/plan/test_layout_choice.py",  # ~30 s: train picks a layout, records it and reuses it
    "tests/trainer/predict/test_predict_outputs.py",  # ~35 s: disk-full predicts
    "tests/trainer/predict/test_predict_limits.py",  # predict under a memory limit
    "tests/trainer/predict/test_predict_checks.py",
    "tests/components/test_components.py",
    "tests/test_layers.py",
    "tests/preprocessing/beam/test_images_pipeline.py",
)


# The README's test command collects the target tier from this folder only: collecting every test file costs each
# worker 16 s of imports (3.5 s for this folder; measured 2026-11-26). A target test anywhere else would be skipped
# there without a word, so collecting one is an error.
TARGET_FOLDER = "tests/trainer/plan/"


def pytest_collection_modifyitems(session, config, items):
    elsewhere = [item.nodeid for item in items
                 if item.get_closest_marker("target") and not item.nodeid.startswith(TARGET_FOLDER)]
    if elsewhere:
        raise pytest.UsageError(f"{elsewhere[0]} is marked target but lies outside {TARGET_FOLDER}, the one folder the "
                                f"README's test command collects the target tier from; move it there.")
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


# fullres's own packages, compiled to bytecode before the workers start. Where PYTHONDONTWRITEBYTECODE is set (this
# project's CI machine sets it) nothing writes their bytecode, and every Python process the suite starts (several
# hundred: each command, pipeline step and Beam worker) compiled those of the ~230 it imports from source again:
# importing the trainer, predict, the CLI, the CT pipeline and the components took 7.3-7.8 s without, 6.4 s with
# (measured 2026-11-26). Dependencies are compiled at install (pyproject's compile-bytecode); fullres itself is
# installed editable, from these folders. The files go to the folders' __pycache__ (git ignores them); Python
# checks each against its source's time and size, so an edited module is compiled again, never read stale.
OWN_PACKAGES = ("common", "preprocessing", "trainer", "pipelines", "components", "fullres", "tests")


def _compile_own_bytecode(root: str) -> None:
    import compileall

    for package in OWN_PACKAGES:
        compileall.compile_dir(os.path.join(root, package), quiet=1)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # once, in the process that starts the xdist workers (or runs alone)
        _compile_own_bytecode(str(config.rootpath))
    count = jax.device_count()
    if count != 8:
        raise pytest.UsageError(f"tests need 8 virtual CPU devices, JAX sees {count}; was JAX imported before conftest?")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory):
    """Tiny synthetic CT TFRecords: 6 training and 2 held-out cases of 16³."""
    from preprocessing.ct import demo_ct

    directory = tmp_path_factory.mktemp("demo_data")
    return demo_ct.write_demo_tfrecords(str(directory), num_train=6, num_eval=2, shape=(16, 16, 16), seed=1)



@pytest.fixture(scope="session")
def segmentation_run(tmp_path_factory):
    """The tiny segmentation run, trained once per session (every xdist worker shares it): the smoke preset, 40
    steps on the demo records, split 4-way along depth (2 replicas × 4 cores). Returns (config, results, log lines).

    Read-only: a test that must change the run (predict's model_info.json) copies it first.
    """
    from tests import shared_runs

    folder, made = shared_runs.once(tmp_path_factory, "segmentation", shared_runs.make_segmentation_run)
    return shared_runs.segmentation_config(folder), made["results"], made["lines"]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`fullres demo` (short: 4 steps, 4 + 2 cases), run once per session through the SubprocessRunner and shared by
    tests/pipelines/test_demo.py and the container test, which runs the same pipeline on the same scans in Docker.
    Returns (completed process fields, summary.json, the demo's output folder)."""
    import json
    import types

    from tests import shared_runs

    folder, made = shared_runs.once(tmp_path_factory, "demo", shared_runs.make_demo_run)
    assert made["returncode"] == 0, made["stdout"][-3000:] + made["stderr"][-3000:]
    output = folder / "demo"
    return types.SimpleNamespace(**made), json.loads((output / "summary.json").read_text()), output


@pytest.fixture(scope="session")
def detection_run(tmp_path_factory):
    """The tiny detection run, trained once per session: the detection demo preset for 8 steps on the synthetic
    shapes (tests/trainer/detection_short_run.py). Returns (config, results)."""
    from tests import shared_runs

    folder, made = shared_runs.once(tmp_path_factory, "detection", shared_runs.make_detection_run)
    return shared_runs.detection_config(folder), made["results"]
