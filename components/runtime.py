"""What the component bodies share: argument parsing, output locations, metrics artifacts.

Imported inside the running component (the container or the local runner's
process), never at pipeline compile time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable


def log(message: str) -> None:
    """Progress lines, flushed at once: the runner shows a step's output as it happens."""
    print(message, flush=True)


def beam_arguments(beam_args: list) -> list[str]:
    """Beam options as given; without a runner, Beam's local runner with one worker per core."""
    from preprocessing.beam import local_workers

    args = [str(a) for a in beam_args]
    if not any(a.startswith("--runner") for a in args):
        return local_workers.default_pipeline_args() + args
    return args


def readable(uri: str) -> str:
    """An input location as the step reads it: `gs://BUCKET/PATH` as Vertex AI mounts Cloud Storage into every step
    (`/gcs/BUCKET/PATH`, where KFP's own artifact paths lie), anything else as it is. fullres reads inputs
    through a file system (SimpleITK, pydicom, PIL), not through Cloud Storage's API."""
    return "/gcs/" + uri[len("gs://"):] if uri.startswith("gs://") else uri


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
                 learning_rate: float, input_partition_dims: str, precision: str, overrides: dict,
                 model_source: str | None = None, augmentation: str = "",
                 parameter: Callable[[str], str] | None = None):
    """A `TrainConfig` from the train component's parameters, through `config_resolution.resolve` as the CLI's.

    0 and "" are the component's "keep the preset's value" (KFP parameters have no None). `parameter`: how a
    sentence names a parameter (the pipelines' `--param steps`), so that a refused value is named as it was passed
    (`--param steps=-5`), not as the config's field.
    """
    from trainer import config_resolution

    named = {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate, "precision": precision,
             "partition.input_partition_dims": input_partition_dims, "augmentation": augmentation}
    given = None if parameter is None else {
        key: f"{parameter(key.rpartition('.')[2])}={value}" for key, value in named.items() if value}
    return config_resolution.resolve(task, preset, train_data, output_dir,
                              overrides={**{k: v for k, v in named.items() if v}, **(overrides or {})},
                              model_source=model_source, given=given)


def user_network_given(model_code: str, model_function: str) -> bool:
    """Whether the train step's parameters name a user's network (the pipelines' parameter check asks the same).

    Raises:
        ValueError: one of the two is given without the other.
    """
    if not model_code.strip() and not model_function:
        return False
    if not model_code.strip() or not model_function:
        raise ValueError("model_code (the text of your network's Python file) and model_function (the function in it "
                         "that returns the network) go together; pass both (fullres pipeline run --model "
                         "FILE.py:FUNCTION sets them), or neither for the task's own model.")
    return True


def model_source(model_code: str, model_function: str) -> str | None:
    """FILE.py:FUNCTION of a user's network passed as text (the train step's `model_code`), written to a file of its
    own in a fresh temporary folder; None when there is no code (the task's own model).

    Raises:
        ValueError: one of the two is given without the other.
    """
    import os
    import tempfile

    from trainer.models import user_model

    if not user_network_given(model_code, model_function):
        return None
    path = os.path.join(tempfile.mkdtemp(prefix=user_model.TEMPORARY_PREFIX), "network.py")  # its errors: model_code
    with open(path, "w", encoding="utf-8") as file:
        file.write(model_code)
    return f"{path}:{model_function}"


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
        if value is not None:
            artifact.log_metric(f"dice/{name}", value)
    with open(artifact.path, "w") as file:
        json.dump(results, file, indent=2, default=_jsonable)


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
