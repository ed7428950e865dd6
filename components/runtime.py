"""What the component bodies share: argument parsing, output locations, metrics artifacts.

Imported inside the running component (the container or the local runner's
process), never at pipeline compile time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing


def log(message: str) -> None:
    """Progress lines, flushed at once: the runner shows a step's output as it happens."""
    print(message, flush=True)


def numbers(text: str, kind=float) -> tuple | None:
    """ "1.0,1.0,2.5" -> (1.0, 1.0, 2.5); "" or "none" -> None."""
    if not text or text.strip().lower() == "none":
        return None
    try:
        return tuple(kind(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers; write it like 1.0,1.0,2.5.") from None


def beam_arguments(beam_args: list) -> list[str]:
    """Beam options as given; without a runner, Beam's local runner with one worker per core."""
    from preprocessing import conversion

    args = [str(a) for a in beam_args]
    if not any(a.startswith("--runner") for a in args):
        return conversion.default_pipeline_args() + args
    return args


def output_location(artifact, beam_args: list) -> str:
    """gs:// for a Beam runner that writes to Cloud Storage itself (Dataflow); the artifact's path otherwise."""
    on_dataflow = any(str(a).replace(" ", "") in ("--runner=DataflowRunner", "--runner=dataflow") for a in beam_args)
    if on_dataflow and artifact.uri.startswith("gs://"):
        return artifact.uri
    return artifact.path


def describe_dataset(artifact, summary: dict, output: str) -> None:
    artifact.metadata.update({"records": summary.get("ok"), "failed": summary.get("failed"),
                              "shards": len(summary.get("shards", [])), "location": output})


def train_config(*, task: str, preset: str, train_data: str, output_dir: str, steps: int, batch_size: int,
                 learning_rate: float, input_partition_dims: str, precision: str, overrides: dict):
    """A `TrainConfig` from the train component's parameters (0 / "" keep the preset's value)."""
    from trainer import config as config_lib, partitioning, tasks

    if preset == "default":
        base = config_lib.detection() if task == "detection" else config_lib.TrainConfig()
    elif preset in config_lib.PRESETS:
        base = config_lib.PRESETS[preset]()
    else:
        raise ValueError(f"preset {preset!r} is not known; use default or one of {', '.join(config_lib.PRESETS)}.")
    if base.task != task:
        raise ValueError(f"preset {preset} trains {base.task}, but task is {task}; pick a {task} preset.")
    values = config_lib.to_dict(base)
    values.update(train_data=train_data, output_dir=output_dir)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("learning_rate", learning_rate),
                        ("precision", precision)):
        if value:
            values[name] = value
    if input_partition_dims:
        values["partition"]["input_partition_dims"] = list(partitioning.parse_dims(input_partition_dims))
    if task == "detection":
        label_map = tasks.read_label_map(train_data)
        if label_map:
            values["model"]["num_classes"] = max(label_map.values())
    for key, value in restore_integers(overrides, task).items():
        if key in ("model", "partition"):
            values[key].update(value)
        else:
            values[key] = value
    return config_lib.from_dict(values)


def restore_integers(overrides: dict, task: str) -> dict:
    """`overrides` with integral floats turned back into ints wherever the configuration declares an int.

    KFP passes a dict parameter as a protobuf Struct, whose numbers are all
    doubles: `{"model": {"num_classes": 2}}` arrives as 2.0, which Keras refuses
    as a layer size. The dataclass field types say which numbers are counts.

    Raises:
        ValueError: a setting declared as an integer holds a fraction.
    """
    from trainer import config as config_lib, partitioning

    nested = {"model": config_lib.MODEL_TYPES[task], "partition": partitioning.PartitionConfig}
    hints = typing.get_type_hints(config_lib.TrainConfig)
    restored = {}
    for key, value in overrides.items():
        if key in nested and isinstance(value, dict):
            inner = typing.get_type_hints(nested[key])
            restored[key] = {k: _restore(v, inner.get(k), f"{key}.{k}") for k, v in value.items()}
        else:
            restored[key] = _restore(value, hints.get(key), key)
    return restored


def _restore(value, hint, name: str):
    """`value` with the ints `hint` (int, int | None, tuple[int, ...], ...) declares restored from floats."""
    if hint is None:
        return value
    is_union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    options = typing.get_args(hint) if is_union else (hint,)
    if isinstance(value, float) and int in options:
        if not value.is_integer():
            raise ValueError(f"train override {name} must be a whole number, got {value}; write it like {round(value)}.")
        return int(value)
    if isinstance(value, list):
        for option in options:
            if typing.get_origin(option) is tuple:  # tuple[int, ...] or tuple[int, int]
                args = typing.get_args(option)
                kinds = [args[0]] * len(value) if args[-1:] == (Ellipsis,) else list(args)
                return [_restore(v, kinds[i] if i < len(kinds) else None, f"{name}[{i}]") for i, v in enumerate(value)]
    return value


def write_metrics(artifact, results: dict, scalars: tuple[str, ...]) -> None:
    """Scalars into the Metrics artifact (shown by the pipeline UI); everything as JSON in its file."""
    for name in scalars:
        value = results.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            artifact.log_metric(name, value)
    for name, value in (results.get("per_class_AP") or {}).items():
        if value is not None:
            artifact.log_metric(f"AP/{name}", value)
    for name, value in zip(results.get("class_names") or [], results.get("dice_per_class") or []):
        if value is not None and results.get("task") == "segmentation":
            artifact.log_metric(f"dice/{name}", value)
    with open(artifact.path, "w") as file:
        json.dump(results, file, indent=2, default=_jsonable)


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
