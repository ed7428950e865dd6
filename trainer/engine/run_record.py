"""What defines a training run, and the rule a rerun into its folder keeps (`fullres train --output RUN` again).

A run folder means one thing: this model, trained on these data, this way. The
record of that is what the run keeps (read back by `trained_run.read_record`):

* `train_config.json`: the model, patch mode, augmentation recipe, partition,
  schedule, optimizer, batch, precision and seed (every setting but those in
  `MAY_CHANGE` and the paths);
* `model_source.py`: the run's copy of a user's network, compared by its SHA-256;
* `run_record.json`: the training data's fingerprint, which is what its
  preprocessing recorded (`summary.json`'s `preprocessing`: spacing, orientation,
  window, modality, shape; the record kind; `label_map.json`), and the run's
  history: one line per start, resume or change of meaning.

`check_rerun` refuses, in one sentence naming the setting, both values and the
fix, a rerun that would change any of them, before anything is written; with
`continue_with_changes` (`fullres train --continue-with-changes`) it goes on, and
the change is recorded in the history. Settings in `MAY_CHANGE` change freely
and are logged. A rerun asking for fewer steps than the run has done is refused:
there is nothing to train.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from common import parsing
from preprocessing.records import dataset_files
from trainer.engine import run_data, run_files

if TYPE_CHECKING:
    from trainer import config as config_lib

# May differ between the runs of one folder: how long to train, how often to save and log, memory and input
# tricks that do not change the arithmetic, and the held-out data (scored at the end, checked on its own).
MAY_CHANGE = ("steps", "epochs", "checkpoint_every", "keep_checkpoints", "log_every", "input_cache", "allow_gathers",
              "remat", "eval_data", "kernels")  # kernels: the same values computed otherwise (kernels.py)
_PATHS = ("train_data", "output_dir", "model.file")  # where things are; the data are judged by their fingerprint
# Settings with an option of their own on `fullres train` (the others are `--set KEY=VALUE`).
_FLAGS = {"steps", "epochs", "batch_size", "learning_rate", "warmup_steps", "schedule", "optimizer", "weight_decay",
          "precision", "remat", "checkpoint_every", "log_every", "augment", "augmentation", "seed", "input_cache",
          "patch_size", "image_size", "max_boxes", "allow_gathers", "model.num_classes", "model.num_levels",
          "model.base_filters", "model.stem", "model.normalization", "model.encoder", "model.deep_supervision",
          "partition.input_partition_dims", "partition.label_partition_dims", "task"}
CONTINUE_OPTION = "--continue-with-changes"


class RunChanged(ValueError):
    """A rerun into a run's folder would change what the run means; the message names the setting and the fix."""


def option(key: str) -> str:
    """The option of `fullres train` that sets `key` (a dotted TrainConfig key).

    >>> option("patch_size"), option("model.num_levels"), option("augmentation.rotation_probability")
    ('--patch-size', '--num-levels', '--set augmentation.rotation_probability')
    """
    if key in ("train_data", "eval_data"):
        return "--train" if key == "train_data" else "--eval"
    if key in _FLAGS:
        return "--" + key.rpartition(".")[2].replace("_", "-")
    return f"--set {key}"


def absolute(pattern: str | None) -> str | None:
    """`pattern` (a data set, or several separated by commas) with each local path made absolute: where a resume
    that leaves out --train finds the run's data from any working directory.

    >>> absolute("gs://bucket/ct,/data/b")
    'gs://bucket/ct,/data/b'
    """
    if pattern is None:
        return None
    return ",".join(part if "://" in part or not part else os.path.abspath(part) for part in pattern.split(","))


def source_hash(file_path: str) -> str:
    """The SHA-256 of a user's network file."""
    with open(file_path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def _settings(*values: dict) -> list[dict]:
    """The defining settings of each TrainConfig dict (`config.to_dict`, or train_config.json) as dotted keys, JSON
    values (tuples as lists)."""
    return [{key: value for key, value in parsing.flatten(json.loads(json.dumps(each))).items()
             if key not in MAY_CHANGE and key.partition(".")[0] not in MAY_CHANGE and key not in _PATHS}
            for each in values]


def check_rerun(config: config_lib.TrainConfig, recorded, total_steps: int, devices: int, warmup_steps: int,
                continue_with_changes: bool = False, log: Callable[[str], None] = print, *,
                trained_on: dict) -> dict:
    """Refuses a rerun into `config.output_dir` that would change what the run there means; nothing is written.

    Args:
        config: the rerun's config, its partition resolved.
        recorded: what `config.output_dir` records (`trained_run.read_record`).
        total_steps: the steps it asks for in all (from `steps` or `epochs`).
        devices: how many devices it runs on.
        warmup_steps: the warm-up it takes (`program.warmup_steps_used`).
        continue_with_changes: go on under the changed settings (the history records them) instead of refusing.
        log: where the settings that change freely, and a change continued with, are said.
        trained_on: the training data's fingerprint (`data_set.fingerprint` of `config.train_data`).

    Returns:
        The history line `record` writes once training starts: `{"event": "started" | "resumed" | "continued with
        changes", "step", "steps", "warmup_steps" (the warm-up used), "devices", "data", "data_path", "eval_path",
        "fingerprint", "model_source_sha256", "changed": {key: [before, now]}}` ("started" where the output holds no
        run yet;
        `data_path`, `eval_path`: the data's absolute paths, where a resume that leaves them out finds them).

    Raises:
        RunChanged: a defining setting differs (without `continue_with_changes`), or fewer steps than done.
    """
    from trainer.models import user_model

    run_dir = config.output_dir
    source = source_hash(config.model.file) if isinstance(config.model, user_model.UserModelConfig) else None
    line = {"event": "started", "step": 0, "steps": total_steps, "warmup_steps": warmup_steps, "devices": devices,
            "data": config.train_data, "data_path": absolute(config.train_data),
            "eval_path": absolute(config.eval_data), "fingerprint": trained_on, "model_source_sha256": source}
    if recorded.train_config is None:  # no run here yet
        return line
    done = run_files.done_steps(run_dir)
    if total_steps < done:
        asked = (f"--epochs {config.epochs} ({total_steps} steps)" if config.epochs is not None
                 else f"--steps {total_steps}")
        raise RunChanged(
            f"nothing to train: the run in {run_dir} is at step {done} of the {total_steps} that {asked} asks for; "
            f"pass --steps {done} or more to go on training it, or a new --output to train {total_steps} steps "
            "from the start.")
    freely: list[str] = []  # said only once the rerun is not refused
    _log_changed_freely(recorded.train_config, config, total_steps, devices, (recorded.history or [{}])[-1],
                        freely.append)
    changes = _changes(recorded, config, trained_on, source)
    if changes and not continue_with_changes:
        key, (before, now, where) = next(iter(changes.items()))
        more = f" (and {', '.join(list(changes)[1:])} differ too)" if len(changes) > 1 else ""
        raise RunChanged(
            f"--output {run_dir} was trained with {key} {run_data.shown(before)} but this rerun has {run_data.shown(now)}{where}"
            f"{more}; a rerun only resumes the run as it was, so leave out or pass the run's own {_fix(key)}, train into a new "
            f"--output, or pass {CONTINUE_OPTION} to go on from step {done} under the new setting (the run's "
            f"{run_files.RUN_RECORD} then records the change).")
    for said in freely:
        log(said)
    line = {**line, "event": "continued with changes" if changes else "resumed", "step": done}
    if changes:
        line["changed"] = {key: [before, now] for key, (before, now, _) in changes.items()}
        log(f"continuing the run from step {done} with changed settings ({CONTINUE_OPTION}): " + "; ".join(
            f"{key} {run_data.shown(before)} -> {run_data.shown(now)}" for key, (before, now, _) in changes.items()))
    return line


def _fix(key: str) -> str:
    if key == "augmentation":
        return "augmentation (--augmentation)"
    if key.startswith("training data"):
        return "training data (--train)"
    if key == "model source":
        return "network file (--model)"
    return f"setting ({option(key)})"


def _changes(recorded, config: config_lib.TrainConfig, trained_on: dict,
             source: str | None) -> dict[str, tuple[object, object, str]]:
    """{what: (the run's value, the rerun's, where the rerun's comes from)} of every defining setting that differs:
    the training data first (`run_data.differences` of the run's fingerprint and `trained_on`), then the settings,
    then a user's network."""
    from trainer import config as config_lib

    values = config_lib.to_dict(config)
    named = recipe_name(recorded.train_config.get("augmentation")), recipe_name(values["augmentation"])
    copy = run_files.path(recorded.directory, run_files.MODEL_SOURCE)
    copied = source_hash(copy) if source is not None and os.path.isfile(copy) else None
    before, after = _settings(recorded.train_config, values)
    data_changes = run_data.differences(run_data.trained_fingerprint(recorded), trained_on)
    changes: dict[str, tuple[object, object, str]] = {}
    summary = f" (--train {config.train_data}: its {dataset_files.SUMMARY} and {dataset_files.LABEL_MAP})"
    for key, was, now in data_changes:
        where = (f" (--train {config.train_data} holds other cases than the run trained on: its case ids differ)"
                 if key == "examples" else summary)
        changes[f"training data {key}"] = (was, now, where)
    differ = [key for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    recipe = [key for key in differ if key.startswith("augmentation.")]
    if recipe:  # the recipe as a whole: a preset's name where it is one, else the fields that differ
        if all(named):
            changes["augmentation"] = (*named, " (--augmentation)")
        else:
            changes["augmentation"] = ({key[13:]: before.get(key) for key in recipe},
                                       {key[13:]: after.get(key) for key in recipe}, " (--set augmentation.FIELD)")
    for key in differ:
        if key not in recipe:
            changes[key] = (before.get(key), after.get(key), f" ({option(key)})")
    if copied is not None and copied != source:
        changes["model source"] = (f"sha256 {copied[:12]}", f"sha256 {source[:12]}",
                                   f" ({config.model.file}; the run's copy is {copy})")
    return changes


def recipe_name(values: dict | None) -> str | None:
    """The name of the augmentation preset `values` (a recipe as JSON) is, or None."""
    from trainer.augment import recipe

    if values is None:
        return None
    values = json.loads(json.dumps(values))
    return next((name for name in recipe.NAMES
                 if json.loads(json.dumps(dataclasses.asdict(recipe.preset(name)))) == values), None)


def _log_changed_freely(recorded: dict, config: config_lib.TrainConfig, total_steps: int, devices: int,
                        previous: dict, log: Callable[[str], None]) -> None:
    """Logs the settings in `MAY_CHANGE` (and the device count) that this rerun changes."""
    from trainer import config as config_lib

    now = json.loads(json.dumps(config_lib.to_dict(config)))
    said = []
    if previous.get("steps") is not None and previous["steps"] != total_steps:
        fitted = "stretched" if total_steps > previous["steps"] else "shortened"
        said.append(f"{total_steps} steps in all (was {previous['steps']}; the learning-rate schedule is {fitted} "
                    "to the new end)" if config.schedule != "constant" else
                    f"{total_steps} steps in all (was {previous['steps']})")
    if "eval_path" in previous:  # the held-out data where the run's last start found them, not as it spelt them
        recorded = {**recorded, "eval_data": previous["eval_path"]}
        now["eval_data"] = absolute(now.get("eval_data"))
    for key in MAY_CHANGE:
        if key in ("steps", "epochs"):
            continue
        if key == "kernels" and key in recorded and recorded[key] != now[key]:
            said += [f"--set kernels.{name}={value} (was {recorded[key].get(name)})"
                     for name, value in now[key].items() if recorded[key].get(name) != value]
        elif key in recorded and recorded[key] != now.get(key):
            said.append(f"{option(key)} {run_data.shown(now.get(key))} (was {run_data.shown(recorded[key])})")
    if previous.get("devices") is not None and previous["devices"] != devices:
        said.append(f"{devices} devices (was {previous['devices']}; the partition is the run's)")
    if said:
        log("resuming with " + ", ".join(said))


def record(run_dir: str, line: dict) -> None:
    """Appends `line` (from `check_rerun`), stamped with the time, to the run's history in `run_record.json`."""
    content = run_files.read_run_record(run_dir)
    stamped = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **line}
    run_files.write_run_record(run_dir, {**content, "history": [*content.get("history", []), stamped]})


def record_kernel_choice(run_dir: str, choice: dict) -> None:
    """Keeps the run's measured kernel choice (`engine.kernel_choice`) in `run_record.json`, which a resume reuses."""
    from trainer.engine import kernel_choice

    content = run_files.read_run_record(run_dir)
    run_files.write_run_record(run_dir, {**content, kernel_choice.RECORD_KEY: choice})
