"""The pipelines, `ct-segmentation`, `video-segmentation` and `detection`: preprocess → train → evaluate → export
(→ predict, for segmentation).

Training runs where the `accelerator_type` parameter says, decided when the
pipeline runs (so one compiled file serves the laptop and the cloud):

* "CPU" (the default): the train component itself — what `kfp.local` runs,
  and a CPU node on Vertex AI.
* a TPU slice (`tpu_topology` set, e.g. machine `ct5lp-hightpu-4t`, topology
  `2x2`): a Vertex custom job whose worker pool asks for that machine and
  topology (`CustomTrainingJobOp` worker pool specs); JAX finds the slice's
  hosts itself.
* any other accelerator (`NVIDIA_L4`, `NVIDIA_TESLA_A100`, or `TPU_V3` on
  machine `cloud-tpu`): the train component turned into a Vertex custom job by
  `create_custom_training_job_from_component`, with `accelerator_count` per
  host and `replica_count` hosts (multi-host: a chief pool and a worker pool;
  the trainer starts `jax.distributed` from Vertex's CLUSTER_SPEC).

Custom jobs are scheduled as `strategy` says: STANDARD (on-demand), SPOT
(preemptible, cheaper) or FLEX_START (waits up to `max_wait_duration` for
capacity). A preempted trainer checkpoints and exits with status 75; with
`restart_job_on_worker_restart` Vertex restarts it and it resumes.

Evaluate and export follow in each branch rather than after a `dsl.OneOf`:
the local runner cannot yet pick an artifact out of a OneOf, and the pipeline
must run there too. Preprocessing runs Beam with `beam_args` (add
`--runner=DataflowRunner --project ... --region ... --temp_location gs://...`
to run it on Dataflow).
"""


import copy
import functools
import inspect

from kfp import dsl

from components import image_name, steps

CT_PIPELINE = "ct-segmentation"
DETECTION_PIPELINE = "detection"
VIDEO_PIPELINE = "video-segmentation"


def _custom_job(components: steps.Components, component=None, display_name: str = "fullres-train"):
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    job = create_custom_training_job_from_component(component or components.train, display_name=display_name)
    template = job.component_spec.inputs["worker_pool_specs"].default[0]  # the train container, placeholders resolved
    return job, template


def _scheduling(strategy, max_wait_duration, restart_job_on_worker_restart) -> dict:
    """Vertex's scheduling of the training custom job (pipeline parameters of the same names)."""
    return dict(strategy=strategy, max_wait_duration=max_wait_duration,
                restart_job_on_worker_restart=restart_job_on_worker_restart)


def _pool(template: dict, machine_spec: dict, replica_count) -> dict:
    pool = copy.deepcopy(template)
    pool["machine_spec"] = machine_spec
    pool["replica_count"] = replica_count
    return pool


def _train_evaluate_export(components, preprocessed: dict, train_arguments: dict, class_names, values: dict,
                           predict_arguments: dict | None = None, evaluate_arguments: dict | None = None):
    """Train where `accelerator_type` says, then evaluate and export; with `predict_arguments` (segmentation),
    predict the scans at `predict_input_uri` when it is given, on the training's accelerators (one host).

    `values` holds the pipeline's `PLACEMENT` parameters; `preprocessed` the train and eval datasets."""
    train_data, eval_data = preprocessed["train"], preprocessed["eval"]
    accelerator_type, accelerator_count, machine_type, tpu_topology, replica_count, location = (
        values[name] for name in ("accelerator_type", "accelerator_count", "machine_type", "tpu_topology",
                                  "replica_count", "location"))
    scheduling = _scheduling(values["strategy"], values["max_wait_duration"], values["restart_job_on_worker_restart"])
    job, template = _custom_job(components)
    job_arguments = dict(location=location, **scheduling, **train_arguments)
    if predict_arguments is not None:
        predict_job, predict_template = _custom_job(components, components.predict, "fullres-predict")
        predict_input_uri = predict_arguments.pop("input_uri")

    def evaluate_export_predict(train_task, machine: dict | None):
        evaluation = components.evaluate(model=train_task.outputs["model"], eval_data=eval_data,
                                         class_names=class_names, **(evaluate_arguments or {}))
        evaluation.set_display_name("evaluate")
        components.export(model=train_task.outputs["model"]).set_display_name("export")
        if predict_arguments is None:
            return
        with dsl.If(predict_input_uri != "", name="predict-new-scans"):
            if machine is None:
                predicted = components.predict(model=train_task.outputs["model"], input_uri=predict_input_uri,
                                               **predict_arguments)
            else:
                predicted = predict_job(model=train_task.outputs["model"], input_uri=predict_input_uri,
                                        worker_pool_specs=[_pool(predict_template, machine, 1)], location=location,
                                        **scheduling, **predict_arguments)
            predicted.set_display_name("predict")

    with dsl.If(accelerator_type == "CPU", name="train-here"):
        train = components.train(train_data=train_data, **train_arguments)
        train.set_display_name("train")
        evaluate_export_predict(train, None)
    with dsl.Elif(tpu_topology != "", name="train-on-tpu-slice"):
        machine = {"machine_type": machine_type, "tpu_topology": tpu_topology}
        pools = [_pool(template, machine, 1)]
        train = job(train_data=train_data, worker_pool_specs=pools, **job_arguments)
        train.set_display_name("train (TPU slice)")
        evaluate_export_predict(train, machine)
    with dsl.Elif(replica_count == 1, name="train-on-accelerator-host"):
        machine = {"machine_type": machine_type, "accelerator_type": accelerator_type,
                   "accelerator_count": accelerator_count}
        train = job(train_data=train_data, worker_pool_specs=[_pool(template, machine, 1)], **job_arguments)
        train.set_display_name("train (accelerators)")
        evaluate_export_predict(train, machine)
    with dsl.Else(name="train-on-accelerator-hosts"):
        machine = {"machine_type": machine_type, "accelerator_type": accelerator_type,
                   "accelerator_count": accelerator_count}
        workers = components.worker_replicas(replica_count=replica_count)
        pools = [_pool(template, machine, 1), _pool(template, machine, workers.output)]
        train = job(train_data=train_data, worker_pool_specs=pools, **job_arguments)
        train.set_display_name("train (multi-host)")
        evaluate_export_predict(train, machine)


# ---------------------------------------------------------------- the pipelines' parameters
# KFP reads a pipeline's parameters from its function's signature (`inspect.signature`, which honours
# `__signature__`) and calls it once with a channel per parameter, positionally. A parameter a pipeline hands
# straight to a component takes its type and default from that component's own signature, so the two cannot
# drift; the components' signatures stay written out, because KFP embeds their source in the compiled file.


def _own(name: str, annotation: type, default=inspect.Parameter.empty) -> tuple[inspect.Parameter, None]:
    """A parameter of the pipeline itself (it passes to no one component under its own name)."""
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation,
                             default=default), None


def _passed(component, name: str, as_name: str | None = None) -> tuple[inspect.Parameter, str]:
    """Pipeline parameter `as_name` (default `name`): `component`'s parameter `name`, its type and default."""
    return inspect.signature(component).parameters[name].replace(name=as_name or name), name


def _arguments(values: dict, group) -> dict:
    """The component's arguments from the pipeline's `values`, for the parameters of `group`."""
    return {target: values[parameter.name] for parameter, target in group}


PREPROCESS_CT = tuple(_passed(steps.preprocess_ct, name)
                      for name in ("spacing", "window", "shape", "beam_args", "max_failed_fraction", "pseudonymize"))
PREPROCESS_IMAGES = tuple(_passed(steps.preprocess_images, name) for name in ("beam_args", "max_failed_fraction"))
TRAIN = (*(_passed(steps.train, name) for name in ("preset", "steps", "batch_size", "learning_rate",
                                                    "input_partition_dims", "precision")),
         _passed(steps.train, "overrides", "train_overrides"))
SEGMENTATION_TRAIN = (*TRAIN, _passed(steps.train, "augmentation"))  # detection augments its input on the host
# A user's own network (segmentation only): the text of its Python file and the function in it, so the train step
# builds it wherever it runs (on Vertex the file's local path does not exist); the run keeps a copy.
USER_NETWORK = (_passed(steps.train, "model_code"), _passed(steps.train, "model_function"))
# Where and how training (and predict) run: see the module's docstring.
PLACEMENT = (_own("accelerator_type", str, "CPU"), _own("accelerator_count", int, 1),
             _own("machine_type", str, "n1-standard-8"), _own("tpu_topology", str, ""), _own("replica_count", int, 1),
             _own("location", str, "us-central1"), _own("strategy", str, "STANDARD"),
             _own("max_wait_duration", str, "86400s"), _own("restart_job_on_worker_restart", bool, False))


def _pipeline(name: str, description: str, parameters, body):
    """`dsl.pipeline` over `body(values)`, its signature the `parameters` ((parameter, target) pairs, in order)."""
    names = [parameter.name for parameter, _ in parameters]

    def pipeline(*channels):
        body(dict(zip(names, channels)))

    pipeline.__signature__ = inspect.Signature([parameter for parameter, _ in parameters])
    return dsl.pipeline(name=name, description=description)(pipeline)


def ct_segmentation_pipeline(image: str = image_name.DEFAULT_IMAGE):
    """The CT segmentation pipeline bound to a container image."""
    components = steps.make_components(image)
    parameters = (
        _passed(steps.preprocess_ct, "input_uri", "train_input_uri"),
        _passed(steps.preprocess_ct, "input_uri", "eval_input_uri"),
        _passed(steps.preprocess_ct, "labels_uri", "train_labels_uri"),
        _passed(steps.preprocess_ct, "labels_uri", "eval_labels_uri"),
        *PREPROCESS_CT,
        *SEGMENTATION_TRAIN,
        *USER_NETWORK,
        _passed(steps.evaluate, "class_names"),
        *PLACEMENT,
        _own("predict_input_uri", str, ""),  # "" skips predict (the component needs one)
        _passed(steps.predict, "output_format", "predict_output_format"),
    )

    def body(values: dict):
        preprocessed = {}
        for split in ("train", "eval"):
            task = components.preprocess_ct(input_uri=values[f"{split}_input_uri"],
                                            labels_uri=values[f"{split}_labels_uri"],
                                            **_arguments(values, PREPROCESS_CT))
            task.set_display_name(f"preprocess {split}")
            preprocessed[split] = task.outputs["dataset"]
        # pseudonymize reaches preprocess (case ids), evaluate (the report) and predict (mask names, summary).
        _train_evaluate_export(components, preprocessed,
                               dict(task="segmentation", **_arguments(values, SEGMENTATION_TRAIN),
                                    **_arguments(values, USER_NETWORK), class_names=values["class_names"]),
                               values["class_names"], values,
                               dict(input_uri=values["predict_input_uri"], output_format=values["predict_output_format"],
                                    pseudonymize=values["pseudonymize"]),
                               dict(pseudonymize=values["pseudonymize"]))

    return _pipeline(CT_PIPELINE, "CT scans to a spatially partitioned 3D UNet: preprocess (Beam) → train → evaluate "
                                  "(Dice, HTML report) → export (SavedModel).", parameters, body)


# The video pipeline trains the `video` preset (a 3D UNet over RGB frames) unless told otherwise.
VIDEO_TRAIN = tuple((parameter.replace(default="video"), target) if target == "preset" else (parameter, target)
                    for parameter, target in SEGMENTATION_TRAIN)
PREPROCESS_VIDEO = tuple(_passed(steps.preprocess_video, name)
                         for name in ("clip_length", "clip_stride", "size", "beam_args", "max_failed_fraction"))


def video_segmentation_pipeline(image: str = image_name.DEFAULT_IMAGE):
    """The video segmentation pipeline bound to a container image: CT's, with the video reader and outputs."""
    components = steps.make_components(image)
    parameters = (
        _passed(steps.preprocess_video, "input_uri", "train_input_uri"),
        _passed(steps.preprocess_video, "input_uri", "eval_input_uri"),
        _passed(steps.preprocess_video, "labels_uri", "train_labels_uri"),
        _passed(steps.preprocess_video, "labels_uri", "eval_labels_uri"),
        *PREPROCESS_VIDEO,
        *VIDEO_TRAIN,
        *USER_NETWORK,
        _passed(steps.evaluate, "class_names"),
        *PLACEMENT,
        _own("predict_input_uri", str, ""),  # "" skips predict
    )

    def body(values: dict):
        preprocessed = {}
        for split in ("train", "eval"):
            task = components.preprocess_video(input_uri=values[f"{split}_input_uri"],
                                               labels_uri=values[f"{split}_labels_uri"],
                                               **_arguments(values, PREPROCESS_VIDEO))
            task.set_display_name(f"preprocess {split}")
            preprocessed[split] = task.outputs["dataset"]
        _train_evaluate_export(components, preprocessed,
                               dict(task="segmentation", **_arguments(values, VIDEO_TRAIN),
                                    **_arguments(values, USER_NETWORK), class_names=values["class_names"]),
                               values["class_names"], values, dict(input_uri=values["predict_input_uri"]))

    return _pipeline(VIDEO_PIPELINE, "Videos to a 3D UNet split over time and space: preprocess (Beam, clips) → "
                                     "train → evaluate (Dice, HTML report) → export (SavedModel) → predict (masks "
                                     "per frame, overlay MP4).", parameters, body)


def detection_pipeline(image: str = image_name.DEFAULT_IMAGE):
    """The detection pipeline bound to a container image."""
    components = steps.make_components(image)
    parameters = (
        _passed(steps.preprocess_images, "annotations_uri", "train_annotations_uri"),
        _passed(steps.preprocess_images, "images_uri", "train_images_uri"),
        _passed(steps.preprocess_images, "annotations_uri", "eval_annotations_uri"),
        _passed(steps.preprocess_images, "images_uri", "eval_images_uri"),
        *PREPROCESS_IMAGES,
        *TRAIN,
        *PLACEMENT,
    )

    def body(values: dict):
        preprocessed = {}
        for split in ("train", "eval"):
            task = components.preprocess_images(annotations_uri=values[f"{split}_annotations_uri"],
                                                images_uri=values[f"{split}_images_uri"],
                                                **_arguments(values, PREPROCESS_IMAGES))
            task.set_display_name(f"preprocess {split}")
            preprocessed[split] = task.outputs["dataset"]
        _train_evaluate_export(components, preprocessed, dict(task="detection", **_arguments(values, TRAIN)), "",
                               values)

    return _pipeline(DETECTION_PIPELINE, "Images with boxes to a spatially partitioned RetinaNet: preprocess (Beam) → "
                                         "train → evaluate (COCO mAP, HTML report) → export (SavedModel).",
                     parameters, body)


PIPELINES = {CT_PIPELINE: ct_segmentation_pipeline, DETECTION_PIPELINE: detection_pipeline,
             VIDEO_PIPELINE: video_segmentation_pipeline}


@functools.cache
def parameters(name: str) -> dict:
    """`{parameter: its InputSpec (type, default, optional)}` of pipeline `name`, built once per process."""
    return dict(PIPELINES[name]().component_spec.inputs)
# Where `fullres pipeline compile` writes each pipeline (relative to the repository root).
COMPILED_FILES = {CT_PIPELINE: "pipeline.yaml", DETECTION_PIPELINE: "detection-pipeline.yaml",
                  VIDEO_PIPELINE: "video-pipeline.yaml"}


def compile_pipeline(name: str, path: str, image: str = image_name.DEFAULT_IMAGE) -> str:
    """Compiles pipeline `name` for `image` into `path` (deterministic: same inputs, same bytes)."""
    from kfp import compiler

    if name not in PIPELINES:
        raise ValueError(f"pipeline {name!r} is not known; use one of {', '.join(PIPELINES)}.")
    compiler.Compiler().compile(PIPELINES[name](image), path)
    return path
