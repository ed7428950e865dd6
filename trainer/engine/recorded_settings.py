"""A resume need not repeat the run: what the command line leaves out is what the run recorded.

`fullres train --output RUN --steps 2000` over a run goes on as the run was trained: its data, model, patches,
augmentation, partition, schedule and every `--set` it was given, as `train_config.json` and `run_record.json`
hold them. An option given on the command line is the rerun's and is compared with the record
(`engine.run_record.check_rerun`: refused in one sentence where it changes what the run means). The log says in
one line which settings came from the record.

`--preset` names a whole starting point and so stops the record from filling in the settings (all its settings
then count as given, as for a new run). A `--task` other than the run's is refused before any data are read: a
run has one task, so the fix is to leave `--task` out or train into a new `--output`. The data (`--train`,
`--eval`) are the run's whenever left out: the absolute path the run's newest start recorded (the path as it
was given, for a run from before that), whose fingerprint is still checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from common import parsing
from preprocessing.records import data_set
from trainer.engine import run_files, run_record


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a run folder records, read before anything is built.

    Args:
        directory: the run folder (`--output`).
        settings: its `train_config.json`, a user's network named by the run's own copy (`model_source.py`).
        train_data: where its training data are (`run_record.json`'s newest absolute path, else as given).
        eval_data: where its held-out data are, likewise; None where it had none.
    """

    directory: str
    settings: dict
    train_data: str
    eval_data: str | None


@dataclasses.dataclass(frozen=True)
class Rerun:
    """A rerun's inputs once the record has filled in what the command line left out.

    Args:
        task, train_data, eval_data: the rerun's (given, or the run's).
        base: the settings `config_resolution.resolve` starts from in the default preset's place (`recorded=`); None where
            the preset is (a new run, `--preset` given, or another `--task`).
        taken: the options the record supplied, as the log line names them.
    """

    task: str
    train_data: str
    eval_data: str | None
    base: dict | None
    taken: tuple[str, ...]

    @property
    def network(self) -> str | None:
        """The run's own network (FILE.py:FUNCTION, its copy) where the record supplies one."""
        model = (self.base or {}).get("model", {})
        return f"{model['file']}:{model['function']}" if "function" in model else None


def read(run_dir: str) -> Recorded | None:
    """The record of the run in `run_dir`, or None where none is there (a new run; a lone file of fullres's name
    is the output guard's to judge).

    Raises:
        output_guard.OutputRefused: the run's train_config.json or run_record.json is damaged (a ValueError).
    """
    run_files.check_resumable(run_dir)
    settings = run_files.read_train_config_dict(run_dir)
    if settings is None or not run_files.holds_run(run_dir):
        return None
    if "function" in settings["model"]:  # a user's network: the run's copy, as every reader of the run rebuilds it
        settings = {**settings, "model": {**settings["model"],
                                          "file": os.path.abspath(run_files.path(run_dir, run_files.MODEL_SOURCE))}}
    history = run_files.read_run_record(run_dir).get("history") or []
    newest = next((line for line in reversed(history) if "data_path" in line), {})
    return Recorded(run_dir, settings, newest.get("data_path", settings.get("train_data", "")),
                    newest["eval_path"] if "eval_path" in newest else settings.get("eval_data"))


def fill(run_dir: str, given: set[str], task: str, train_data: str | None, eval_data: str | None) -> Rerun:
    """The rerun's task, data and starting settings: the command line's where `given` names them (parameters of
    `fullres train`: "task", "preset", "train_data", "eval_data", ...), else those of the run in `run_dir`.

    Raises:
        ValueError: no run is there and `--train` is left out; `--task` is not the run's; the run's record is
            damaged (`read`).
    """
    recorded = read(run_dir)
    if recorded is None:
        if train_data is None:
            raise ValueError("--train is missing: name the training data set (the --output folder of fullres "
                             "preprocess, or a pattern of its records) to start a run, or point --output at an "
                             "earlier run to resume it on its own data.")
        return Rerun(task, train_data, eval_data, None, ())
    trained_task = recorded.settings.get("task", "segmentation")
    if "task" in given and task != trained_task:
        raise ValueError(f"--output {run_dir} holds a {trained_task} run but --task is {task}; leave --task out (or "
                         f"pass --task {trained_task}) to resume the run, or train the {task} run into a new --output.")
    taken = []
    if "task" not in given and recorded.settings.get("task", task) != task:
        task = recorded.settings["task"]
        taken.append(f"--task {task}")
    if train_data is None:
        train_data = recorded.train_data
        if not _there(train_data):
            raise ValueError(f"--output {run_dir} trained on --train {train_data} (as the run recorded it), which "
                             "is not there now; pass --train with where the run's training data are now (their "
                             "preprocessing is checked against the run's), or train into a new --output.")
        taken.append(f"--train {train_data}")
    if eval_data is None and "eval_data" not in given and recorded.eval_data is not None:
        there = _there(recorded.eval_data)  # scored at the end only: a resume goes on without them, and says so
        eval_data = recorded.eval_data if there else None
        taken.append(f"--eval {recorded.eval_data}" if there else f"no --eval (the run's {recorded.eval_data} is "
                     "not there now)")
    same_start = "preset" not in given and task == recorded.settings.get("task", "segmentation")
    return Rerun(task, train_data, eval_data, base(recorded.settings, task) if same_start else None, tuple(taken))


def _there(pattern: str) -> bool:
    """Whether `pattern` names records at all (what else is wrong with them, training says in its own sentence)."""
    try:
        data_set.resolve(pattern)
    except FileNotFoundError:
        return False
    except ValueError:  # records, wrong in another way: training refuses them in its own sentence
        pass
    return True


def base(settings: dict, task: str) -> dict:
    """`settings` (a train_config.json) over the task's default preset: a setting the run's fullres did not know
    yet keeps the default, as a rerun that repeated every option would have had it."""
    from trainer import config as config_lib, presets

    values = config_lib.to_dict(presets.DEFAULT_PRESETS[task]())
    merged = {**values, **{k: v for k, v in settings.items() if k not in ("model", "partition", "augmentation")}}
    for section in ("partition", "augmentation"):
        merged[section] = {**values[section], **(settings.get(section) or {})}
    model = dict(settings["model"])
    merged["model"] = model if "function" in model else {**values["model"], **model}
    return merged


def log_taken(rerun: Rerun, overrides: dict, model_given: bool, log: Callable[[str], None],
              preset: str | None = None) -> None:
    """Logs `taken_line` where the record supplied anything, and `channels_line` where the data did."""
    for line in (taken_line(rerun, overrides, model_given), channels_line(rerun, overrides, preset)):
        if line is not None:
            log(line)


def channels_line(rerun: Rerun, overrides: dict, preset: str | None) -> str | None:
    """The log line saying a new segmentation run took its input channels from its records (`config.resolve`), where
    `preset` has others (3-channel video clips under a 1-channel preset); None otherwise, or where the command line
    set `model.in_channels`."""
    if preset is None or rerun.base is not None or not rerun.train_data or overrides.get("model.in_channels"):
        return None
    from preprocessing.records import data_set
    from trainer import presets

    channels = data_set.channels(rerun.train_data)  # None for records without channels of their own (boxes)
    preset_channels = getattr((presets.DEFAULT_PRESETS[rerun.task] if preset == "default"
                               else presets.PRESETS[preset])().model, "in_channels", None)
    if channels is None or preset_channels is None or channels == preset_channels:
        return None
    held = "video clips (RGB frames)" if channels == 3 else "CT volumes (one channel)"
    return (f"model.in_channels {channels}: taken from --train {rerun.train_data}, which holds {held}, in place of "
            f"the {preset} preset's {preset_channels} (--set model.in_channels=N sets it)")


def taken_line(rerun: Rerun, overrides: dict, model_given: bool) -> str | None:
    """The log line naming what the record supplied: the data, and each setting the command line left out whose
    recorded value is not the task's default (the steps always), e.g. `taken from the run's record (not given
    here): --train /data/ct, --steps 40, --patch-size 8,8,8, --augmentation nnunet (and 41 settings at their
    defaults)`; None where nothing was taken.

    Args:
        rerun: from `fill`.
        overrides: the settings the command line gave (dotted keys; None: not given), `--set` ones included.
        model_given: `--model` was given (the model's settings are then the command line's).
    """
    from trainer import config as config_lib, presets

    said, left = list(rerun.taken), 0
    if rerun.base is not None:
        recorded = _flat(rerun.base)
        given = {key for key, value in parsing.flatten(overrides).items() if value is not None}
        given |= {key for key in recorded if (key.startswith("model.") and model_given)
                  or (key.startswith("augmentation.") and "augmentation" in given)}
        given |= {"steps", "epochs"} if given & {"steps", "epochs"} else set()
        default = _flat(config_lib.to_dict(presets.DEFAULT_PRESETS[rerun.task]()))
        recipe = []
        for key, value in recorded.items():
            if key in given or key in ("task", "train_data", "output_dir", "eval_data", "model.function"):
                continue
            if key in ("steps", "epochs"):  # the one that counts (epochs where set), whatever its value
                if (key == "epochs") == (recorded.get("epochs") is not None):
                    said.append(_option(key, value))
            elif key == "model.file":
                said.append(f"--model {value}:{recorded['model.function']}")
            elif value == default.get(key):
                left += 1
            elif key.startswith("augmentation."):
                recipe.append(key)
            else:
                said.append(_option(key, value))
        if recipe:  # the recipe by its preset's name where it is one
            name = run_record.recipe_name(rerun.base["augmentation"])
            said += [f"--augmentation {name}"] if name else [_option(key, recorded[key]) for key in recipe]
    if not said:
        return None
    return ("taken from the run's record (not given here): " + ", ".join(said)
            + (f" (and {left} settings at their defaults)" if left else ""))


def typed_as(flags: dict, settings: dict) -> dict[str, str]:
    """How the command line gave each setting (`--learning-rate nan`, `--set learning_rate=nan`): what the
    sentences of `config_resolution.resolve` name. A `--set` wins over its option, as in the overrides.

    >>> typed_as({"learning_rate": 0.5, "steps": None}, {"model.stem": "none"})
    {'learning_rate': '--learning-rate 0.5', 'model.stem': '--set model.stem=none'}
    """
    return {**{key: _option(key, value) for key, value in flags.items() if value is not None},
            **{key: f"--set {key}={value}" for key, value in settings.items()}}


def _flat(values: dict) -> dict:
    return parsing.flatten(json.loads(json.dumps(values)))


def _option(key: str, value) -> str:
    """`key`'s option as one would type it: `--patch-size 8,8,8`, `--no-augment`, `--set model.stem=conv`."""
    flag = run_record.option(key)
    shown = "none" if value is None else ",".join(map(str, value)) if isinstance(value, list) else str(value).lower() \
        if isinstance(value, bool) else str(value)
    if flag.startswith("--set "):
        return f"{flag}={shown}"
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {shown}"
