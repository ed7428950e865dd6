"""A pipeline's parameters checked before any step runs, by the rules of the commands and components they reach.

`fullres pipeline run --local`, `demo` and `pipeline submit` call `check`
first: a parameter a step would refuse is refused here, in the sentence that
step's command prints, before kfp starts a step or a request leaves for Vertex
AI. The rules are not written twice: the CT grid is `ct_settings`'s, the
training settings are resolved by `runtime.train_config` (the train component's
own `config.resolve`, with a user's network if `model_code` holds one: both or
neither, `runtime.user_network_given`), the failed fraction is
`dead_letters`'s, a TPU slice is `targets`'s, accelerators and scheduling are
the Vertex AI client's own enums.

`RULES` holds the rule of each parameter, by name (a parameter of a new
pipeline takes its rule with one line there); `TOGETHER` the rules that judge
several parameters at once (the configuration a component resolves from them),
each with the parameters it reads; `FREE` the few that need no rule. A test
holds every parameter of every pipeline to one of the three.
A rule is `rule(value, name, where)` or `rule(values, where)`, raising
`ValueError` with one sentence that names `--param NAME`, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable

from pipelines import definitions

# Cloud Storage bucket names: 3 to 63 of a-z 0-9 . _ -, starting and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_DURATION = re.compile(r"^[0-9]+(\.[0-9]+)?s$")  # protobuf's Duration as JSON: "86400s"
_TOPOLOGY = re.compile(r"^[0-9]+x[0-9]+(x[0-9]+)?$")
_REGION = re.compile(r"^[a-z]+(-[a-z]+)+[0-9]+$")  # us-central1, europe-west4, northamerica-northeast2
GPUS_PER_MACHINE = (1, 2, 4, 8, 16)  # what Vertex AI's GPU machine types carry
TASKS = {definitions.CT_PIPELINE: "segmentation", definitions.DETECTION_PIPELINE: "detection",
         definitions.VIDEO_PIPELINE: "segmentation"}
REQUIRED_WHAT = {"train_input_uri": "the training scans", "eval_input_uri": "the held-out scans",
                 "train_annotations_uri": "the training boxes", "train_images_uri": "the training images",
                 "eval_annotations_uri": "the held-out boxes", "eval_images_uri": "the held-out images"}


@dataclasses.dataclass(frozen=True)
class Where:
    """Where the run goes: this machine (`pipeline run --local`, `demo`) or Vertex AI (`pipeline submit`)."""

    vertex: bool = False
    log: Callable[[str], None] = lambda line: None


def parameter(name: str) -> str:
    """How a pipeline parameter is named in a sentence: `--param steps`."""
    return f"--param {name}"


# ---------------------------------------------------------------- one parameter each


def input_location(value: str, name: str, where: Where) -> None:
    """An input the steps read through a file system: here, a path that exists; on Vertex AI, Cloud Storage
    (`gs://BUCKET/PATH`, which the step reads where Vertex mounts it, `/gcs/BUCKET/PATH`, or that path itself)."""
    if value == "":
        return  # optional inputs; a required one is named by `check` first
    if value.startswith("gs://"):
        bucket = value[len("gs://"):].split("/", 1)[0]
        if not _BUCKET.match(bucket):
            raise ValueError(f"{parameter(name)} {value!r} is not a well-formed Cloud Storage location; write it like "
                             "gs://BUCKET/PATH (a bucket name has 3 to 63 lowercase letters, digits, dots, dashes or "
                             "underscores).")
        if not where.vertex:
            raise ValueError(f"{parameter(name)} {value!r} is in Cloud Storage, but a local run reads its inputs from "
                             "this machine's file system; copy them here (gcloud storage cp -r) or mount the bucket "
                             "(gcsfuse), and pass the local path.")
        return
    if "://" in value:
        raise ValueError(f"{parameter(name)} {value!r} is a {value.split('://')[0]}:// location; pass a path on "
                         f"{'Cloud Storage, gs://BUCKET/PATH' if where.vertex else 'this machine'}.")
    if where.vertex:
        if not value.startswith("/gcs/"):
            raise ValueError(f"{parameter(name)} {value!r} is a path on this machine, which Vertex AI's steps cannot "
                             "read; copy it to Cloud Storage (gcloud storage cp -r) and pass gs://BUCKET/PATH.")
        return
    if not os.path.exists(value):
        raise ValueError(f"{parameter(name)} {value!r} does not exist.")


def failed_fraction(value: float, name: str, where: Where) -> None:
    from common import dead_letters

    dead_letters.check_failed_fraction(value, parameter(name))


def at_least_one(value: int, name: str, where: Where) -> None:
    if value < 1:
        raise ValueError(f"{parameter(name)} {value} must be 1 or more.")


def accelerator_count(value: int, name: str, where: Where) -> None:
    if value < 1:
        raise ValueError(f"{parameter(name)} {value} must be 1 or more: the accelerators each host gets (Vertex AI "
                         f"machines carry {', '.join(map(str, GPUS_PER_MACHINE))} GPUs; a TPU slice is its topology).")


def strategy(value: str, name: str, where: Where) -> None:
    from google.cloud.aiplatform_v1.types import custom_job

    offered = [s for s in custom_job.Scheduling.Strategy.__members__ if s != "STRATEGY_UNSPECIFIED"]
    if value not in offered:
        raise ValueError(f"{parameter(name)} {value!r} is not a Vertex AI scheduling strategy; use one of "
                         f"{', '.join(offered)}.")


def wait_duration(value: str, name: str, where: Where) -> None:
    if not _DURATION.match(value):
        raise ValueError(f"{parameter(name)} {value!r} is not a duration Vertex AI reads; write seconds with an s, "
                         "e.g. 86400s.")


def location(value: str, name: str, where: Where) -> None:
    if not _REGION.match(value):
        raise ValueError(f"{parameter(name)} {value!r} is not a Google Cloud region; write it like us-central1.")


def output_format(value: str, name: str, where: Where) -> None:
    formats = ("nifti", "nrrd", "mha")  # `fullres predict --format`
    if value and value not in formats:
        raise ValueError(f"{parameter(name)} {value!r} is not known; use one of {', '.join(formats)}, or leave it "
                         "empty for each scan's own format.")


def beam_options(value: list, name: str, where: Where) -> None:
    odd = [item for item in value if not isinstance(item, str) or not item.startswith("--")]
    if odd:
        raise ValueError(f"{parameter(name)} holds {odd[0]!r}, which is not a Beam option; write each like "
                         '"--runner=DataflowRunner".')


RULES: dict[str, Callable[[object, str, Where], None]] = {
    "train_input_uri": input_location, "eval_input_uri": input_location, "train_labels_uri": input_location,
    "eval_labels_uri": input_location, "predict_input_uri": input_location,
    "train_annotations_uri": input_location, "train_images_uri": input_location,
    "eval_annotations_uri": input_location, "eval_images_uri": input_location,
    "max_failed_fraction": failed_fraction, "beam_args": beam_options,
    "accelerator_count": accelerator_count, "replica_count": at_least_one, "strategy": strategy,
    "max_wait_duration": wait_duration, "location": location, "predict_output_format": output_format,
}


# ---------------------------------------------------------------- several parameters at once


def ct_grid(values: dict, where: Where) -> None:
    """Spacing, window and shape, read as the preprocess component reads them."""
    if "spacing" in values:
        from preprocessing.ct import ct_settings

        ct_settings.grid_from_text(values["spacing"], values["window"], values["shape"], ct_settings.parameter_name)


def video_clips(values: dict, where: Where) -> None:
    """Clip length, stride and size, read as the preprocess_video component reads them."""
    if "clip_length" in values:
        from common import parsing
        from preprocessing.video import video_clips as clips

        length, stride = values["clip_length"], values["clip_stride"]
        if length < 1 or stride < 0:  # the one that is wrong, in the pipeline's words (stride 0: side by side)
            wrong = (f"{parameter('clip_length')} {length} must be 1 or more" if length < 1 else
                     f"{parameter('clip_stride')} {stride} must be 0 (clips side by side) or more")
            raise ValueError(f"{wrong}, e.g. {parameter('clip_length')}=16 {parameter('clip_stride')}=8.")
        clips.VideoPreprocessConfig(values["clip_length"], values["clip_stride"] or None,
                                    tuple(parsing.parse_list(values["size"], int, parameter("size"), "64,64") or ()))


def train_configuration(values: dict, where: Where = Where()):
    """The training settings resolved exactly as the train component resolves them (`config.resolve`), with the
    user's network in place of the preset's when one is given (its settings are not the UNet's)."""
    from components import runtime

    network = user_network(values, where)
    return runtime.train_config(task=values["task"], preset=values["preset"], train_data="", output_dir="",
                                steps=values["steps"], batch_size=values["batch_size"], precision=values["precision"],
                                learning_rate=values["learning_rate"], input_partition_dims=values["input_partition_dims"],
                                overrides=values["train_overrides"], augmentation=values.get("augmentation", ""),
                                model_source=network, parameter=parameter)


def user_network(values: dict, where: Where = Where()) -> str | None:
    """A network of the user's as `fullres pipeline run --model FILE.py:FUNCTION` passes it: the file's text
    (`model_code`) and the function's name (`model_function`), both or neither (the train step's own rule,
    `runtime.user_network_given`); a name a function can have, and text that parses as Python, as the train step
    imports it. Returns FILE.py:FUNCTION for `config.resolve` (the step writes the text to its own `network.py`), or
    None. The train step still checks what only running the file tells (the function, the network it returns)."""
    from components import runtime

    code, function = values.get("model_code", ""), values.get("model_function", "")
    if not runtime.user_network_given(code, function):
        return None
    if not function.isidentifier():
        raise ValueError(f"{parameter('model_function')} {function!r} is not a function name; pass the name of the "
                         "function in model_code that returns the network, e.g. build (fullres pipeline run --model "
                         "FILE.py:FUNCTION sets both).")
    try:
        compile(code, "model_code", "exec")  # parsed only: nothing of the user's runs here
    except (SyntaxError, ValueError) as error:  # ValueError: a null byte
        where_in = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        raise ValueError(f"{parameter('model_code')} is not Python the train step can import{where_in}: "
                         f"{getattr(error, 'msg', error)}; fix the file and pass it again (fullres pipeline run "
                         "--model FILE.py:FUNCTION passes its text).") from None
    return f"network.py:{function}"


def network_file(values: dict, file: str | None) -> None:
    """The user's own network imported and built as the train step will build it, and held to the contract
    (`user_model.measure`: one channels-last input, logits of the model's classes at its resolution, halvings by
    powers of two), before the first step: from `file` (`fullres pipeline run --model FILE.py:FUNCTION`; errors
    name it), or else from `model_code` itself, written to a folder of this check's own (errors name `--param
    model_code`: a function that raises was otherwise found by the train step, after both preprocessing steps).
    Nothing to do without one (or where `check` refused it already)."""
    import dataclasses
    import tempfile

    from trainer.models import user_model

    if user_network(values) is None:
        return
    model = train_configuration(values).model
    if file is not None:
        user_model.measure(dataclasses.replace(model, file=file))
        return
    # Named as the train step's copy is (`user_model.TEMPORARY_PREFIX`): its sentences say `--param model_code`.
    with tempfile.TemporaryDirectory(prefix=user_model.TEMPORARY_PREFIX) as folder:
        copy = os.path.join(folder, "network.py")
        with open(copy, "w", encoding="utf-8") as written:
            written.write(values["model_code"])
        user_model.measure(dataclasses.replace(model, file=copy))


def placement(values: dict, where: Where) -> None:
    """Accelerator type and TPU topology against what Vertex AI offers: its client's accelerator types, or a TPU
    slice of a generation Vertex rents (`targets`: the slices each generation comes in)."""
    from trainer.plan import launch, targets

    kind, topology = values["accelerator_type"], values["tpu_topology"]
    if kind == "CPU" and not topology:
        return
    slice_types = {name: generation for generation, name in launch.TPU_ACCELERATOR.items()}
    if topology:
        if kind not in slice_types:
            raise ValueError(f"{parameter('tpu_topology')} {topology!r} trains on a TPU slice, but "
                             f"{parameter('accelerator_type')} {kind!r} is not a TPU generation; use one of "
                             f"{', '.join(slice_types)} (fullres plan --target ... --json gives both).")
        generation = slice_types[kind]
        if not _TOPOLOGY.match(topology):
            raise ValueError(f"{parameter('tpu_topology')} {topology!r} is not a topology; write chips per "
                             f"dimension like {targets.TPU_GENERATIONS[generation].slices[1]}.")
        targets.check_slice(generation, tuple(int(n) for n in topology.split("x")), parameter("tpu_topology"))
        if targets.hardware(generation).get("vertex") is None:
            raise ValueError(f"{parameter('accelerator_type')} {kind!r}: Vertex AI custom training does not offer "
                             f"{generation} slices; rent one as a TPU VM or a GKE node pool, or choose another "
                             "generation.")
        return
    from google.cloud.aiplatform_v1.types import accelerator_type

    offered = [name for name in accelerator_type.AcceleratorType.__members__ if name != "ACCELERATOR_TYPE_UNSPECIFIED"]
    if kind not in offered:
        raise ValueError(f"{parameter('accelerator_type')} {kind!r} is not an accelerator Vertex AI offers; use CPU, "
                         f"one of {', '.join(offered)}, or a TPU slice: {', '.join(slice_types)} with "
                         f"{parameter('tpu_topology')} (e.g. TPU_V5_LITEPOD and 2x2).")
    if kind.startswith("NVIDIA") and values["accelerator_count"] not in GPUS_PER_MACHINE:
        raise ValueError(f"{parameter('accelerator_count')} {values['accelerator_count']} is not a number of GPUs a "
                         f"Vertex AI machine carries; use {', '.join(map(str, GPUS_PER_MACHINE))}.")


def classes_against_labels(values: dict, where: Where) -> None:
    """The model's classes against the label values of the training label maps, where this machine can read them
    (a local run); the train step refuses the same in the same words when it cannot be checked here."""
    if where.vertex or values["task"] != "segmentation" or not values.get("train_input_uri") or "clip_length" in values:
        return  # video masks are read by the preprocess step, whose summary training checks the classes against
    from preprocessing.ct import label_pairing, label_maps

    config = train_configuration(values)
    pairing = label_pairing.pair(values["train_input_uri"], values["train_labels_uri"] or None)
    labelled = [case for case in pairing.cases if case.label is not None and not case.label.dicom_label]
    if not labelled:
        return
    where.log(f"checking the label values of {len(labelled)} training label map(s) against "
              f"{config.model.num_classes} classes")
    found = label_maps.values_in([case.label.path for case in labelled])
    if found and max(found) >= config.model.num_classes:
        given = values["train_overrides"].get("model.num_classes") or (values["train_overrides"].get("model") or {}).get(
            "num_classes")
        source = "" if given else f" (the {values['preset']} preset's)"
        raise ValueError(
            f"the model's {config.model.num_classes} classes{source} are too few for the label maps at "
            f"{values['train_labels_uri'] or values['train_input_uri']}: they hold label values "
            f"{', '.join(map(str, found))}; pass {parameter('train_overrides')}='{{\"model.num_classes\": "
            f"{max(found) + 1}}}' or more.")


def class_names_against_model(values: dict, where: Where) -> None:
    """The report's `class_names` (comma-separated, background first), one per class of the model the train step
    resolves: the evaluate step refuses another count only after training."""
    from common import parsing

    names = parsing.parse_list(values.get("class_names") or "", str, "class_names")
    if not names or values["task"] != "segmentation":  # detection's class count comes from the data's label map
        return
    classes = train_configuration(values).model.num_classes
    if len(names) != classes:
        raise ValueError(f"{parameter('class_names')} {values['class_names']!r} names {len(names)} classes but the "
                         f"model has {classes} (background included); give one name per class, background first, or "
                         f"set the model's classes with {parameter('train_overrides')}='{{\"model.num_classes\": "
                         f"{len(names)}}}'.")


TRAIN = ("preset", "steps", "batch_size", "learning_rate", "input_partition_dims", "precision", "train_overrides",
         "model_code", "model_function", "augmentation")  # augmentation: the segmentation pipeline's only
# Each rule over several parameters, with the parameters it judges.
TOGETHER: dict[Callable[[dict, Where], None], tuple[str, ...]] = {
    ct_grid: ("spacing", "window", "shape"),
    video_clips: ("clip_length", "clip_stride", "size"),
    train_configuration: TRAIN,
    placement: ("accelerator_type", "tpu_topology", "accelerator_count"),
    classes_against_labels: (*TRAIN, "train_input_uri", "train_labels_uri"),
    class_names_against_model: (*TRAIN, "class_names"),
}
# Parameters no rule needs to judge: their type is all there is to them (checked as they are parsed), or any text
# will do (a machine type Vertex names).
FREE = ("pseudonymize", "restart_job_on_worker_restart", "machine_type")


def check(pipeline: str, arguments: dict, where: Where = Where()) -> dict:
    """Refuses what a step of `pipeline` would refuse, before any runs; returns every parameter's value.

    Args:
        pipeline: a name of `definitions.PIPELINES`.
        arguments: the parameters given (typed, as `vertex.parse_parameters` returns them).
        where: this machine or Vertex AI (inputs must be local paths, or Cloud Storage).

    Raises:
        ValueError: one sentence naming the parameter, its value and the fix.
    """
    specs = definitions.parameters(pipeline)
    missing = [name for name, spec in specs.items()
               if spec.default is None and not spec.optional and arguments.get(name, "") == ""]
    if missing:
        needed = " and ".join(f"{parameter(name)}=..." for name in missing)
        what = ", ".join(REQUIRED_WHAT.get(name, name) for name in missing)
        raise ValueError(f"pipeline {pipeline} needs {needed} ({what}: a folder or file each"
                         f"{', in Cloud Storage' if where.vertex else ''}); `fullres pipeline parameters --pipeline "
                         f"{pipeline}` lists every parameter.")
    values = {**{name: spec.default for name, spec in specs.items()}, **arguments, "task": TASKS[pipeline]}
    for name, value in values.items():
        if name in RULES:
            RULES[name](value, name, where)
    for rule in TOGETHER:
        rule(values, where)
    return values
