"""The `fullres` command line.

Commands import their heavy libraries (JAX, Keras, TensorFlow) only when they
run, so `fullres --help` is instant and `--virtual-devices` can still set
`XLA_FLAGS` before JAX starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from preprocessing import cli as preprocessing_cli
from trainer import cli as trainer_cli, cli_predict
from common import console
from components import image_name
from pipelines import demo


app = typer.Typer(rich_markup_mode=None,
    name="fullres",
    help="Train CNNs on full-resolution CT volumes and large images, split spatially across accelerator cores.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.callback()(trainer_cli.global_options)
app.command()(trainer_cli.train)
app.command(cls=trainer_cli.cli_rent.PlanCommand)(trainer_cli.plan)
app.command()(cli_predict.predict)
app.command()(demo.demo)


app.add_typer(preprocessing_cli.preprocess_app, name="preprocess")
app.add_typer(preprocessing_cli.demo_data_app, name="demo-data")


pipeline_app = typer.Typer(rich_markup_mode=None, help="Compile the KFP pipelines, run one here (kfp.local), or submit one to Vertex AI.",
                           no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")
PIPELINE_NAMES = ("ct-segmentation", "detection", "video-segmentation")
ROOT = Path(__file__).resolve().parent.parent
Params = Annotated[list[str] | None, typer.Option("--param", help="A pipeline parameter KEY=VALUE (repeatable); lists and dicts as JSON.")]
PipelineName = Annotated[str, typer.Option("--pipeline", help="ct-segmentation, detection or video-segmentation.")]
Network = Annotated[str | None, typer.Option("--model", help="ct-segmentation: train your own network, FILE.py:FUNCTION (as fullres train --model); the file's text is passed as the model_code parameter and FUNCTION as model_function, since the steps run where this path does not exist.")]


def _check_pipeline_name(name: str) -> None:
    if name not in PIPELINE_NAMES:
        console.fail(f"--pipeline {name!r} is not known; use one of {', '.join(PIPELINE_NAMES)}.")


def user_model_file(model: str | None) -> str | None:
    """The file of `--model FILE.py:FUNCTION`, or None."""
    return model.rpartition(":")[0] if model else None


def _network_parameters(name: str, model: str | None) -> dict:
    """`--model FILE.py:FUNCTION` as the pipeline's parameters: the file's text (`model_code`) and `model_function`.

    Raises:
        ValueError: not the ct-segmentation pipeline, not FILE.py:FUNCTION, or no such file.
    """
    if model is None:
        return {}
    from trainer.models import user_model

    if name not in ("ct-segmentation", "video-segmentation"):
        raise ValueError(f"--model {model} applies to the segmentation pipelines; the {name} pipeline trains "
                         "fullres's RetinaNet.")
    file, function = user_model.parse_source(model)
    if os.path.isdir(file):  # as fullres train says it (user_model)
        raise ValueError(f"--model {model}: {file} is a folder, not a Python file; pass the path of the Python file "
                         f"that defines {function} (FILE.py:FUNCTION).")
    if not os.path.isfile(file):
        raise ValueError(f"--model {model}: {file} does not exist; pass the Python file that defines {function}.")
    code = Path(file).read_text(encoding="utf-8")
    try:  # parsed only, as the model_code check does, but named as the user gave it
        compile(code, file, "exec")
    except (SyntaxError, ValueError) as error:  # ValueError: a null byte
        line = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        raise ValueError(f"--model {model}: {file} is not Python the train step can import{line}: "
                         f"{getattr(error, 'msg', error)}; fix the file and pass it again.") from None
    return {"model_code": code, "model_function": function}


@pipeline_app.command("compile")
def pipeline_compile(
    image: Annotated[str, typer.Option(help="Container image with fullres installed, e.g. us-docker.pkg.dev/PROJECT/REPO/fullres:gpu.")] = image_name.DEFAULT_IMAGE,
    output_dir: Annotated[Path, typer.Option(help="Where pipeline.yaml (ct-segmentation), detection-pipeline.yaml and video-pipeline.yaml go.")] = ROOT,
) -> None:
    """Compile the pipelines to KFP IR YAML (deterministic: the same sources give the same bytes)."""
    from common import output_guard
    from pipelines import definitions

    try:  # both files are checked before either is written: a pipeline.yaml of the user's is never replaced
        for name, file_name in definitions.COMPILED_FILES.items():
            output_guard.check_own_file(str(output_dir), file_name, f"# PIPELINE DEFINITION\n# Name: {name}\n".encode(),
                                        "compile", "--output-dir")
    except output_guard.OutputRefused as error:
        console.fail(str(error))
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, file_name in definitions.COMPILED_FILES.items():
        path = definitions.compile_pipeline(name, str(output_dir / file_name), image=image)
        console.say(f"compiled {name} for image {image} into {path}")


@pipeline_app.command("parameters")
def pipeline_parameters(name: PipelineName = "ct-segmentation") -> None:
    """List a pipeline's parameters with their types and defaults (pass them as --param KEY=VALUE)."""
    _check_pipeline_name(name)
    from pipelines import definitions

    for key, spec in definitions.parameters(name).items():
        default = "(required)" if spec.default is None and not spec.optional else json.dumps(spec.default)
        console.say(f"{key:<24} {spec.type:<8} {default}")


@pipeline_app.command("run")
def pipeline_run(
    local: Annotated[bool, typer.Option("--local", help="Run on this machine with kfp.local (use `submit` for Vertex AI).")] = False,
    name: PipelineName = "ct-segmentation",
    param: Params = None,
    pipeline_root: Annotated[Path, typer.Option(help="Where the run's artifacts go.")] = Path("fullres-pipeline-root"),
    runner: Annotated[str, typer.Option(help="subprocess (each step a process in this environment) or docker (each step in --image, as on Vertex AI).")] = "subprocess",
    image: Annotated[str | None, typer.Option(help="The container image for --runner docker, e.g. fullres:cpu (`fullres image build`).")] = None,
    model: Network = None,
) -> None:
    """Run a pipeline end to end on this machine (kfp.local): every step a subprocess, or a container of the image."""
    if not local:
        console.fail("pipeline run needs --local (kfp.local on this machine); to run on Vertex AI use `fullres pipeline submit`.")
    _check_pipeline_name(name)
    if image is not None and runner != "docker":
        console.fail("--image applies to --runner docker; add --runner docker, or leave --image out.")
    from pipelines import image as image_lib, local_run, parameter_checks, vertex
    from common import output_guard, output_lock

    try:
        arguments = {**_network_parameters(name, model), **vertex.parse_parameters(name, param or [])}
        # Before anything is created or started: a parameter a step would refuse is refused here, in its words.
        values = parameter_checks.check(name, arguments, parameter_checks.Where(log=console.say))
        parameter_checks.network_file(values, user_model_file(model))
        inputs = {f"--param {key}": value for key, value in arguments.items() if key.endswith("_uri") and value}
        output_guard.check_owned_directory(str(pipeline_root), "pipeline-root", inputs, option="--pipeline-root")
        pipeline_root.mkdir(parents=True, exist_ok=True)
        output_guard.write_marker(str(pipeline_root), "pipeline-root")
        with output_lock.lock(str(pipeline_root), option="--pipeline-root"):
            run = local_run.run_local(name, arguments, str(pipeline_root), log=console.say, runner=runner, image=image,
                                      checked=True)
    except (ValueError, image_lib.ImageError) as error:  # OutputRefused too
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, pipeline_root)
    except local_run.PipelineRunFailed as error:
        console.fail(str(error))
    for task, outputs in run["outputs"].items():
        for output, path in outputs.items():
            console.say(f"{task}/{output}: {path}")
    console.say(f"pipeline {name} finished; run directory {run['run_dir']}")


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
    plan: Annotated[Path | None, typer.Option(help="The JSON of `fullres plan --target ... --json`: its launch parameters (layout, batch, machine, accelerators, topology, hosts) are passed; a --param of the same name wins.")] = None,
    model: Network = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything and print the PipelineJob that would be sent (JSON), without credentials and without sending it.")] = False,
) -> None:
    """Submit a pipeline to Vertex AI Pipelines (training on TPUs/GPUs via --param accelerator_type=..., Beam on Dataflow via beam_args).

    The parameters are checked first, as the steps would check them (inputs in Cloud Storage, accelerators and
    TPU slices Vertex AI offers); then the credentials (Application Default Credentials).
    """
    _check_pipeline_name(name)
    import tempfile

    from pipelines import definitions, parameter_checks, vertex

    try:
        planned = vertex.plan_parameters(name, str(plan)) if plan is not None else {}
        arguments = {**planned, **_network_parameters(name, model), **vertex.parse_parameters(name, param or [])}
        parameter_checks.network_file(parameter_checks.check(name, arguments, parameter_checks.Where(vertex=True)),
                                      user_model_file(model))
        labels = vertex.parse_labels(label or [])
        template = ROOT / definitions.COMPILED_FILES[name]
        if image is not None or not template.exists():
            template = Path(tempfile.mkdtemp(prefix="fullres-")) / definitions.COMPILED_FILES[name]
            definitions.compile_pipeline(name, str(template), image=image or image_name.DEFAULT_IMAGE)
        settings = dict(project=project, region=region, pipeline_root=pipeline_root, parameter_values=arguments,
                        service_account=service_account, network=network, labels=labels, display_name=display_name,
                        enable_caching=caching, api_endpoint=api_endpoint)
        if dry_run:
            request = vertex.dry_run(str(template), **settings)
            console.say(f"dry run: would send this PipelineJob to {request['endpoint']} under {request['parent']} "
                        "(nothing was sent):")
            console.say(json.dumps(request["pipeline_job"], indent=2))
            return
        resource = vertex.submit(str(template), **settings)
    except ValueError as error:
        console.fail(str(error))
    console.say(f"submitted {name}: {resource}")


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
            image_lib.BuildSettings(accelerator=accelerator, base=base, tag=tag or ""), log=console.say)
        built = image_lib.build(settings, str(ROOT), log=console.say)
        size = image_lib.size_bytes(built)
    except (ValueError, image_lib.ImageError) as error:
        console.fail(str(error))
    console.say(f"built image {built}: {size / 1e9:.2f} GB")


@image_app.command("base")
def image_base(
    name: Annotated[str, typer.Option(help="Name of the base image.")] = "fullres-base:bookworm",
    mirror: Annotated[str | None, typer.Option(help="Debian mirror (default: the one apt uses here).")] = None,
) -> None:
    """Make a Debian bookworm base image (Python 3.11) with debootstrap, for machines that cannot reach Docker Hub (needs root)."""
    from pipelines import image as image_lib

    try:
        image_lib.make_base(name, mirror, log=console.say)
    except image_lib.ImageError as error:
        console.fail(str(error))
    console.say(f"base image {name} ready; build on it with `fullres image build --base {name}`")


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`fullres`)."""
    from common import startup

    startup.collect_after_imports()  # the command imports its libraries when it runs
    app(args=argv, prog_name="fullres")


if __name__ == "__main__":
    main()
