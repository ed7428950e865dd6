"""Runs the suite makes once and shares: tiny segmentation and detection training runs, and `fullres demo`.

A session fixture in pytest-xdist is per worker, so two test files on two
workers would each train the same model. `once` makes a run at most once per
test session across workers: the first worker to ask makes it under a file lock
in the session's shared temporary folder (the parent of every worker's), the
others wait for it and read what it wrote. Tests treat a shared run as read-only;
one that must change it copies it first.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable

import filelock

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def session_folder(tmp_path_factory) -> pathlib.Path:
    """The temporary folder every xdist worker of this session shares (the base folder itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, make: Callable[[pathlib.Path], dict]) -> tuple[pathlib.Path, dict]:
    """`make(folder)` run once per session across workers; returns the folder and what `make` returned (as JSON).

    A failed `make` leaves no result behind, so a later test that asks again tries again and fails as loudly.
    """
    root = session_folder(tmp_path_factory) / "shared-runs"
    root.mkdir(exist_ok=True)
    folder, result = root / name, root / f"{name}.json"
    with filelock.FileLock(str(root / f"{name}.lock")):
        if not result.exists():
            if folder.exists():  # an earlier attempt failed half way: start from nothing
                import shutil

                shutil.rmtree(folder)
            folder.mkdir()
            made = make(folder)
            result.write_text(json.dumps(made))
    return folder, json.loads(result.read_text())


# ---------------------------------------------------------------------------------------------------------------
# The segmentation run: the smoke preset, 40 steps, each case split 4-way along depth (2 replicas on 8 devices).

SEGMENTATION_SETTINGS = dict(steps=40, learning_rate=1e-2, checkpoint_every=10, log_every=5)


def segmentation_config(folder: pathlib.Path):
    from trainer import presets
    from trainer.parallel import partitioning

    data = folder / "data"
    return presets.smoke(train_data=str(data / "train-*.tfrecord"), eval_data=str(data / "eval-*.tfrecord"),
                            output_dir=str(folder / "run"), partition=partitioning.PartitionConfig((1, 4, 1, 1, 1)),
                            **SEGMENTATION_SETTINGS)


def make_segmentation_run(folder: pathlib.Path) -> dict:
    """The demo records (as the `demo_data` fixture writes them) and the run trained on them; its results and log."""
    from preprocessing.ct import demo_ct
    from trainer import train

    written = demo_ct.write_demo_tfrecords(str(folder / "data"), num_train=6, num_eval=2, shape=(16, 16, 16), seed=1)
    config = segmentation_config(folder)
    assert (written["train"], written["eval"]) == (config.train_data, config.eval_data), written
    lines = []
    results = train.train(config, log=lines.append)
    return {"results": results, "lines": lines}


def copied_run(source: str, folder: pathlib.Path, **info) -> str:
    """A copy of the run in `source` under `folder`, its model_info.json updated with `info` (e.g. the
    preprocessing training would have recorded from real scans): for tests that must change a shared run."""
    output = str(folder / "run")
    shutil.copytree(source, output)
    info_path = os.path.join(output, "model_info.json")
    with open(info_path) as file:
        recorded = json.load(file)
    with open(info_path, "w") as file:
        json.dump({**recorded, **info}, file)
    return output


# ---------------------------------------------------------------------------------------------------------------
# `fullres demo`, short: the ct-segmentation pipeline once through kfp.local's SubprocessRunner.

DEMO_ARGUMENTS = ["--steps", "4", "--cases", "4", "--eval-cases", "2"]


def make_demo_run(folder: pathlib.Path) -> dict:
    """`fullres demo` into `folder/demo` as users run it (2 virtual CPU devices); its exit status and output."""
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "FULLRES_VERBOSE")}  # as users have
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "demo", "--output", str(folder / "demo"), *DEMO_ARGUMENTS],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=900,
    )
    return {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}


# ---------------------------------------------------------------------------------------------------------------
# The detection run: the detection demo preset, 8 steps (tests/trainer/detection_short_run.py).


def detection_config(folder: pathlib.Path):
    from tests.trainer import detection_short_run

    shapes = {split: str(folder / "shapes" / split / "data-*.tfrecord") for split in ("train", "eval")}
    return detection_short_run.make_config(shapes, str(folder / "run"))


def make_detection_run(folder: pathlib.Path) -> dict:
    from tests.trainer import detection_short_run

    results = detection_short_run.run(str(folder))
    assert results["loss_history"] and detection_config(folder).output_dir == str(folder / "run")
    return {"results": results}
