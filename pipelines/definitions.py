"""The two pipelines, `ct-segmentation` and `detection`: preprocess → train → evaluate → export.

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

from kfp import dsl

from components import image_name, steps

CT_PIPELINE = "ct-segmentation"
DETECTION_PIPELINE = "detection"


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


def _train_evaluate_export(components, train_data, eval_data, train_arguments: dict, class_names, accelerator_type,
                           accelerator_count, machine_type, tpu_topology, replica_count, location, scheduling: dict,
                           predict_arguments: dict | None = None):
    """Train where `accelerator_type` says, then evaluate and export; with `predict_arguments` (segmentation),
    predict the scans at `predict_input_uri` when it is given, on the training's accelerators (one host)."""
    job, template = _custom_job(components)
    job_arguments = dict(location=location, **scheduling, **train_arguments)
    if predict_arguments is not None:
        predict_job, predict_template = _custom_job(components, components.predict, "fullres-predict")
        predict_input_uri = predict_arguments.pop("input_uri")

    def evaluate_export_predict(train_task, machine: dict | None):
        evaluation = components.evaluate(model=train_task.outputs["model"], eval_data=eval_data,
                                         class_names=class_names)
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


def ct_segmentation_pipeline(image: str = image_name.DEFAULT_IMAGE):
    """The CT segmentation pipeline bound to a container image."""
    components = steps.make_components(image)

    @dsl.pipeline(name=CT_PIPELINE, description="CT scans to a spatially partitioned 3D UNet: preprocess (Beam) → "
                                                "train → evaluate (Dice, HTML report) → export (SavedModel).")
    def pipeline(
        train_input_uri: str,
        eval_input_uri: str,
        train_labels_uri: str = "",
        eval_labels_uri: str = "",
        spacing: str = "1.0,1.0,1.0",
        window: str = "-1000,1000",
        shape: str = "",
        beam_args: list = [],  # noqa: B006
        max_failed_fraction: float = 0.1,
        preset: str = "default",
        steps: int = 0,
        batch_size: int = 0,
        learning_rate: float = 0.0,
        input_partition_dims: str = "",
        precision: str = "",
        train_overrides: dict = {},  # noqa: B006
        class_names: str = "",
        accelerator_type: str = "CPU",
        accelerator_count: int = 1,
        machine_type: str = "n1-standard-8",
        tpu_topology: str = "",
        replica_count: int = 1,
        location: str = "us-central1",
        strategy: str = "STANDARD",
        max_wait_duration: str = "86400s",
        restart_job_on_worker_restart: bool = False,
        predict_input_uri: str = "",
        predict_output_format: str = "",
    ):
        preprocessed = {}
        for split, input_uri, labels_uri in (("train", train_input_uri, train_labels_uri),
                                             ("eval", eval_input_uri, eval_labels_uri)):
            task = components.preprocess_ct(input_uri=input_uri, labels_uri=labels_uri, spacing=spacing,
                                            window=window, shape=shape, beam_args=beam_args,
                                            max_failed_fraction=max_failed_fraction)
            task.set_display_name(f"preprocess {split}")
            preprocessed[split] = task.outputs["dataset"]
        train_arguments = dict(task="segmentation", preset=preset, steps=steps, batch_size=batch_size,
                               learning_rate=learning_rate, input_partition_dims=input_partition_dims,
                               precision=precision, overrides=train_overrides)
        _train_evaluate_export(components, preprocessed["train"], preprocessed["eval"], train_arguments, class_names,
                               accelerator_type, accelerator_count, machine_type, tpu_topology, replica_count, location,
                               _scheduling(strategy, max_wait_duration, restart_job_on_worker_restart),
                               dict(input_uri=predict_input_uri, output_format=predict_output_format))

    return pipeline


def detection_pipeline(image: str = image_name.DEFAULT_IMAGE):
    """The detection pipeline bound to a container image."""
    components = steps.make_components(image)

    @dsl.pipeline(name=DETECTION_PIPELINE, description="Images with boxes to a spatially partitioned RetinaNet: "
                                                       "preprocess (Beam) → train → evaluate (COCO mAP, HTML report) "
                                                       "→ export (SavedModel).")
    def pipeline(
        train_annotations_uri: str,
        train_images_uri: str,
        eval_annotations_uri: str,
        eval_images_uri: str,
        beam_args: list = [],  # noqa: B006
        max_failed_fraction: float = 0.1,
        preset: str = "default",
        steps: int = 0,
        batch_size: int = 0,
        learning_rate: float = 0.0,
        input_partition_dims: str = "",
        precision: str = "",
        train_overrides: dict = {},  # noqa: B006
        accelerator_type: str = "CPU",
        accelerator_count: int = 1,
        machine_type: str = "n1-standard-8",
        tpu_topology: str = "",
        replica_count: int = 1,
        location: str = "us-central1",
        strategy: str = "STANDARD",
        max_wait_duration: str = "86400s",
        restart_job_on_worker_restart: bool = False,
    ):
        preprocessed = {}
        for split, annotations_uri, images_uri in (("train", train_annotations_uri, train_images_uri),
                                                   ("eval", eval_annotations_uri, eval_images_uri)):
            task = components.preprocess_images(annotations_uri=annotations_uri, images_uri=images_uri,
                                                beam_args=beam_args, max_failed_fraction=max_failed_fraction)
            task.set_display_name(f"preprocess {split}")
            preprocessed[split] = task.outputs["dataset"]
        train_arguments = dict(task="detection", preset=preset, steps=steps, batch_size=batch_size,
                               learning_rate=learning_rate, input_partition_dims=input_partition_dims,
                               precision=precision, overrides=train_overrides)
        _train_evaluate_export(components, preprocessed["train"], preprocessed["eval"], train_arguments, "",
                               accelerator_type, accelerator_count, machine_type, tpu_topology, replica_count, location,
                               _scheduling(strategy, max_wait_duration, restart_job_on_worker_restart))

    return pipeline


PIPELINES = {CT_PIPELINE: ct_segmentation_pipeline, DETECTION_PIPELINE: detection_pipeline}
# Where `fullres pipeline compile` writes each pipeline (relative to the repository root).
COMPILED_FILES = {CT_PIPELINE: "pipeline.yaml", DETECTION_PIPELINE: "detection-pipeline.yaml"}


def compile_pipeline(name: str, path: str, image: str = image_name.DEFAULT_IMAGE) -> str:
    """Compiles pipeline `name` for `image` into `path` (deterministic: same inputs, same bytes)."""
    from kfp import compiler

    if name not in PIPELINES:
        raise ValueError(f"pipeline {name!r} is not known; use one of {', '.join(PIPELINES)}.")
    compiler.Compiler().compile(PIPELINES[name](image), path)
    return path
