"""A trained run saved and loaded in one place: predict, evaluate, export and the pipelines' steps all load it here.

`fullres train` leaves in its output folder what a run is (`train_config.json`,
`model_info.json`: the task, the input shape, the class names, the preprocessing
of the training scans), a user's network as a copy of its file
(`model_source.py`), and the weights (`model.keras`); `engine.run_files` reads
and writes each file (`run_files.save_description`: what training writes at its start). This module turns them
into something usable:

* `open_run`: the config, the task (with the class names the run was trained with) and `model_info.json`;
* `load_model`: the network rebuilt from the config (fullres's own, or the user's from the run's copy of its
  file) and given the trained weights;
* `load`: the same, placed on a mesh for partitioned inference;
* `load_split`: placed under the split the devices present allow (`parallel.device_split`): predict (scans and
  videos) and evaluation all load a run this one way.

The network is rebuilt and given the weights rather than loaded whole: KerasHub's
backbones inside the detector do not survive `keras.saving.load_model`, and a
rebuilt model is the one the trainer compiled.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from collections.abc import Sequence

from trainer import config as config_lib
from trainer.engine import placement, run_files
from trainer.parallel import device_mesh, device_split
from trainer.tasks import base, registry


class ModelFileDamaged(ValueError):
    """A run's `model.keras` cannot be read; the message names it and what to do."""


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What a run folder says the run is (nothing built yet)."""

    directory: str
    config: config_lib.TrainConfig  # a user's network names the run's copy of its file
    task: base.Task  # its class names those the run was trained with
    info: dict  # model_info.json


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A trained network placed for partitioned inference (`load`)."""

    run: TrainedRun
    config: config_lib.TrainConfig  # the run's, split as `load` was asked
    model: object  # keras.Model
    state: placement.TrainState  # the weights, replicated on the mesh (no optimizer state)
    distribution: device_mesh.SpatialParallel


@dataclasses.dataclass(frozen=True)
class Record:
    """What a run folder records of what defines it, read without building anything (`engine.run_record` holds a
    rerun, and held-out data, to it)."""

    directory: str
    train_config: dict | None  # train_config.json as written; None where no readable run is there yet
    info: dict  # model_info.json; {} where there is none
    history: list[dict]  # run_record.json's history; [] for a run from before it was written


def read_record(run_dir: str) -> Record:
    """The `Record` of `run_dir` (empty where no run is there)."""
    info = read_info(run_dir) if os.path.isfile(run_files.path(run_dir, run_files.MODEL_INFO)) else {}
    return Record(run_dir, run_files.read_train_config_dict(run_dir), info,
                  run_files.read_run_record(run_dir).get("history") or [])


def read_info(run_dir: str) -> dict:
    """The run's `model_info.json` alone (predict checks it before anything is built).

    Raises:
        FileNotFoundError: there is none. ValueError: it cannot be parsed.
    """
    return run_files.read_model_info(run_dir)


def open_run(run_dir: str) -> TrainedRun:
    """The run `fullres train` left in `run_dir`: config, task and model_info.json.

    Raises:
        FileNotFoundError: `run_dir` is not the output directory of `fullres train`.
        ValueError: its `train_config.json` is damaged (the sentence names it and the fix).
    """
    config = run_files.read_train_config(run_dir)
    task = registry.make_task(config)
    info = read_info(run_dir) if os.path.exists(run_files.path(run_dir, run_files.MODEL_INFO)) else {}
    if info.get("class_names"):  # the names the model was trained with, wherever its training data is now
        task.class_names = info["class_names"]
    return TrainedRun(run_dir, config, task, info)


def load_model(run: TrainedRun):
    """The run's network, rebuilt from its config and given the trained weights (`model.keras`).

    Build it inside a distribution's scope to place it.

    Raises:
        ModelFileDamaged: `model.keras` is cut short or its contents do not decompress (a copy or a save that
            did not finish).
    """
    model = run.task.build_model()
    path = run_files.path(run.directory, run_files.MODEL)
    try:
        model.load_weights(path)
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:
        why = "not a complete Keras archive" if isinstance(error, zipfile.BadZipFile) else f"{error}".strip()
        raise ModelFileDamaged(
            f"{path} is damaged ({why}, {os.path.getsize(path)} bytes); copy model.keras again from the run "
            "that trained it, or retrain with `fullres train`.") from None
    return model


def load(run: TrainedRun | str, devices=None, input_partition_dims: Sequence[int] | None = None) -> Loaded:
    """The run's network with its weights, placed for partitioned inference.

    Args:
        run: a `TrainedRun`, or the run's folder.
        devices: the devices to use (all by default).
        input_partition_dims: split the inputs like this instead of as in training.

    Returns:
        A `Loaded` with the training partitioning (or `input_partition_dims`) and the largest number of replicas
        the devices hold that divides the training batch.

    Raises:
        partitioning.PartitionError: the split needs more devices than there are.
    """
    import jax

    run = open_run(run) if isinstance(run, str) else run
    config = run.config if input_partition_dims is None else config_lib.with_dims(run.config, input_partition_dims)
    devices = devices or jax.devices()
    cores = config.partition.num_cores_per_replica
    device_mesh.require_devices(cores, len(devices),
                                 f"the model's input_partition_dims {list(config.partition.input_partition_dims)}")
    replicas = max(d for d in range(1, len(devices) // cores + 1) if config.batch_size % d == 0)
    distribution = device_mesh.make_distribution(config.partition, devices[: replicas * cores])
    with distribution.scope():
        model = load_model(run)
    return Loaded(run, config, model, placement.place_state(placement.weights_state(model), distribution), distribution)


def load_split(run: TrainedRun, asked: Sequence[int] | None = None, *, one_replica: bool = False,
               devices=None) -> tuple[Loaded, dict]:
    """The run's network placed under the split the devices present allow, and that choice as outputs keep it.

    The split is `device_split.choose`'s: `asked` (`--input-partition-dims`), else the training split where the
    devices hold it, else its axes in fewer parts. `fullres predict` (scans and videos: `one_replica`, one
    volume at a time) and evaluation (as many replicas as the devices hold and the batch divides) load so.

    Returns:
        (the `Loaded` model, `device_split.record` of the choice: `input_partition_dims`, `trained_with`,
        `devices_present`, `why`).

    Raises:
        partitioning.PartitionError: the split asked for needs more devices than are present.
    """
    import math

    import jax

    devices = list(devices or jax.devices())
    trained = run.config.partition.input_partition_dims
    dims, why = device_split.choose(trained, asked, len(devices))
    cores = math.prod(dims)
    device_mesh.require_devices(cores, len(devices), f"input_partition_dims {list(dims)}",
                                "pass --input-partition-dims with fewer parts")
    loaded = load(run, devices[:cores] if one_replica else devices, dims)
    return loaded, device_split.record(dims, trained, len(devices), why)
