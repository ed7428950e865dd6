"""The one way from what a user gave to a `TrainConfig`: a preset, `--set` keys, a resume's record.

The command line, the KFP train component and `fullres plan` all call `resolve`, so that the plan sizes the run
training compiles. The dataclass and its checks are `config`; the named starting points are `presets`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from common import option_sentences, parsing
from trainer import config, presets
from trainer.augment import recipe as augment_recipe
from trainer.models import user_model


# Detection records carry label_map.json (ids from 1): the class count is read from it unless given.
CLASSES_FROM_LABEL_MAP = ("detection",)


def resolve(task: str = "segmentation", preset: str = "default", train_data: str = "", output_dir: str = "",
            eval_data: str | None = None, overrides: Mapping[str, object] | None = None, model_source: str | None = None,
            recorded: Mapping | None = None, given: Mapping[str, str] | None = None) -> config.TrainConfig:
    """The one way to a `config.TrainConfig`: the command line, the KFP train component and `fullres plan` all call it.

    Args:
        task: "segmentation" or "detection".
        preset: a name in `presets.PRESETS`, or "default" for the task's default.
        train_data, output_dir, eval_data: as in `config.TrainConfig`.
        overrides: dotted keys to values, e.g. `{"model.num_levels": 5, "partition.input_partition_dims":
            "1,4,1,1,1"}`. Values may be text (as `--set key=value` gives them) or numbers (integral floats,
            as KFP passes them, become ints where the setting is an int); None keeps the preset's value.
            Nested dicts (`{"model": {"num_levels": 5}}`) are read as dotted keys.
        model_source: a user's network, `FILE.py:FUNCTION` (`--model`), in place of the preset's; it keeps the
            preset's spatial_dims, num_classes and in_channels unless overrides set them.
        recorded: a resume's settings in the preset's place (`engine.recorded_settings.base`): what overrides leave
            out stays the run's (given steps count even where the run set epochs).
        given: how the command line gave each override (`--set learning_rate=nan`), for the sentences; without
            it a sentence names a key as "train override KEY" (the pipelines' `train_overrides`).

    Detection's class count comes from `label_map.json` beside `train_data` unless `model.num_classes` is given;
    a new segmentation run's input channels from the records of `train_data` (3 for video clips) unless
    `model.in_channels` is.

    Example:
        >>> resolve(preset="demo", overrides={"model.num_levels": "2", "steps": 10}).model.num_levels
        2

    Raises:
        ValueError: unknown task, preset or key (the valid ones listed), or a value of the wrong kind.
    """
    if task not in config.TASKS:
        raise ValueError(f"task {task!r} is not known; use one of {', '.join(config.TASKS)}.")
    if preset == "default":
        base = presets.DEFAULT_PRESETS[task]()
    elif preset in presets.PRESETS:
        base = presets.PRESETS[preset]()
    else:
        raise ValueError(f"preset {preset!r} is not known; use default or one of {', '.join(presets.PRESETS)}.")
    if base.task != task:
        raise ValueError(f"preset {preset} is a {base.task} preset but the task is {task}; pick a {task} preset or "
                         f"set the task to {base.task}.")
    settings, given = {k: v for k, v in parsing.flatten(overrides or {}).items() if v is not None}, given or {}
    if model_source is not None:
        user_model.check_task(task, model_source)
    hints = config.setting_types(task, user_network=model_source is not None or "function" in (recorded or {}).get("model", ()))
    unknown = sorted(set(settings) - set(hints))
    if unknown:
        where = f" with --model {model_source}" if model_source is not None else ""
        raise ValueError(f"unknown {'setting' if set(unknown) & set(given) else 'train override'}"
                         f"{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(given.get(key, key) for key in unknown)}{where}; valid ones: {', '.join(sorted(hints))}.")
    values = config.to_dict(base) if recorded is None else json.loads(json.dumps(recorded))
    if recorded is not None and "steps" in settings and "epochs" not in settings:
        values["epochs"] = None
    if model_source is not None:
        values["model"] = user_model.settings(model_source, values["model"])
    values.update(train_data=train_data, output_dir=output_dir, eval_data=eval_data)
    if task in CLASSES_FROM_LABEL_MAP and "model.num_classes" not in settings and recorded is None:
        from preprocessing.records import dataset_files  # reads label_map.json with TensorFlow's file system

        label_map = dataset_files.foreground(dataset_files.read_label_map(train_data) or {}) if train_data else None
        if label_map:
            values["model"]["num_classes"] = max(label_map.values())
    if "model.in_channels" in hints and "model.in_channels" not in settings and recorded is None and train_data:
        from preprocessing.records import data_set

        # The records' own channels (video clips: RGB, 3) in the preset's place; `recorded_settings.channels_line`
        # says so in the log.
        values["model"]["in_channels"] = data_set.channels(train_data) or values["model"]["in_channels"]
    if "augmentation" in settings:  # a preset first, so that augmentation.FIELD settings change it
        values["augmentation"] = dataclasses.asdict(augment_recipe.preset(str(settings.pop("augmentation")).strip()))
    for key, value in settings.items():
        section, _, name = key.rpartition(".")
        auto = key == "partition.input_partition_dims" and str(value).strip().lower() == "auto"  # resolved later
        value = "auto" if auto else parsing.typed(value, hints[key], key, given=given.get(key))
        (values[section] if section else values)[name] = value
    return option_sentences.built(config.from_dict, values, given)  # errors name the option typed
