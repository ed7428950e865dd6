"""`fullres demo`: synthetic CT scans through the ct-segmentation pipeline, run here by the local KFP runner.

The one command a new user runs first (the README's first command): it makes
its own data, runs every step the pipeline has on this machine, and writes a
summary of what each step produced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from common import console
from trainer import cli_options


DEMO_PREPROCESSING = {"spacing": "1.7,1.7,2.25", "window": "-200,300", "shape": "32,32,32"}


def demo(
    output: Annotated[Path, typer.Option(help="Directory for the demo data, the pipeline's artifacts and summary.json.")] = Path(
        "fullres-demo"
    ),
    steps: Annotated[int | None, typer.Option(help="Training steps (the demo preset's default when omitted).")] = None,
    cases: Annotated[int, typer.Option(help="Synthetic training cases to generate.")] = 24,
    eval_cases: Annotated[int, typer.Option(help="Synthetic held-out cases to score.")] = 6,
    virtual_devices: Annotated[int, typer.Option(
        help="Run the steps on this many virtual CPU devices (0: the devices present, unpartitioned).")] = 2,
    input_partition_dims: Annotated[str | None, typer.Option(
        help="How each scan is split over the devices (default: along depth over all of them, e.g. 1,2,1,1,1).")] = None,
) -> None:
    """The built-in demo: synthetic CT scans through the ct-segmentation pipeline, run here by the local KFP runner.

    Generates NIfTI scans with label maps (the held-out ones stored turned and
    flipped), then runs preprocess (Beam) → train (3D UNet, each scan split over
    2 virtual CPU devices) → evaluate (Dice, HTML report) → export, and predict
    (masks of the held-out scans in their own geometry, scored against their
    label maps), and writes summary.json.
    """
    from common import output_guard, output_lock

    if virtual_devices < 0:
        console.fail(f"--virtual-devices must be 0 or more, got {virtual_devices}.")
    if input_partition_dims is None:
        input_partition_dims = f"1,{virtual_devices},1,1,1" if virtual_devices > 1 else ""
    output = output.resolve()
    try:
        output_guard.check_owned_directory(str(output), "demo", {})
        cli_options.use_virtual_devices(virtual_devices, least=0)  # inherited by every step the local runner starts
        output.mkdir(parents=True, exist_ok=True)
        output_guard.write_marker(str(output), "demo")
        with output_lock.lock(str(output)):
            _run_demo(output, steps, cases, eval_cases, input_partition_dims)
    except output_guard.OutputRefused as error:
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, output)


def _run_demo(output: Path, steps: int | None, cases: int, eval_cases: int, input_partition_dims: str) -> None:
    from pipelines import definitions, local_run
    from preprocessing.ct import demo_ct

    console.say(f"generating {cases} training and {eval_cases} held-out synthetic CT scans (NIfTI) in {output / 'data'}")
    # 32×64×64 voxels at 0.7–1.0 mm in-plane and 1.5–3 mm slices; resampled to 1.7×1.7×2.25 mm
    # (≈32³ on average) and cut or padded to 32³.
    train_cases = demo_ct.write_demo_cases(str(output / "data" / "train"), cases, (32, 64, 64), seed=0, formats=("nifti",))
    # Held out, and stored turned and flipped (a non-identity direction), as scans from another scanner come:
    # evaluated after preprocessing, and predicted whole in their own geometry.
    held_out = demo_ct.write_demo_cases(str(output / "data" / "eval"), eval_cases, (32, 64, 64), seed=1,
                                        formats=("nifti",), turned=True)["nifti"]
    held_out_images, held_out_labels = os.path.join(held_out, "images"), os.path.join(held_out, "labels")
    arguments = dict(
        train_input_uri=os.path.join(train_cases["nifti"], "images"),
        train_labels_uri=os.path.join(train_cases["nifti"], "labels"),
        eval_input_uri=held_out_images,
        eval_labels_uri=held_out_labels,
        predict_input_uri=held_out_images,
        preset="demo", class_names=",".join(demo_ct.CLASS_NAMES), input_partition_dims=input_partition_dims,
        **DEMO_PREPROCESSING,
    )
    if steps is not None:
        arguments["steps"] = steps
    try:
        run = local_run.run_local(definitions.CT_PIPELINE, arguments, str(output / "pipeline-root"), log=console.say)
    except (local_run.PipelineRunFailed, ValueError) as error:
        console.fail(str(error))
    outputs = run["outputs"]
    metrics_path = local_run.find_output(outputs, "evaluate", "metrics")
    scores = json.loads(Path(metrics_path).read_text())
    # KFP names the HTML artifact just "report"; a copy with its extension opens in any browser.
    report = output / "report.html"
    report.write_text(Path(local_run.find_output(outputs, "evaluate", "report")).read_text())
    trained = json.loads(Path(local_run.find_output(outputs, "train", "metrics")).read_text())
    masks = local_run.find_output(outputs, "predict", "masks")
    from trainer.predict import scoring

    predicted = scoring.dice_in_own_geometry(masks, held_out_labels, len(demo_ct.CLASS_NAMES))
    summary = {
        "dice_mean": scores.get("dice_mean"),
        "input_partition_dims": trained.get("input_partition_dims"),
        "mesh": trained.get("mesh"),
        "dice_per_class": scores.get("dice_per_class"),
        "class_names": scores.get("class_names"),
        "model": local_run.find_output(outputs, "train", "model"),
        "saved_model": local_run.find_output(outputs, "export", "exported"),
        "report": str(report),
        "metrics": metrics_path,
        "predict": {"masks": masks, **predicted},
        "run_dir": run["run_dir"],
    }
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    dims = ",".join(map(str, summary["input_partition_dims"] or []))
    mesh = summary["mesh"] or {}
    console.say(f"demo done: trained with each scan split {dims} over the mesh {dict(zip(mesh.get('axes', []), mesh.get('shape', [])))}; "
           f"foreground Dice {summary['dice_mean']:.3f} after preprocessing, {predicted['dice_mean']:.3f} predicted "
           f"in the held-out scans' own geometry; report {summary['report']}; summary in {output / 'summary.json'}")
