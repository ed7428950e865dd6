"""`fullres predict`: the model's own preprocessing, read from the run it was trained in.

A fullres run records in `model_info.json` how its training scans were
prepared (spacing, orientation, HU window, modality: `summary.json`'s
`preprocessing`, copied by `fullres train`). Predict applies exactly that to
each new scan, so the user passes no preprocessing flags; a run trained before
this was recorded is refused with one sentence naming what is missing.
"""

import json
import os

# What predict needs to prepare a scan as the model's training scans were (see ct_transforms.preprocessing_record).
PREPROCESSING_FIELDS = ("spacing", "orientation", "window", "modality")


class ModelRefused(ValueError):
    """`--model` is not a fullres run predict can use; the message says why and what to do."""


def read_model_info(model_dir: str) -> dict:
    """The run's model_info.json, with its recorded preprocessing checked.

    Args:
        model_dir: the output directory of `fullres train`.

    Returns:
        model_info.json's fields; `preprocessing` holds every one of `PREPROCESSING_FIELDS`.

    Raises:
        ModelRefused: `model_dir` is not a fullres run, is not a segmentation
            model, or was trained before runs recorded their preprocessing.
    """
    info_path = os.path.join(model_dir, "model_info.json")
    weights_path = os.path.join(model_dir, "model.keras")
    if not os.path.isfile(info_path) or not os.path.isfile(weights_path):
        raise ModelRefused(f"--model {model_dir} is not a fullres run (it lacks model_info.json or model.keras); "
                           "pass the output directory of `fullres train`.")
    try:
        with open(info_path) as file:
            info = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise ModelRefused(f"--model {model_dir}: model_info.json cannot be read ({error}); "
                           "pass the output directory of a finished `fullres train`.") from None
    if info.get("task") != "segmentation":
        raise ModelRefused(f"--model {model_dir} is a {info.get('task')} model; `fullres predict` segments scans with a "
                           "segmentation model trained by `fullres train`.")
    recorded = info.get("preprocessing") or {}
    missing = [name for name in PREPROCESSING_FIELDS if name not in recorded]
    if missing:
        raise ModelRefused(
            f"--model {model_dir}: model_info.json does not record the preprocessing the model was trained with "
            f"(missing: {', '.join(missing)}); retrain it with this fullres on data from `fullres preprocess ct`, "
            "which records it.")
    return info


# Output formats: `--format` name -> file suffix.
FORMATS = {"nifti": ".nii.gz", "nrrd": ".nrrd", "mha": ".mha"}
OUTPUT_KIND = "predictions"  # the output guard's marker: a directory `fullres predict` wrote


def output_suffix(source_path: str, is_dicom: bool, output_format: str | None) -> str:
    """The mask file's suffix: `--format`'s, else the input's own (.nii.gz, .nii, .nrrd, .mha), NIfTI for DICOM."""
    if output_format:
        return FORMATS[output_format]
    lower = source_path.lower()
    if is_dicom:
        return FORMATS["nifti"]
    for suffix in (".nii.gz", ".nii", ".nrrd", ".mha"):
        if lower.endswith(suffix):
            return suffix
    return ".mha"  # .mhd + .raw pairs come back as one MetaImage file


def prepare(image, preprocessing: dict, dicom_tag: str | None = None):
    """Prepares a scan as `fullres preprocess ct` prepared the model's training scans (ct_transforms), uncropped.

    Args:
        image: the scan as read (SimpleITK, HU for CT), in its own geometry.
        preprocessing: model_info.json's `preprocessing` (spacing, orientation, window, modality).
        dicom_tag: the series' DICOM Modality tag, if any (decides `modality: auto`).

    Returns:
        (volume, grid, fill): the normalized (D, H, W) float32 volume the model sees; `grid`, a SimpleITK image
        holding the geometry of that volume (oriented and resampled); and the normalized background value
        the forward pass pads with (as preprocessing pads).
    """
    import numpy as np
    import SimpleITK as sitk

    from preprocessing import ct_io, ct_transforms

    values = sitk.GetArrayViewFromImage(image)
    if values.size == 0:
        raise ct_io.CaseError("read", "empty_volume", "the volume has no voxels")
    if not np.isfinite(values).all():
        raise ct_io.CaseError("validate", "non_finite_voxels",
                              f"{int(np.size(values) - np.isfinite(values).sum())} voxels are NaN or infinite")
    normalization, _ = ct_transforms.choose_normalization(values, preprocessing["modality"], dicom_tag)
    background = ct_transforms.AIR_HU if normalization == ct_transforms.CT_WINDOW else float(values.min())
    oriented = sitk.DICOMOrient(image, preprocessing["orientation"])
    grid = ct_transforms.resample(oriented, preprocessing["spacing"], sitk.sitkLinear, background, sitk.sitkFloat32)
    volume, _, fill = ct_transforms.normalize(sitk.GetArrayFromImage(grid), normalization,
                                              tuple(preprocessing["window"]))
    return volume, grid, fill


def to_original_geometry(probabilities, grid, original):
    """Maps the model's class probabilities back onto the scan's own grid, and takes the argmax there.

    The probabilities, not the class ids, are resampled (linear interpolation, by physical position, so
    reorientation and resampling are both undone): nearest-neighbour on class ids would move every boundary by
    up to half a model voxel and draw it in steps of the model's coarser spacing, while the argmax of
    interpolated probabilities places it between model voxels, at the original grid's resolution (nnU-Net
    exports this way). Original voxels beyond the outermost model voxel centres take the nearest one's value.

    Args:
        probabilities: (D, H, W, C) float32 on `grid`.
        grid: a SimpleITK image with the geometry the model saw (`prepare`).
        original: the scan as read.

    Returns:
        (mask, probabilities): SimpleITK images with exactly `original`'s size, spacing, origin and direction:
        class ids (uint8) and per-class probabilities (a C-component float32 vector image).
    """
    import numpy as np
    import SimpleITK as sitk

    on_grid = sitk.GetImageFromArray(np.ascontiguousarray(probabilities, np.float32), isVector=True)
    on_grid.CopyInformation(grid)
    back = sitk.Resample(on_grid, original, sitk.Transform(), sitk.sitkLinear, 0.0, sitk.sitkVectorFloat32, True)
    mask = sitk.GetImageFromArray(np.argmax(sitk.GetArrayViewFromImage(back), axis=-1).astype(np.uint8))
    mask.CopyInformation(original)
    return mask, back


def _safe_name(case_id: str) -> str:
    return case_id.replace(os.sep, "_").replace("/", "_") or "case"


def predict_case(source, case_id: str, preprocessing: dict, forward, output: str, suffix: str,
                 class_names: list[str] | None = None, probabilities: bool = False) -> dict:
    """Reads one scan, prepares it, runs `forward`, and writes its mask (and probability maps) in its own geometry.

    Args:
        source: the scan (`ct_io.VolumeSource`: a volume file or a DICOM series).
        forward: `forward(volume (D, H, W) float32, fill) -> probabilities (D, H, W, C)`: the model's
            whole-volume pass (`Inference`), or any function standing in for it.
        suffix: the mask file's suffix (`output_suffix`).
        class_names: names of the probability maps' classes (class_<i> by default).

    Returns:
        The case's summary entry: shapes (z, y, x), outputs (file names in `output`).

    Raises:
        ct_io.CaseError: the scan cannot be read or holds unusable values.
    """
    import SimpleITK as sitk

    from preprocessing import ct_io, ct_transforms

    original = ct_io.read_volume(source)
    if original.GetDimension() != 3:
        raise ct_io.CaseError("read", "not_3d", f"the scan is {original.GetDimension()}-D; the model segments 3-D scans")
    volume, grid, fill = prepare(original, preprocessing, ct_transforms.dicom_modality(source))
    model_probabilities = forward(volume, fill)
    mask, back = to_original_geometry(model_probabilities, grid, original)
    name = _safe_name(case_id)
    outputs = {"mask": name + suffix}
    sitk.WriteImage(mask, os.path.join(output, outputs["mask"]), useCompression=True)
    if source.is_dicom:
        # DICOM SEG call site: `--dicom-seg` (preprocessing/dicom_seg.py) writes the SEG referencing
        # `source.dicom_files` here; until it is wired in, DICOM input gets the NIfTI mask above.
        pass
    if probabilities:
        count = back.GetNumberOfComponentsPerPixel()
        names = list(class_names or [])[:count] + [f"class_{i}" for i in range(len(class_names or []), count)]
        for index, class_name in enumerate(names):
            key = f"probability_{_safe_name(class_name)}"
            outputs[key] = f"{name}_{key}{suffix}"
            sitk.WriteImage(sitk.VectorIndexSelectionCast(back, index), os.path.join(output, outputs[key]),
                            useCompression=True)
    return {"case_id": case_id, "source": source.name or source.path, "shape": list(original.GetSize())[::-1],
            "model_shape": list(volume.shape), "spacing": list(original.GetSpacing()), "outputs": outputs}


def load_inference(model_dir: str, input_partition_dims: str | None = None):
    """The run's model on the present devices, for whole-volume prediction (one scan at a time, one replica).

    Returns:
        (info, inference): model_info.json's fields and an `inference.Inference`.

    Raises:
        ModelRefused: `model_dir` is not a fullres segmentation run with its preprocessing recorded.
        partitioning.PartitionError: `input_partition_dims` cannot split a volume, or needs more devices.
    """
    from trainer import evaluate, inference, partitioning

    info = read_model_info(model_dir)
    partition = None
    if input_partition_dims:
        partition = partitioning.PartitionConfig(partitioning.parse_dims(input_partition_dims))
        # The structure only (one entry per dimension, batch and channels whole): every size is padded to fit.
        partitioning.validate(partition, (1, *partition.input_partition_dims[1:-1], 1), partition.num_cores_per_replica)
    try:
        config, _, model, state, distribution = evaluate.load_trained(model_dir, partition=partition, batch_size=1)
    except FileNotFoundError as error:
        raise ModelRefused(str(error)) from None
    return info, inference.Inference(model, state, distribution, config.model.downsampling_levels)


def predict_scans(model_dir: str, input_path: str, output: str, output_format: str | None = None,
                  probabilities: bool = False, input_partition_dims: str | None = None, log=print) -> dict:
    """`fullres predict`: segments every scan under `input_path` with the run in `model_dir`, masks into `output`.

    Scans are found and read as `fullres preprocess ct` finds and reads them (volume files, DICOM series,
    directories of cases). A case that fails (unreadable, too large for the devices) becomes a dead letter
    in `dead_letter.jsonl`; the others are still predicted. `summary.json` lists per case the seconds,
    shapes, partitioning and output files.

    Returns:
        The summary.

    Raises:
        ModelRefused, partitioning.PartitionError, output_guard.OutputRefused, FileNotFoundError: one sentence.
    """
    import time

    from preprocessing import conversion, ct_io, output_guard
    from trainer import inference

    if output_format is not None and output_format not in FORMATS:
        raise ValueError(f"--format {output_format!r} is not known; use {', '.join(FORMATS)}.")
    output_guard.check_listed_output(output, OUTPUT_KIND, {"--input": input_path, "--model": model_dir})
    read_model_info(model_dir)  # refused in one sentence before the (slow) discovery and model loading
    volumes, dead = ct_io.discover(input_path)
    scans = {case_id: source for case_id, source in volumes.items() if not source.dicom_label}
    info, forward_pass = load_inference(model_dir, input_partition_dims)
    preprocessing = info["preprocessing"]

    def forward(volume, fill):
        return forward_pass.probabilities(volume[None, ..., None], fill)[0]

    partition = list(forward_pass.partition_dims)
    cases: list[dict] = []
    os.makedirs(output, exist_ok=True)
    with output_guard.lock(output):
        written = set(output_guard.check_listed_output(output, OUTPUT_KIND, {}))
        for number, (case_id, source) in enumerate(sorted(scans.items()), 1):
            start = time.perf_counter()
            where = source.name or source.path
            try:
                entry = predict_case(source, case_id, preprocessing, forward, output,
                                     output_suffix(source.path, source.is_dicom, output_format),
                                     info.get("class_names"), probabilities)
            except ct_io.CaseError as error:
                dead.append(conversion.dead_letter(where, error.stage, error.reason, error.detail))
                log(f"[{number}/{len(scans)}] {case_id}: failed: {error.detail}")
                continue
            except inference.VolumeTooLarge as error:
                dead.append(conversion.dead_letter(where, "predict", "too_large", str(error)))
                log(f"[{number}/{len(scans)}] {case_id}: failed: {error}")
                continue
            entry["seconds"] = round(time.perf_counter() - start, 3)
            entry["partitioning"] = partition
            cases.append(entry)
            written.update(entry["outputs"].values())
            log(f"[{number}/{len(scans)}] {case_id}: {'×'.join(map(str, entry['shape']))} voxels "
                f"(model grid {'×'.join(map(str, entry['model_shape']))}) on {forward_pass.cores} core(s) in "
                f"{entry['seconds']:.1f} s -> {entry['outputs']['mask']}")
            output_guard.write_marker(output, OUTPUT_KIND, sorted(written | {"summary.json", "dead_letter.jsonl"}))
        summary = {"model": model_dir, "input": input_path, "partitioning": partition, "predicted": len(cases),
                   "failed": len(dead), "cases": cases}
        with open(os.path.join(output, "dead_letter.jsonl"), "w") as file:
            for letter in dead:
                file.write(json.dumps(letter) + "\n")
        with open(os.path.join(output, "summary.json"), "w") as file:
            json.dump(summary, file, indent=2)
        output_guard.write_marker(output, OUTPUT_KIND, sorted(written | {"summary.json", "dead_letter.jsonl"}))
    log(f"predicted {len(cases)} scan(s), {len(dead)} failed (dead_letter.jsonl); summary in "
        f"{os.path.join(output, 'summary.json')}")
    return summary
