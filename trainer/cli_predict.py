"""`fullres predict`: a trained run's model on new scans or videos, whole volume in one partitioned pass, masks in each
input's own geometry. Its options are checked here, before the heavy imports, so a typo fails at once; the work is
`trainer.predict`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from common import console, sizes
from preprocessing import cli as preprocessing_cli
from trainer import cli_options


def predict(
    context: typer.Context,
    model: Annotated[Path, typer.Option(help="The output directory of `fullres train` (a segmentation model).")],
    input_path: Annotated[str, typer.Option("--input", help="A scan (NIfTI, NRRD, MetaImage), a DICOM series directory, or a directory of cases; for a video model, videos or DAVIS frame folders.")],
    output: Annotated[Path, typer.Option(help="Directory for the masks, summary.json and dead_letter.jsonl (new, or written by fullres predict).")],
    output_format: Annotated[str | None, typer.Option("--format", help="nifti, nrrd or mha (default: each input's own format; NIfTI for DICOM).")] = None,
    dicom_seg: Annotated[bool, typer.Option("--dicom-seg/--no-dicom-seg", help="For DICOM input, also write a DICOM SEG of the series.")] = True,
    probabilities: Annotated[bool, typer.Option("--probabilities", help="Also write each class's probability map.")] = False,
    input_partition_dims: Annotated[str | None, typer.Option(help="How each volume is split over the devices, e.g. 1,2,2,1,1 (default: as in training where the devices hold it, else the same axes in fewer parts; the log and summary.json say which).")] = None,
    virtual_devices: Annotated[int | None, typer.Option(help="On a CPU, present it as this many devices (to predict partitioned without accelerators).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="A scan whose modality or intensity range differs from the model's training scans is a dead letter (default: predicted, with a warning in its problems).")] = False,
    max_failed_fraction: preprocessing_cli.MaxFailedFraction = 0.1,
    pseudonymize: Annotated[bool, typer.Option(help="Name cases by keyed hashes, as preprocess does (no DICOM SEG then); the mapping back goes to OUTPUT.pseudonyms.json beside the output, never inside it.")] = False,
    pseudonymize_key_file: Annotated[str | None, typer.Option(help="Key for --pseudonymize (pass the preprocessed data's for the same pseudonyms); default OUTPUT.pseudonym-key, generated once.")] = None,
    device_memory: Annotated[str | None, typer.Option(help="Memory of one device, e.g. 16GiB (default: what the accelerator reports; unchecked on CPUs): a scan whose pass needs more is skipped with the number of cores it needs.")] = None,
    max_voxels: Annotated[int | None, typer.Option(help="Scans with more voxels (read from the header, and on the model's grid) are dead letters (default 2^29, as in preprocess ct).")] = None,
    max_decoded_bytes: Annotated[str | None, typer.Option(help="Scans that take more memory once decoded (stored type + float32 copy, read from the header) are dead letters, e.g. 8GiB (default 3GiB, as in preprocess ct).")] = None,
    follow_links: preprocessing_cli.FollowLinks = False,
    sliding_window: Annotated[bool, typer.Option("--sliding-window", help="Predict a whole-volume model patch by patch too (nnU-Net's sliding window of its training shape, half overlap, Gaussian weights); a model trained with --patch-size always predicts that way.")] = False,
    clips: Annotated[bool, typer.Option("--clips", help="Video models: predict in overlapping clips of the training clip's length even where the whole video fits one pass.")] = False,
) -> None:
    """Segment new scans with a trained model: whole volume, one partitioned pass (a patch-trained model: a sliding
    window of its patch), masks in each scan's own geometry.

    The model's recorded preprocessing (spacing, orientation, window) is
    applied; each scan is padded, never cropped, and the mask is written with
    the scan's exact size, spacing, origin and direction. One bad scan is a
    dead letter; the others are still predicted.
    """
    cli_options.use_virtual_devices(virtual_devices)
    if not os.path.exists(input_path):
        console.fail(f"--input {input_path!r} does not exist.")
    from common import dead_letters

    try:  # before the heavy imports: a typo fails at once
        dead_letters.check_failed_fraction(max_failed_fraction)
    except ValueError as error:
        console.fail(str(error))
    from trainer.parallel import partitioning

    try:  # PartitionError is a ValueError
        dims = partitioning.parse_dims(input_partition_dims)
        budget = None if device_memory is None else sizes.parse_bytes(device_memory)
        limits = {**({} if max_voxels is None else {"max_voxels": max_voxels}),
                  **({} if max_decoded_bytes is None else {
                      "max_decoded_bytes": sizes.parse_bytes(max_decoded_bytes, "--max-decoded-bytes")})}
        if limits.get("max_voxels", 1) < 1:
            raise ValueError(f"--max-voxels must be positive, got {max_voxels}.")
        if limits.get("max_decoded_bytes", 1) < 1:
            raise ValueError(f"--max-decoded-bytes must be positive, e.g. 3GiB, got {max_decoded_bytes}.")
    except ValueError as error:
        console.fail(str(error))
    from trainer.engine import run_files

    refusal = run_files.not_a_run(str(model))  # before predict's own imports (SimpleITK, the preprocessing, ...)
    if refusal is not None:
        console.fail(refusal)
    from common import output_guard, output_lock
    from trainer.predict import predict as predict_lib, video_predict

    if video_predict.is_video_run(str(model)):  # trained on video clips: whole videos, PNG masks and an overlay
        return video_predict.command(str(model), input_path, str(output), dims, budget, clips, max_failed_fraction,
                                     context)  # its options for scans are refused
    try:
        with output_lock.lock(str(output)):
            summary = predict_lib.predict(str(model), input_path, str(output), output_format_name=output_format,
                                          strict=strict, max_failed_fraction=max_failed_fraction,
                                          pseudonymize=pseudonymize, pseudonym_key_file=pseudonymize_key_file,
                                          probabilities=probabilities, dicom_seg=dicom_seg, input_partition_dims=dims,
                                          device_memory=budget, follow_links=follow_links,
                                          sliding_window=sliding_window, log=console.say, **limits)
    except (predict_lib.ModelRefused, partitioning.PartitionError, output_guard.OutputRefused, FileNotFoundError,
            ValueError, predict_lib.TooManyFailed) as error:
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, output)
    if summary["ok"] == 0:
        console.fail(f"no scan was predicted ({summary['failed']} dead letter(s) in {output / 'dead_letter.jsonl'}).")
