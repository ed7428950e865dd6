"""The KFP components: one thin adapter per step, from typed artifacts to library calls.

KFP embeds each function's source in the compiled pipeline and runs it in the
fullres container image (or, under `kfp.local`'s SubprocessRunner, in this
environment), so every body imports what it uses. `make_components(image)`
binds the functions to a container image; the image is a compile option
(`fullres pipeline compile --image ...`).

Artifacts are directories: a Dataset holds TFRecord shards (+ `summary.json`,
`dead_letter.jsonl`, `label_map.json`), a Model the trainer's output directory
(`model.keras`, `train_config.json`, checkpoints, TensorBoard logs) or the
exported SavedModel, Metrics the scores as JSON, HTML the report; the predict step's
Dataset holds masks (+ `summary.json`, `dead_letter.jsonl`).
"""


from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output

from components import image_name


def preprocess_ct(
    input_uri: str,
    dataset: Output[Dataset],
    labels_uri: str = "",
    spacing: str = "1.0,1.0,1.0",
    window: str = "-1000,1000",
    shape: str = "",
    beam_args: list = [],  # noqa: B006  (KFP needs a literal default)
    max_failed_fraction: float = 0.1,
    pseudonymize: bool = False,
):
    """CT scans (+ label maps) to TFRecords with Beam; `beam_args` picks the runner (DataflowRunner on Vertex).

    With `pseudonymize`, case ids are keyed hashes; the key and the mapping back lie beside the dataset artifact
    (`DATASET.pseudonym-key`, `DATASET.pseudonyms.json`), never inside it.
    """
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from common import identifiers
    from components import runtime
    from preprocessing.beam import ct_pipeline
    from preprocessing.ct import ct_settings, ct_transforms

    output = runtime.output_location(dataset, beam_args)
    config = ct_transforms.CtPreprocessConfig(**ct_settings.grid_from_text(spacing, window, shape,
                                                                           ct_settings.parameter_name))
    summary = ct_pipeline.run(input_path=runtime.readable(input_uri), output=output,
                              labels=runtime.readable(labels_uri) or None, config=config,
                              pipeline_args=runtime.beam_arguments(beam_args), max_failed_fraction=max_failed_fraction,
                              pseudonymize=pseudonymize,
                              pseudonym_key_file=identifiers.key_path(dataset.path) if pseudonymize else None,
                              log=runtime.log)
    runtime.describe_dataset(dataset, summary, output)


def preprocess_images(
    annotations_uri: str,
    images_uri: str,
    dataset: Output[Dataset],
    beam_args: list = [],  # noqa: B006
    max_failed_fraction: float = 0.1,
):
    """Images with COCO JSON or VOC XML boxes to TF Object Detection API TFRecords with Beam."""
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from components import runtime
    from preprocessing.beam import images_pipeline

    output = runtime.output_location(dataset, beam_args)
    summary = images_pipeline.run(annotations=runtime.readable(annotations_uri), images=runtime.readable(images_uri),
                                  output=output,
                                  pipeline_args=runtime.beam_arguments(beam_args),
                                  max_failed_fraction=max_failed_fraction, log=runtime.log)
    runtime.describe_dataset(dataset, summary, output)


def preprocess_video(
    input_uri: str,
    dataset: Output[Dataset],
    labels_uri: str = "",
    clip_length: int = 16,
    clip_stride: int = 0,
    size: str = "128,128",
    beam_args: list = [],  # noqa: B006
    max_failed_fraction: float = 0.1,
):
    """Videos (MP4, MOV, AVI, MKV, or DAVIS / YouTube-VOS frame folders) with per-frame masks to clip records with
    Beam; `clip_stride` 0 puts clips side by side."""
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from common import parsing
    from components import runtime
    from preprocessing.beam import video_pipeline
    from preprocessing.video import video_clips

    output = runtime.output_location(dataset, beam_args)
    config = video_clips.VideoPreprocessConfig(clip_length, clip_stride or None,
                                               tuple(parsing.parse_list(size, int, "size", "64,64") or ()))
    summary = video_pipeline.run(input_path=runtime.readable(input_uri), output=output,
                                 labels=runtime.readable(labels_uri) or None, config=config,
                                 pipeline_args=runtime.beam_arguments(beam_args),
                                 max_failed_fraction=max_failed_fraction, log=runtime.log)
    runtime.describe_dataset(dataset, summary, output)


def train(
    train_data: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    task: str = "segmentation",
    preset: str = "default",
    steps: int = 0,
    batch_size: int = 0,
    learning_rate: float = 0.0,
    input_partition_dims: str = "",
    precision: str = "",
    augmentation: str = "",
    overrides: dict = {},  # noqa: B006
    model_code: str = "",
    model_function: str = "",
    class_names: str = "",
):
    """Trains the UNet, the RetinaNet, or the user's own network on `train_data`; 0 or "" keeps the preset's value.

    `class_names` (segmentation; comma-separated, background first, as the evaluate step's) name the classes
    where the data's label_map.json does not; the run keeps them, so predict names its masks' classes by them.

    `model_code` is the text of the user's network file and `model_function` the function in it that returns the
    network (`fullres train --model FILE.py:FUNCTION`, where the step runs); "" trains the task's own model. The
    run keeps a copy of the file, so evaluate, export and predict rebuild the network from the model artifact.

    `augmentation` (segmentation): the device augmentations' preset, nnunet, flips, intensity or none.
    Multi-host runs (several replicas of a Vertex custom job, or a TPU slice)
    start `jax.distributed` first; only the first process writes the outputs.
    A preempted run (SIGTERM) checkpoints and exits with status 75; rerun, it resumes.
    """
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from common import parsing
    from components import runtime
    from trainer.parallel import distributed

    distributed.initialize_from_environment()
    from trainer import train as train_lib

    config = runtime.train_config(
        task=task, preset=preset, train_data=train_data.path + "/data-*", output_dir=model.path, steps=steps,
        batch_size=batch_size, learning_rate=learning_rate, input_partition_dims=input_partition_dims,
        precision=precision, augmentation=augmentation, overrides=overrides,
        model_source=runtime.model_source(model_code, model_function))
    try:
        results = train_lib.train(config, log=runtime.log, export_saved_model=False,
                                  class_names=parsing.parse_list(class_names, str, "class_names") or None)
    except distributed.Preempted as preempted:  # checkpointed: the restarted job resumes
        runtime.log(str(preempted))
        raise SystemExit(distributed.PREEMPTED_EXIT_CODE) from None
    runtime.write_metrics(metrics, results, ("final_loss", "steps", "train_seconds", "steps_per_second"))
    model.metadata.update({"task": task, "framework": "keras", "input_partition_dims": results["input_partition_dims"]})


def evaluate(
    model: Input[Model],
    eval_data: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[HTML],
    class_names: str = "",
    report_examples: int = 4,
    pseudonymize: bool = False,
):
    """Scores the model on held-out data at full resolution (Dice or COCO mAP) and writes the HTML report.

    With `pseudonymize`, the report shows no case id that is not a pseudonym."""
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from common import parsing
    from components import runtime
    from trainer import evaluate as evaluate_lib

    names = parsing.parse_list(class_names, str, "class_names")
    scores = evaluate_lib.evaluate_trained(
        model.path, eval_data.path + "/data-*", report_path=report.path,
        class_names=list(names) if names else None, report_examples=report_examples, pseudonymize=pseudonymize,
        log=runtime.log)
    runtime.write_metrics(metrics, scores, ("dice_mean", "mAP", "mAP@0.5"))


def export(model: Input[Model], exported: Output[Model]):
    """The trained model as a TensorFlow SavedModel (serving signature `serve`) and a Keras file."""
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from trainer import export as export_lib

    paths = export_lib.export_trained(model.path, exported.path)
    exported.metadata.update({"framework": "tensorflow", "saved_model": paths["saved_model"]})


def predict(
    model: Input[Model],
    masks: Output[Dataset],
    input_uri: str,
    input_partition_dims: str = "",
    output_format: str = "",
    probabilities: bool = False,
    dicom_seg: bool = True,
    pseudonymize: bool = False,
):
    """Segments the scans at `input_uri` (a scan, a DICOM series, or a folder of cases) with the trained model; a
    model trained on video clips segments the videos there (PNG masks per frame and an overlay MP4 per video).

    Masks in each scan's own geometry (and DICOM SEG for DICOM input), with
    `summary.json` and `dead_letter.jsonl`; "" keeps the training's split and
    each input's own format. With `pseudonymize`, cases are named by keyed hashes (no DICOM SEG), the key and
    the mapping back beside the masks artifact (`MASKS.pseudonym-key`, `MASKS.pseudonyms.json`).
    """
    from common import startup

    startup.collect_after_imports()  # before the heavy imports below
    from components import runtime
    from trainer.parallel import partitioning
    from trainer.predict import predict as predict_lib, video_predict

    if video_predict.is_video_run(model.path):
        summary = video_predict.predict_videos(model.path, runtime.readable(input_uri), masks.path,
                                               input_partition_dims=partitioning.parse_dims(input_partition_dims),
                                               log=runtime.log)
    else:
        summary = predict_lib.predict(model.path, runtime.readable(input_uri), masks.path,
                                      output_format_name=output_format or None,
                                      probabilities=probabilities, dicom_seg=dicom_seg,
                                      input_partition_dims=partitioning.parse_dims(input_partition_dims),
                                      pseudonymize=pseudonymize, log=runtime.log)
    masks.metadata.update({"content": "segmentation masks", "cases": summary["ok"], "failed": summary["failed"],
                           "input_partition_dims": summary["input_partition_dims"], "location": masks.path})
    if summary["ok"] == 0:
        raise RuntimeError(f"no scan at {input_uri} was predicted; see {masks.path}/dead_letter.jsonl.")


def worker_replicas(replica_count: int) -> int:
    """Hosts beyond the first (Vertex's second worker pool) for a multi-host custom job."""
    if replica_count < 1:
        raise ValueError(f"replica_count must be >= 1, got {replica_count}.")
    return replica_count - 1


class Components(NamedTuple):
    preprocess_ct: object
    preprocess_images: object
    preprocess_video: object
    train: object
    evaluate: object
    export: object
    worker_replicas: object
    predict: object


def make_components(image: str = image_name.DEFAULT_IMAGE) -> Components:
    """The components bound to a container image that has fullres (and the KFP SDK) installed."""

    def bind(function):
        return dsl.component(function, base_image=image, install_kfp_package=False)

    return Components(*(bind(f) for f in (preprocess_ct, preprocess_images, preprocess_video, train, evaluate, export,
                                          worker_replicas, predict)))
