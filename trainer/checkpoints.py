"""Checkpoints: the whole `TrainState` and the step, written atomically.

A checkpoint is one `.npz` file named after its step. It is written to a
temporary name and renamed into place, so a crash leaves either the previous
checkpoint or the new one, never half a file; restarting the same run in the
same output directory resumes from the newest one.
"""

from __future__ import annotations

import os
import re

import numpy as np

from trainer import step

_NAME = re.compile(r"^ckpt-(\d{8})\.npz$")


def _path(directory: str, step_number: int) -> str:
    return os.path.join(directory, f"ckpt-{step_number:08d}.npz")


def list_steps(directory: str) -> list[int]:
    """Steps of the complete checkpoints in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(directory) if (m := _NAME.match(name)))


def save(directory: str, step_number: int, state: step.TrainState, keep: int = 3) -> str:
    """Writes the checkpoint for `step_number` and deletes all but the newest `keep`."""
    os.makedirs(directory, exist_ok=True)
    arrays = {"step": np.asarray(step_number, np.int64)}
    for group, values in state._asdict().items():
        for i, value in enumerate(values):
            arrays[f"{group}/{i:05d}"] = np.asarray(value)
    final = _path(directory, step_number)
    temporary = final + ".tmp"
    with open(temporary, "wb") as file:
        np.savez(file, **arrays)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, final)
    for old in list_steps(directory)[:-keep]:
        os.remove(_path(directory, old))
    return final


def restore_latest(directory: str, like: step.TrainState) -> tuple[step.TrainState, int] | None:
    """Loads the newest checkpoint into host arrays shaped like `like`, or None if there is none.

    Raises:
        ValueError: when the checkpoint does not fit the model (another config wrote it).
    """
    steps = list_steps(directory)
    if not steps:
        return None
    path = _path(directory, steps[-1])
    with np.load(path) as data:
        groups = {}
        for group, values in like._asdict().items():
            restored = []
            for i, value in enumerate(values):
                key = f"{group}/{i:05d}"
                if key not in data or data[key].shape != np.shape(value):
                    raise ValueError(
                        f"checkpoint {path} does not match this model ({key}); resume with the configuration that "
                        "wrote it, or train into a new --output directory."
                    )
                restored.append(data[key])
            groups[group] = restored
        return step.TrainState(**groups), int(data["step"])
