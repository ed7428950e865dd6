"""The one owner of the files a training run writes into its output directory (checkpoints: `engine.checkpoints`).

    train_config.json   the run's TrainConfig (read back by evaluation, export, predict)
    model_info.json     the task, the shape of one input, class names, the preprocessing of the training scans and
                        what they turned out to be (modality, intensity range)
    history.jsonl       one line per logged step (survives resumes)
    metrics.json        final loss, per-class Dice or COCO AP, timing, partitioning
    model.keras         the trained weights
    model_source.py     a user's own network (`--model FILE.py:FUNCTION`): a copy of its file, which
                        train_config.json names, so the run rebuilds it wherever it is read
    run_record.json     the training data's fingerprint and the run's history of starts, resumes and changes
                        (`engine.run_record` keeps a rerun to what the run means)

Every reader and writer of these files is here, so each has one rule; `trainer.trained_run` loads a run
through them.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import math
import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from common import file_writes, output_guard, output_lock

if TYPE_CHECKING:  # imported where used: config imports Keras, and `fullres predict` refuses a wrong --model first
    from trainer import config as config_lib

TRAIN_CONFIG = "train_config.json"
MODEL_INFO = "model_info.json"
HISTORY = "history.jsonl"
METRICS = "metrics.json"
MODEL = "model.keras"
MODEL_SOURCE = "model_source.py"
RUN_RECORD = "run_record.json"
CHECKPOINTS = "checkpoints"


def path(run_dir: str, name: str) -> str:
    """Where the run file `name` (one of the constants above) lies in `run_dir`."""
    return os.path.join(run_dir, name)


def _write_json(file_path: str, content, indent: int | None = 2) -> None:
    """Whole or not at all: written beside, then renamed over (a kill leaves the old file, never half a new one)."""
    _write_whole(file_path, lambda file: json.dump(content, file, indent=indent))


def _write_whole(file_path: str, write) -> None:
    """`write(file)` into `FILE.tmp`, renamed over `file_path`; a failed write (a full disk) removes `FILE.tmp`."""
    with file_writes.whole(file_path, file_path + ".tmp") as temporary, open(temporary, "w") as file:
        write(file)


def write_train_config(run_dir: str, config: config_lib.TrainConfig) -> None:
    """Writes `train_config.json`; a user's network is copied in first (`MODEL_SOURCE`), and the config names the copy."""
    from trainer import config as config_lib
    from trainer.models import user_model

    if isinstance(config.model, user_model.UserModelConfig):
        copy = path(run_dir, MODEL_SOURCE)
        if not (os.path.exists(copy) and filecmp.cmp(config.model.file, copy, shallow=False)):
            with file_writes.whole(copy, copy + ".tmp") as temporary:
                shutil.copyfile(config.model.file, temporary)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, file=MODEL_SOURCE))
    _write_json(path(run_dir, TRAIN_CONFIG), config_lib.to_dict(config))


def read_train_config(run_dir: str) -> config_lib.TrainConfig:
    """The `TrainConfig` a run was trained with; a user's network is read from the run's own copy of its file.

    Raises:
        FileNotFoundError: `run_dir` is not the output directory of `fullres train`.
        ValueError: `train_config.json` is damaged (`damage`: the sentence names it and the fix).
    """
    from trainer import config as config_lib
    from trainer.models import user_model

    file_path = path(run_dir, TRAIN_CONFIG)
    if not os.path.exists(file_path):
        raise FileNotFoundError(f"{run_dir} has no {TRAIN_CONFIG}; pass the output directory of `fullres train`.")
    content, problem = _read_config(file_path)
    if problem is not None:
        raise ValueError(_damaged(file_path, problem, "read this run"))
    config = config_lib.from_dict(content)
    if isinstance(config.model, user_model.UserModelConfig):
        copy = os.path.abspath(path(run_dir, MODEL_SOURCE))
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, file=copy))
    return config


def holds_run(run_dir: str) -> bool:
    """Whether `run_dir` holds a run's files beside its `train_config.json` (alone, a file of that name may be
    anyone's)."""
    own_files = (MODEL_INFO, HISTORY, METRICS, MODEL, MODEL_SOURCE, RUN_RECORD, CHECKPOINTS)  # a user's network: its copy too
    return "://" not in run_dir and os.path.isfile(path(run_dir, TRAIN_CONFIG)) \
        and any(os.path.exists(path(run_dir, name)) for name in own_files)


def done_steps(run_dir: str) -> int:
    """The step of the run's newest checkpoint; 0 when it has none."""
    from trainer.engine import checkpoints  # JAX and Orbax: only where a run folder is judged

    directory = path(run_dir, CHECKPOINTS)
    steps = checkpoints.list_steps(directory) if os.path.isdir(directory) or "://" in run_dir else []
    return steps[-1] if steps else 0


def check_resumable(run_dir: str) -> None:
    """Refuses to resume a run whose `train_config.json` is damaged, naming it (without this, the run's own files
    would be called foreign: a directory is a run by its readable `train_config.json`).

    Raises:
        output_guard.OutputRefused: `run_dir` holds fullres's run files and a `train_config.json` that is not one.
    """
    file_path = path(run_dir, TRAIN_CONFIG)
    if "://" in run_dir or not os.path.isfile(file_path):
        return
    if not holds_run(run_dir):
        return  # a lone file of that name: the output guard judges the folder
    _, problem = _read_config(file_path)
    if problem is not None:
        raise output_guard.OutputRefused(_damaged(file_path, problem, "resume the run"))


def check_model_kept(run_dir: str) -> None:
    """Refuses a finished run whose checkpoints are gone: a rerun would start at step 1 and overwrite the model it
    holds (asked after `check_resumable`).

    Raises:
        output_guard.OutputRefused: the sentence names the model, the missing checkpoints and the fix.
    """
    model = path(run_dir, MODEL)
    if "://" in run_dir or not os.path.isfile(model) or not holds_run(run_dir) or done_steps(run_dir):
        return
    kept = path(run_dir, CHECKPOINTS)
    raise output_guard.OutputRefused(
        f"--output {run_dir} holds a trained model ({model}) but no checkpoint ({kept} is "
        f"{'empty' if os.path.isdir(kept) else 'missing'}), so a rerun would train from step 1 and overwrite that "
        f"model; put the run's checkpoints back into {kept} to resume it, or train into a new --output.")


def read_train_config_dict(run_dir: str) -> dict | None:
    """`train_config.json` as written (paths as the run gave them), or None where it is missing or damaged."""
    file_path = path(run_dir, TRAIN_CONFIG)
    return _read_config(file_path)[0] if os.path.isfile(file_path) else None


def read_run_record(run_dir: str) -> dict:
    """`run_record.json` (`engine.run_record`): {"history": [...]}; {} for a run from before it was written."""
    file_path = path(run_dir, RUN_RECORD)
    if not os.path.isfile(file_path):
        return {}
    try:
        with open(file_path, encoding="utf-8") as file:
            content = json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        content = f"{type(error).__name__}: {error}"
    if not isinstance(content, dict) or not isinstance(content.get("history", []), list):
        raise output_guard.OutputRefused(
            f"{file_path} is damaged ({content if isinstance(content, str) else 'it holds no history list'}), so "
            "fullres cannot tell what the run was trained on; copy it again from where the run came from (or a "
            "backup), or train into a new --output.")
    return content


def write_run_record(run_dir: str, content: dict) -> None:
    _write_json(path(run_dir, RUN_RECORD), content)


def _read_config(file_path: str) -> tuple[dict | None, str | None]:
    """(the parsed TrainConfig dict, None), or (None, what is wrong with the file)."""
    try:
        with open(file_path, encoding="utf-8") as file:
            content = json.load(file)
    except UnicodeDecodeError:
        return None, "it is not text"
    except json.JSONDecodeError as error:
        return None, f"not valid JSON, {error.msg.lower()} at line {error.lineno} column {error.colno}"
    if not isinstance(content, dict) or not isinstance(content.get("model"), dict) \
            or not isinstance(content.get("partition"), dict):
        return None, "it holds no model and partition settings"
    return content, None


def _damaged(file_path: str, problem: str, to: str) -> str:
    size = os.path.getsize(file_path)
    return (f"{file_path} is damaged ({problem}; {size} bytes), so fullres cannot {to}; fullres writes it whole, "
            "so a copy of the run was cut short or the file was changed since: copy train_config.json again from "
            "where the run came from (or a backup), or train again into a new --output.")


def not_a_run(run_dir: str) -> str | None:
    """The sentence refusing `run_dir` as a trained run (`model_info.json` or `model.keras` missing), or None: a run
    still training, one that stopped before its end, a finished run that lost its `model_info.json`, or no run.

    Cheap on purpose (no Keras, no JAX): `fullres predict` asks it before its heavy imports.
    """
    if all(os.path.isfile(path(run_dir, name)) for name in (MODEL_INFO, MODEL)):
        return None
    if holds_run(run_dir) and os.path.isfile(path(run_dir, MODEL)):  # finished: only its description is gone
        return (f"--model {run_dir} holds a trained model ({path(run_dir, MODEL)}) but no {MODEL_INFO}, which says "
                "what the model takes (its task, input shape and preprocessing); copy it back from where the run "
                "came from (or a backup).")
    if holds_run(run_dir):  # a run, but not a finished one
        lock = os.path.abspath(run_dir).rstrip("/") + output_lock.LOCK_SUFFIX
        if os.path.isfile(lock):
            with open(lock, errors="replace") as file:
                holder = file.read(200).strip() or "another process"
            return (f"--model {run_dir} is still training ({holder}) and has no {MODEL} yet; predict with it once "
                    f"the run has finished and written {path(run_dir, MODEL)}.")
        return (f"--model {run_dir} is a run that has not finished training: it has no {MODEL} yet; resume it "
                f"with `fullres train --output {run_dir}` (it goes on from its newest checkpoint), then predict.")
    return (f"--model {run_dir} is not a fullres run (it lacks {MODEL_INFO} or {MODEL}); "
            "pass the output directory of `fullres train`.")


def save_description(run_dir: str, config: config_lib.TrainConfig, task, image_shape: Sequence[int]) -> None:
    """What a run is, written when training starts: its config (with a copy of a user's network) and model_info.json
    of its task (`tasks.base.Task`); `export.save_model` writes the weights at its end."""
    write_train_config(run_dir, config)
    write_model_info(run_dir, task.name, image_shape, task.class_names, task.preprocessing(),
                     data_modality=task.data_modality())


def write_model_info(run_dir: str, task: str, image_shape, class_names: list[str] | None,
                     preprocessing: dict | None, data_modality: dict | None = None) -> None:
    """What predict and export need to know of the model: task, input shape, class names, the scans' preprocessing,
    and what the training scans turned out to be (`data_modality`: modalities and intensity range; left out when the
    data recorded none)."""
    info = {"task": task, "image_shape": list(image_shape), "class_names": class_names, "preprocessing": preprocessing}
    if data_modality is not None:
        info["data_modality"] = data_modality
    _write_json(path(run_dir, MODEL_INFO), info, indent=None)


def read_model_info(run_dir: str) -> dict:
    """`model_info.json` of a run.

    Raises:
        FileNotFoundError: there is none (not the output directory of `fullres train`).
        ValueError: it cannot be parsed (the message names the file).
    """
    file_path = path(run_dir, MODEL_INFO)
    if not os.path.exists(file_path):
        raise FileNotFoundError(f"{run_dir} has no {MODEL_INFO}; pass the output directory of `fullres train`.")
    try:
        with open(file_path) as file:
            return json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{MODEL_INFO} cannot be read ({error})") from None


def read_history(run_dir: str, up_to_step: float = math.inf) -> list[dict]:
    """The logged steps in `history.jsonl` up to `up_to_step` (all of them by default); [] when there is none."""
    file_path = path(run_dir, HISTORY)
    if not os.path.exists(file_path):
        return []
    with open(file_path) as file:
        entries = [json.loads(line) for line in file if line.strip()]
    return [e for e in entries if e["step"] <= up_to_step]


def loss_curve(run_dir: str) -> list[list[float]]:
    """[[step, loss], ...] of the run's history, for reports."""
    return [[entry["step"], entry["loss"]] for entry in read_history(run_dir)]


def write_history(run_dir: str, entries: list[dict]) -> None:
    _write_whole(path(run_dir, HISTORY), lambda file: file.writelines(json.dumps(e) + "\n" for e in entries))


def write_metrics(run_dir: str, results: dict) -> str:
    """Writes `metrics.json`; returns its path."""
    file_path = path(run_dir, METRICS)
    _write_json(file_path, results)
    return file_path


def read_metrics(run_dir: str) -> dict:
    with open(path(run_dir, METRICS)) as file:
        return json.load(file)
