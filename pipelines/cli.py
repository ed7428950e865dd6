"""The `fullres` command line.

Commands import their heavy libraries (JAX, Keras, TensorFlow) only when they
run, so `fullres --help` is instant and `--virtual-devices` can still set
`XLA_FLAGS` before JAX starts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from trainer import cli as trainer_cli
from trainer.cli import (  # noqa: F401  (the helpers every command here shares)
    _fail,
    _fail_if_write_error,
    _jax_backend_started,
    _print,
    _set_host_device_count,
    _use_virtual_devices,
)


app = typer.Typer(rich_markup_mode=None,
    name="fullres",
    help="Train CNNs on full-resolution CT volumes and large images, split spatially across accelerator cores.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.callback()(trainer_cli.global_options)
app.command()(trainer_cli.train)


DEMO_PREPROCESSING = {"spacing": "1.7,1.7,2.25", "window": "-200,300", "shape": "32,32,32"}


@app.command()
def demo(
    output: Annotated[Path, typer.Option(help="Directory for the demo data, the pipeline's artifacts and summary.json.")] = Path(
        "fullres-demo"
    ),
    steps: Annotated[int | None, typer.Option(help="Training steps (the demo preset's default when omitted).")] = None,
    cases: Annotated[int, typer.Option(help="Synthetic training cases to generate.")] = 24,
    eval_cases: Annotated[int, typer.Option(help="Synthetic held-out cases to score.")] = 6,
) -> None:
    """The built-in demo: synthetic CT scans through the ct-segmentation pipeline, run here by the local KFP runner.

    Generates NIfTI scans with label maps, then runs preprocess (Beam) → train
    (3D UNet) → evaluate (Dice, HTML report) → export, and writes summary.json.
    """
    from preprocessing import output_guard

    output = output.resolve()
    try:
        output_guard.check_owned_directory(str(output), "demo", {})
        output.mkdir(parents=True, exist_ok=True)
        output_guard.write_marker(str(output), "demo")
        with output_guard.lock(str(output)):
            _run_demo(output, steps, cases, eval_cases)
    except output_guard.OutputRefused as error:
        _fail(str(error))
    except OSError as error:
        _fail_if_write_error(error, output)


def _run_demo(output: Path, steps: int | None, cases: int, eval_cases: int) -> None:
    from pipelines import definitions, local_run
    from preprocessing import demo_ct

    _print(f"generating {cases} training and {eval_cases} held-out synthetic CT scans (NIfTI) in {output / 'data'}")
    # 32×64×64 voxels at 0.7–1.0 mm in-plane and 1.5–3 mm slices; resampled to 1.7×1.7×2.25 mm
    # (≈32³ on average) and cut or padded to 32³.
    train_cases = demo_ct.write_demo_cases(str(output / "data" / "train"), cases, (32, 64, 64), seed=0, formats=("nifti",))
    eval_cases_dir = demo_ct.write_demo_cases(str(output / "data" / "eval"), eval_cases, (32, 64, 64), seed=1,
                                              formats=("nifti",))
    arguments = dict(
        train_input_uri=os.path.join(train_cases["nifti"], "images"),
        train_labels_uri=os.path.join(train_cases["nifti"], "labels"),
        eval_input_uri=os.path.join(eval_cases_dir["nifti"], "images"),
        eval_labels_uri=os.path.join(eval_cases_dir["nifti"], "labels"),
        preset="demo", class_names=",".join(demo_ct.CLASS_NAMES), **DEMO_PREPROCESSING,
    )
    if steps is not None:
        arguments["steps"] = steps
    try:
        run = local_run.run_local(definitions.CT_PIPELINE, arguments, str(output / "pipeline-root"), log=_print)
    except local_run.PipelineRunFailed as error:
        _fail(str(error))
    outputs = run["outputs"]
    metrics_path = local_run.find_output(outputs, "evaluate", "metrics")
    scores = json.loads(Path(metrics_path).read_text())
    # KFP names the HTML artifact just "report"; a copy with its extension opens in any browser.
    report = output / "report.html"
    report.write_text(Path(local_run.find_output(outputs, "evaluate", "report")).read_text())
    summary = {
        "dice_mean": scores.get("dice_mean"),
        "dice_per_class": scores.get("dice_per_class"),
        "class_names": scores.get("class_names"),
        "model": local_run.find_output(outputs, "train", "model"),
        "saved_model": local_run.find_output(outputs, "export", "exported"),
        "report": str(report),
        "metrics": metrics_path,
        "run_dir": run["run_dir"],
    }
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    _print(f"demo done: foreground Dice {summary['dice_mean']:.3f}; report {summary['report']}; "
           f"summary in {output / 'summary.json'}")


@app.command()
def plan(
    model: Annotated[str | None, typer.Option(help="Shorthand: unet3d, unet2d (segmentation) or retinanet (detection); default: the preset's task.")] = None,
    preset: Annotated[str, typer.Option(help="The training preset to size, as for fullres train (default: the task's default).")] = "default",
    image_size: Annotated[str | None, typer.Option(help="Spatial size of one input, e.g. 256,256,256 (D,H,W; the default) or 2560,2560 (the detection canvas).")] = None,
    partitions: Annotated[str, typer.Option(help="Core counts N to compare, e.g. 1,2,4,8,16 or 64.")] = "1,2,4,8,16",
    layouts: Annotated[str, typer.Option(help="default: N-way along the first spatial dimension; all: every split of N over the spatial dimensions that divides, ranked.")] = "default",
    precision: Annotated[str | None, typer.Option(help="float32 or bfloat16.")] = None,
    remat: Annotated[bool | None, typer.Option("--remat/--no-remat", help="Recompute activations in the backward pass.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Examples per replica.")] = None,
    num_levels: Annotated[int | None, typer.Option(help="UNet resolution levels (default: the preset's).")] = None,
    base_filters: Annotated[int | None, typer.Option(help="UNet filters at the first level.")] = None,
    settings: Annotated[list[str] | None, typer.Option("--set", help="Any training setting as a dotted key, as for fullres train (repeatable).")] = None,
    device_memory: Annotated[str | None, typer.Option(help="Memory of one device, e.g. 16GiB: layouts that fit rank first, and the smallest N that fits is named.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the rows (with input_partition_dims, rank, halo bound) as JSON.")] = False,
) -> None:
    """Size a run before renting accelerators: per-device memory and halo traffic of the step fullres train compiles."""
    from trainer import config as config_lib

    try:
        counts = config_lib.parse_list(partitions, int, "--partitions") or ()
        size = config_lib.parse_list(image_size, int, "--image-size") if image_size else None
        given = config_lib.parse_settings(settings or [])
    except ValueError as error:
        _fail(str(error))
    if not _jax_backend_started():
        # Only the CPU platform reads this flag: on a TPU or GPU host the plan uses the
        # real devices; without an accelerator the CPU poses as enough devices.
        _set_host_device_count(max(counts, default=1))
    from trainer import memory_plan

    flags = {"precision": precision, "remat": remat, "batch_size": batch_size, "model.num_levels": num_levels,
             "model.base_filters": base_filters}
    try:
        results, header = memory_plan.run(
            model=model, preset=preset, settings={**{k: v for k, v in flags.items() if v is not None}, **given},
            image_size=size, partitions=counts, layouts_to_try=layouts, device_memory=device_memory,
            log=lambda line: typer.echo(line, err=True))
    except ValueError as error:
        _fail(str(error))
    if json_output:
        typer.echo(json.dumps([r.to_json() for result in results for r in result.rows], indent=2))
        return
    typer.echo("\n".join(memory_plan.table(results, header, device_memory)))


preprocess_app = typer.Typer(rich_markup_mode=None, help="Convert CT scans or annotated images into sharded TFRecords with Apache Beam.",
                             no_args_is_help=True)
app.add_typer(preprocess_app, name="preprocess")
demo_data_app = typer.Typer(rich_markup_mode=None, help="Write synthetic demo data (no downloads).", no_args_is_help=True)
app.add_typer(demo_data_app, name="demo-data")

BEAM_HELP = (
    "Beam runner: DirectRunner (this machine: Beam's local FnApi runner, one worker per core) or DataflowRunner (add --project, --region, "
    "--temp_location and any other Beam option after the known ones)."
)


# Options every conversion command shares.
ConversionOutput = Annotated[str, typer.Option(help="Output directory (replaced whole, atomically).")]
NumShards = Annotated[int, typer.Option(help="TFRecord shards; 0 lets the runner decide.")]
Compress = Annotated[bool, typer.Option(help="Write .tfrecord.gz shards.")]
MaxFailedFraction = Annotated[float, typer.Option(help="Exit non-zero when more than this fraction of inputs fails.")]
Runner = Annotated[str, typer.Option(help=BEAM_HELP)]
Workers = Annotated[int | None, typer.Option(help="DirectRunner worker processes (default: one per core).")]


def _triple(text: str | None, name: str, kind=float):
    if text is None:
        return None
    parts = [p for p in text.replace(" ", "").split(",") if p]
    try:
        values = tuple(kind(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != (2 if name == "--window" else 3):
        example = {"--spacing": "1.0,1.0,2.5", "--window": "-160,240", "--shape": "128,256,256"}[name]
        _fail(f"{name} {text!r} is not valid; write it like {example}.")
    return values


def _beam_args(runner: str, workers: int | None, extra: list[str]) -> list[str]:
    """Beam pipeline options: the runner, local worker count, and whatever else the user passed."""
    from preprocessing import conversion

    if runner == "DirectRunner":
        args = conversion.default_pipeline_args()
        if workers:
            args = [a for a in args if not a.startswith("--direct_num_workers")] + [f"--direct_num_workers={workers}"]
        return args + extra
    args = [f"--runner={runner}", *extra]
    if runner == "DataflowRunner" and not any(
        a.startswith(("--setup_file", "--extra_package", "--sdk_container_image")) for a in extra
    ):
        args.append(f"--extra_package={_worker_wheel()}")
    return args


def _worker_wheel() -> str:
    """Builds a wheel of this fullres checkout for Dataflow workers to install (Beam's --extra_package)."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").exists():
        _fail("Dataflow workers need fullres: pass --sdk_container_image with the fullres image, or --extra_package.")
    import shutil

    directory = tempfile.mkdtemp(prefix="fullres-wheel-")
    uv = os.environ.get("UV") or shutil.which("uv")
    command = (
        [uv, "build", "--quiet", "--wheel", "--out-dir", directory, str(root)]
        if uv
        else [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", directory, str(root)]
    )
    built = subprocess.run(command, capture_output=True, text=True)
    wheels = list(Path(directory).glob("fullres-*.whl"))
    if built.returncode != 0 or not wheels:
        _fail(f"could not build the fullres wheel for Dataflow workers ({built.stderr.strip()[-300:]}); pass "
              "--sdk_container_image or --extra_package instead.")
    return str(wheels[0])


def _run_conversion(function, **kwargs):
    from preprocessing import conversion, output_guard

    try:
        function(**kwargs, log=_print)
    except (conversion.PreprocessingFailed, output_guard.OutputWriteFailed) as error:
        _fail(str(error))
    except (ValueError, FileNotFoundError) as error:  # OutputRefused is a ValueError
        _fail(str(error))
    except OSError as error:
        _fail_if_write_error(error, kwargs["output"])


_BEAM_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@preprocess_app.command("ct", context_settings=_BEAM_CONTEXT)
def preprocess_ct(
    context: typer.Context,
    input_path: Annotated[str, typer.Option("--input", help="A CT file, or a directory of DICOM series / NIfTI / NRRD / MetaImage files.")],
    output: ConversionOutput,
    labels: Annotated[str | None, typer.Option(help="Label maps: a directory with a file named like each image, or a CSV with image,label rows. Omit for layouts whose names pair them (nnU-Net/MSD imagesTr+labelsTr, KiTS case folders, CASE_image+CASE_label).")] = None,
    spacing: Annotated[str | None, typer.Option(help="Target spacing X,Y,Z in mm; omit to keep each case's own.")] = None,
    window: Annotated[str, typer.Option(help="HU window LOW,HIGH mapped onto [0, 1] (CT only; MR is z-scored).")] = "-1000,1000",
    modality: Annotated[str, typer.Option(help="ct (HU window), mr (z-score per case), or auto (DICOM's Modality tag; for volume files, CT if the values look like HU).")] = "auto",
    pseudonymize: Annotated[bool, typer.Option(help="Replace case ids by keyed hashes; the mapping back goes to OUTPUT.pseudonyms.json beside the output, never inside it.")] = False,
    pseudonymize_key_file: Annotated[str | None, typer.Option(help="Key for --pseudonymize (share it between splits); default OUTPUT.pseudonym-key, generated once.")] = None,
    shape: Annotated[str | None, typer.Option(help="Crop or pad every case to D,H,W (choose sizes your partitioning accepts).")] = None,
    spacing_tolerance: Annotated[float, typer.Option(help="DICOM slice gaps may vary by this fraction of their median; beyond it slices are interpolated onto a uniform grid (noted in summary.json).")] = 0.05,
    classes: Annotated[str | None, typer.Option(help="Class names of DICOM SEG segments / RTSTRUCT ROIs, NAME1,NAME2,... (NAME1 is class 1), or a label_map.json of a previous run.")] = None,
    crop: Annotated[str, typer.Option(help="Where --shape crops: center of the volume, or foreground (centred on the labelled voxels).")] = "center",
    num_classes: Annotated[int | None, typer.Option(help="Classes including background: label values must be 0..N-1 (default: 0..255).")] = None,
    max_voxels: Annotated[int | None, typer.Option(help="Cases with more voxels (read from the header, and after resampling) are dead letters (default 2^29).")] = None,
    num_shards: NumShards = 0,
    compress: Compress = False,
    max_failed_fraction: MaxFailedFraction = 0.1,
    runner: Runner = "DirectRunner",
    workers: Workers = None,
) -> None:
    """Convert CT volumes (+ label maps) into resampled, windowed TFRecords; bad cases go to dead_letter.jsonl."""
    # Cheap checks first: a typo should not wait for Beam and TensorFlow to load.
    spacing_values = _triple(spacing, "--spacing") if spacing and spacing.lower() != "none" else None
    window_values, shape_values = _triple(window, "--window"), _triple(shape, "--shape", int)
    for name, path in (("--input", input_path), ("--labels", labels)):
        if path is not None and "://" not in path and not os.path.exists(path):
            _fail(f"{name} {path!r} does not exist.")
    from preprocessing import ct_pipeline, ct_transforms

    try:
        config = ct_transforms.CtPreprocessConfig(spacing=spacing_values, window=window_values, shape=shape_values,
                                                  spacing_tolerance=spacing_tolerance,
                                                  classes=ct_transforms.class_names(classes) if classes else (),
                                                  modality=modality, crop=crop,
                                                  max_label=255 if num_classes is None else num_classes - 1,
                                                  **({"max_voxels": max_voxels} if max_voxels is not None else {}))
    except ValueError as error:
        _fail(str(error))
    _run_conversion(
        ct_pipeline.run, input_path=input_path, output=output, labels=labels, config=config,
        pipeline_args=_beam_args(runner, workers, context.args), num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction, pseudonymize=pseudonymize, pseudonym_key_file=pseudonymize_key_file,
    )


@preprocess_app.command("images", context_settings=_BEAM_CONTEXT)
def preprocess_images(
    context: typer.Context,
    annotations: Annotated[str, typer.Option(help="A COCO JSON file, or a directory of Pascal VOC XML files.")],
    images: Annotated[str, typer.Option(help="The directory the annotations' file names are relative to.")],
    output: ConversionOutput,
    label_map: Annotated[str | None, typer.Option(help="label_map.json of a previous conversion (e.g. the training split): class ids are taken from it, so every split agrees.")] = None,
    extend_label_map: Annotated[bool, typer.Option(help="Give a class the --label-map lacks the next free id (default: refuse it).")] = False,
    max_pixels: Annotated[int, typer.Option(help="Images over this many pixels (read from the header) are dead letters: decompression bombs.")] = 100_000_000,
    num_shards: NumShards = 0,
    compress: Compress = False,
    max_failed_fraction: MaxFailedFraction = 0.1,
    runner: Runner = "DirectRunner",
    workers: Workers = None,
) -> None:
    """Convert images with boxes into TF Object Detection API TFRecords; bad boxes and images go to dead_letter.jsonl."""
    for name, path in (("--annotations", annotations), ("--images", images), ("--label-map", label_map)):
        if path is not None and "://" not in path and not os.path.exists(path):
            _fail(f"{name} {path!r} does not exist.")
    if extend_label_map and label_map is None:
        _fail("--extend-label-map extends the map given with --label-map; pass --label-map too, or drop the flag.")
    from preprocessing import images_pipeline

    _run_conversion(
        images_pipeline.run, annotations=annotations, images=images, output=output,
        pipeline_args=_beam_args(runner, workers, context.args), num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction, label_map=label_map, extend_label_map=extend_label_map,
        max_pixels=max_pixels,
    )


@demo_data_app.command("ct")
def demo_data_ct(
    output: Annotated[Path, typer.Option(help="Directory to write dicom/ and nifti/ into.")] = Path("fullres-demo-ct"),
    cases: Annotated[int, typer.Option(help="Number of synthetic cases.")] = 8,
    shape: Annotated[str, typer.Option(help="Voxels D,H,W of each case before preprocessing.")] = "48,64,64",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Synthetic CT cases with label maps, as DICOM series and as NIfTI (the same cases in both)."""
    from preprocessing import demo_ct

    written = demo_ct.write_demo_cases(str(output), cases, _triple(shape, "--shape", int), seed)
    _print(f"wrote {cases} cases: DICOM series in {written['dicom']}, NIfTI in {written['nifti']} "
           f"(labels beside each, in labels/)")


@demo_data_app.command("images")
def demo_data_images(
    output: Annotated[Path, typer.Option(help="Directory to write images/ and annotations.json into.")] = Path("fullres-demo-images"),
    images: Annotated[int, typer.Option(help="Number of images.")] = 64,
    size: Annotated[int, typer.Option(help="Image height and width in pixels.")] = 256,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Synthetic detection images (shapes on textured backgrounds) with COCO JSON boxes."""
    from preprocessing import demo_images

    written = demo_images.write_demo_coco(str(output), images, (size, size), seed)
    _print(f"wrote {images} images to {written['images']} and boxes to {written['annotations']}")


pipeline_app = typer.Typer(rich_markup_mode=None, help="Compile the KFP pipelines, run one here (kfp.local), or submit one to Vertex AI.",
                           no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")
PIPELINE_NAMES = ("ct-segmentation", "detection")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE = "fullres:latest"  # components.steps.DEFAULT_IMAGE (not imported: --help stays instant)
Params = Annotated[list[str] | None, typer.Option("--param", help="A pipeline parameter KEY=VALUE (repeatable); lists and dicts as JSON.")]
PipelineName = Annotated[str, typer.Option("--pipeline", help="ct-segmentation or detection.")]


def _check_pipeline_name(name: str) -> None:
    if name not in PIPELINE_NAMES:
        _fail(f"--pipeline {name!r} is not known; use one of {', '.join(PIPELINE_NAMES)}.")


@pipeline_app.command("compile")
def pipeline_compile(
    image: Annotated[str, typer.Option(help="Container image with fullres installed, e.g. us-docker.pkg.dev/PROJECT/REPO/fullres:gpu.")] = DEFAULT_IMAGE,
    output_dir: Annotated[Path, typer.Option(help="Where pipeline.yaml (ct-segmentation) and detection-pipeline.yaml go.")] = ROOT,
) -> None:
    """Compile both pipelines to KFP IR YAML (deterministic: the same sources give the same bytes)."""
    from pipelines import definitions

    output_dir.mkdir(parents=True, exist_ok=True)
    for name, file_name in definitions.COMPILED_FILES.items():
        path = definitions.compile_pipeline(name, str(output_dir / file_name), image=image)
        _print(f"compiled {name} for image {image} into {path}")


@pipeline_app.command("parameters")
def pipeline_parameters(name: PipelineName = "ct-segmentation") -> None:
    """List a pipeline's parameters with their types and defaults (pass them as --param KEY=VALUE)."""
    _check_pipeline_name(name)
    from pipelines import definitions

    inputs = definitions.PIPELINES[name]().component_spec.inputs
    for key, spec in inputs.items():
        default = "(required)" if spec.default is None and not spec.optional else json.dumps(spec.default)
        _print(f"{key:<24} {spec.type:<8} {default}")


@pipeline_app.command("run")
def pipeline_run(
    local: Annotated[bool, typer.Option("--local", help="Run on this machine with kfp.local (use `submit` for Vertex AI).")] = False,
    name: PipelineName = "ct-segmentation",
    param: Params = None,
    pipeline_root: Annotated[Path, typer.Option(help="Where the run's artifacts go.")] = Path("fullres-pipeline-root"),
    runner: Annotated[str, typer.Option(help="subprocess (each step a process in this environment) or docker (each step in --image, as on Vertex AI).")] = "subprocess",
    image: Annotated[str | None, typer.Option(help="The container image for --runner docker, e.g. fullres:cpu (`fullres image build`).")] = None,
) -> None:
    """Run a pipeline end to end on this machine (kfp.local): every step a subprocess, or a container of the image."""
    if not local:
        _fail("pipeline run needs --local (kfp.local on this machine); to run on Vertex AI use `fullres pipeline submit`.")
    _check_pipeline_name(name)
    if image is not None and runner != "docker":
        _fail("--image applies to --runner docker; add --runner docker, or leave --image out.")
    from pipelines import image as image_lib, local_run, vertex
    from preprocessing import output_guard

    try:
        arguments = vertex.parse_parameters(name, param or [])
        inputs = {f"--param {key}": value for key, value in arguments.items() if key.endswith("_uri") and value}
        output_guard.check_owned_directory(str(pipeline_root), "pipeline-root", inputs, option="--pipeline-root")
        pipeline_root.mkdir(parents=True, exist_ok=True)
        output_guard.write_marker(str(pipeline_root), "pipeline-root")
        with output_guard.lock(str(pipeline_root), option="--pipeline-root"):
            run = local_run.run_local(name, arguments, str(pipeline_root), log=_print, runner=runner, image=image)
    except (ValueError, image_lib.ImageError) as error:  # OutputRefused too
        _fail(str(error))
    except OSError as error:
        _fail_if_write_error(error, pipeline_root)
    except local_run.PipelineRunFailed as error:
        _fail(str(error))
    for task, outputs in run["outputs"].items():
        for output, path in outputs.items():
            _print(f"{task}/{output}: {path}")
    _print(f"pipeline {name} finished; run directory {run['run_dir']}")


@pipeline_app.command("submit")
def pipeline_submit(
    project: Annotated[str, typer.Option(help="Google Cloud project.")],
    region: Annotated[str, typer.Option(help="Vertex AI region, e.g. us-central1.")],
    pipeline_root: Annotated[str, typer.Option(help="gs:// directory for the run's artifacts.")],
    name: PipelineName = "ct-segmentation",
    param: Params = None,
    service_account: Annotated[str | None, typer.Option(help="Service account the pipeline runs as.")] = None,
    network: Annotated[str | None, typer.Option(help="VPC network to peer, projects/NUMBER/global/networks/NAME.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="A resource label KEY=VALUE (repeatable).")] = None,
    image: Annotated[str | None, typer.Option(help="Compile for this image first (default: the committed YAML as is).")] = None,
    display_name: Annotated[str | None, typer.Option(help="Name of the run in the console.")] = None,
    caching: Annotated[bool | None, typer.Option("--caching/--no-caching", help="Reuse results of unchanged steps (default: Vertex's).")] = None,
    api_endpoint: Annotated[str | None, typer.Option(help="Vertex AI API endpoint, for private endpoints (default: REGION-aiplatform.googleapis.com).")] = None,
) -> None:
    """Submit a pipeline to Vertex AI Pipelines (training on TPUs/GPUs via --param accelerator_type=..., Beam on Dataflow via beam_args)."""
    _check_pipeline_name(name)
    import tempfile

    from pipelines import definitions, vertex

    try:
        arguments = vertex.parse_parameters(name, param or [])
        labels = vertex.parse_labels(label or [])
        template = ROOT / definitions.COMPILED_FILES[name]
        if image is not None or not template.exists():
            template = Path(tempfile.mkdtemp(prefix="fullres-")) / definitions.COMPILED_FILES[name]
            definitions.compile_pipeline(name, str(template), image=image or DEFAULT_IMAGE)
        resource = vertex.submit(str(template), project=project, region=region, pipeline_root=pipeline_root,
                                 parameter_values=arguments, service_account=service_account, network=network,
                                 labels=labels, display_name=display_name, enable_caching=caching,
                                 api_endpoint=api_endpoint)
    except ValueError as error:
        _fail(str(error))
    _print(f"submitted {name}: {resource}")


image_app = typer.Typer(rich_markup_mode=None, help="Build the container image every pipeline step runs in (Docker with BuildKit).",
                        no_args_is_help=True)
app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(
    accelerator: Annotated[str, typer.Option(help="cpu, gpu (adds JAX's CUDA 12 plug-in) or tpu (adds libtpu).")] = "cpu",
    base: Annotated[str, typer.Option(help="Base image with Python 3.11; the default comes from Docker Hub, and where that is out of reach a Debian base is made here (see `fullres image base`).")] = "python:3.11-slim",
    tag: Annotated[str | None, typer.Option(help="The image's tag (default fullres:ACCELERATOR).")] = None,
) -> None:
    """Build the image from the Dockerfile, with this machine's package index and CA bundle (a build secret); print its tag and size."""
    from pipelines import image as image_lib

    try:
        settings = image_lib.with_reachable_base(
            image_lib.BuildSettings(accelerator=accelerator, base=base, tag=tag or ""), log=_print)
        built = image_lib.build(settings, str(ROOT), log=_print)
        size = image_lib.size_bytes(built)
    except (ValueError, image_lib.ImageError) as error:
        _fail(str(error))
    _print(f"built image {built}: {size / 1e9:.2f} GB")


@image_app.command("base")
def image_base(
    name: Annotated[str, typer.Option(help="Name of the base image.")] = "fullres-base:bookworm",
    mirror: Annotated[str | None, typer.Option(help="Debian mirror (default: the one apt uses here).")] = None,
) -> None:
    """Make a Debian bookworm base image (Python 3.11) with debootstrap, for machines that cannot reach Docker Hub (needs root)."""
    from pipelines import image as image_lib

    try:
        image_lib.make_base(name, mirror, log=_print)
    except image_lib.ImageError as error:
        _fail(str(error))
    _print(f"base image {name} ready; build on it with `fullres image build --base {name}`")


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`fullres`)."""
    app(args=argv, prog_name="fullres")


if __name__ == "__main__":
    main()
