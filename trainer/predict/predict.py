"""`fullres predict`: the model's own preprocessing, read from the run it was trained in.

A fullres run records in `model_info.json` how its training scans were
prepared (spacing, orientation, HU window, modality: `summary.json`'s
`preprocessing`, copied by `fullres train`). Predict applies exactly that to
each new scan, so the user passes no preprocessing flags; a run trained before
this was recorded is refused with one sentence naming what is missing.
"""

import os
import time
from collections.abc import Callable, Sequence

import SimpleITK as sitk

from common import dead_letters, file_writes, identifiers, output_guard
from preprocessing.ct import ct_io, ct_transforms, intensity, volume_discovery
from preprocessing.records import dataset_files
from trainer import config as config_lib, trained_run
from trainer.engine import inference, run_files
from trainer.predict import outputs, scan_grid

# What predict needs to prepare a scan as the model's training scans were (see ct_transforms.preprocessing_record).
PREPROCESSING_FIELDS = ("spacing", "orientation", "window", "modality")


class ModelRefused(ValueError):
    """`--model` is not a fullres run predict can use; the message says why and what to do."""


class TooManyFailed(RuntimeError):
    """More than `--max-failed-fraction` of the scans failed; the others were still predicted and written."""


def checked_model_info(model_dir: str) -> dict:
    """The run's model_info.json, with its recorded preprocessing checked.

    Args:
        model_dir: the output directory of `fullres train`.

    Returns:
        model_info.json's fields; `preprocessing` holds every one of `PREPROCESSING_FIELDS`.

    Raises:
        ModelRefused: `model_dir` is not a fullres run, is not a segmentation
            model, or was trained before runs recorded their preprocessing.
    """
    refusal = run_files.not_a_run(model_dir)
    if refusal is not None:
        raise ModelRefused(refusal)
    try:
        info = trained_run.read_info(model_dir)
    except ValueError as error:  # "model_info.json cannot be read (...)"
        raise ModelRefused(f"--model {model_dir}: {error}; pass the output directory of a finished `fullres train`."
                           ) from None
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


# ---------------------------------------------------------------------------------------------------------------
# Predicting a scan: the recorded preprocessing, one partitioned forward pass, back onto the scan's own grid.

def _class_names(info: dict, num_classes: int) -> list[str]:
    names = list(info.get("class_names") or [])
    return names if len(names) == num_classes else dataset_files.segmentation_class_names(num_classes)


def predict(model_dir: str, input_path: str, output_dir: str, *, output_format_name: str | None = None,
            probabilities: bool = False, dicom_seg: bool | None = None,
            strict: bool = False, max_failed_fraction: float = 0.1, pseudonymize: bool = False,
            pseudonym_key_file: str | None = None,
            input_partition_dims: Sequence[int] | None = None, device_memory: int | None = None,
            max_voxels: int = ct_transforms.DEFAULT_MAX_VOXELS,
            max_decoded_bytes: int = ct_transforms.DEFAULT_MAX_DECODED_BYTES, follow_links: bool = False,
            sliding_window: bool = False, log: Callable[[str], None] = print) -> dict:
    """Segments every scan under `input_path` with the model in `model_dir`; masks go to `output_dir`.

    Each scan is read, prepared as the model's training data were, padded to
    the nearest shape the model and the partitioning accept, predicted in one
    partitioned forward pass, and mapped back onto its own grid. One bad scan
    is a dead letter (`dead_letter.jsonl`), never the end of the run.

    Args:
        model_dir: the output directory of `fullres train` (a segmentation model).
        input_path: a scan file, a DICOM series directory, or a directory of cases (as `fullres preprocess ct` finds them).
        output_dir: where masks, `summary.json` and `dead_letter.jsonl` go (new, or written by `fullres predict`).
        output_format_name: nifti, nrrd or mha; None: each input's own format (NIfTI for DICOM).
        probabilities: also write each class's probability map.
        dicom_seg: also write a DICOM SEG for DICOM input (None: yes).
        strict: a scan whose modality or intensity range differs from the training scans' (`scan_check`) is a
            dead letter instead of a mask with a warning in its `problems`.
        max_failed_fraction: dead letters / scans above which `TooManyFailed` is raised (after the summary is written).
        pseudonymize: name cases by keyed hashes (as `fullres preprocess ct --pseudonymize` does); the mapping
            back goes to `identifiers.mapping_path(output_dir)`, beside the output, never inside it. No DICOM SEG
            is written then (a SEG carries the series' patient attributes).
        pseudonym_key_file: the key; default `identifiers.key_path(output_dir)`, created if missing (pass the
            key file of the preprocessed data for the same pseudonyms).
        input_partition_dims: how each volume is split (None: the training's split where the devices hold it, else
            the same axes in fewer parts: `device_split.choose`; one replica).
        device_memory: bytes one device holds (None: as the accelerator says; unchecked on CPUs); a scan whose
            compiled pass needs more is a dead letter that names the cores it would need.
        max_voxels, max_decoded_bytes: a scan over either, read from its header before decoding (as in
            `fullres preprocess ct`), is a dead letter naming its size.
        follow_links: read what links that lead outside `input_path` point to; by default they are left alone
            and named in the summary's `notes` (`volume_discovery`).
        sliding_window: predict a whole-volume model by nnU-Net's sliding window of its training shape too; a
            patch-trained model (`TrainConfig.patch_size`) always predicts that way, with its patch. The summary's
            `inference` says which was used.
        log: progress lines.

    Returns:
        The summary (also written as `summary.json`).

    Raises:
        ModelRefused: `model_dir` is not a fullres segmentation run with recorded preprocessing.
        FileNotFoundError: `input_path` does not exist.
        partitioning.PartitionError: the split asked for needs more devices than are present.
        output_guard.OutputRefused: `output_dir` holds files fullres did not write, or overlaps the inputs, or two
            scans would write one file (`outputs.check_distinct`).
        TooManyFailed: more than `max_failed_fraction` of the scans are dead letters.
    """
    dead_letters.check_failed_fraction(max_failed_fraction)
    info = checked_model_info(model_dir)
    if strict and not info.get("data_modality"):
        raise ModelRefused(f"--strict checks each scan against the modality the model was trained on, but "
                           f"{run_files.path(model_dir, run_files.MODEL_INFO)} does not record it; retrain the model "
                           "with this fullres on data from `fullres preprocess ct`, or leave --strict out.")
    if output_format_name is not None:
        scan_grid.output_format(ct_io.VolumeSource(path=""), output_format_name)  # an unknown format fails before any work
    # Only files an earlier predict listed in its marker may be replaced: a user's own `CASE.nii.gz` is never overwritten.
    written = set(output_guard.check_listed_output(output_dir, "predict", {"input": input_path, "model": model_dir}))
    written |= {name for own in (outputs.SUMMARY, "dead_letter.jsonl") for name in (own, file_writes.PARTIAL_PREFIX + own)}
    _refuse_videos(input_path, model_dir)  # before the DICOM reader tries each frame (and logs each failure)
    found = volume_discovery.find_volumes(input_path, follow_links=follow_links)
    scans = dict(sorted(found.images.items()))
    if not scans and not found.dead:
        raise FileNotFoundError(f"--input {input_path} holds no scan fullres can read (NIfTI, NRRD, MetaImage or a "
                                "DICOM series).")
    # Outputs name scans relative to --input (or by pseudonyms), never by absolute paths: folders carry patient names.
    roots = (os.path.abspath(input_path),)
    key = identifiers.load_or_create_key(pseudonym_key_file or identifiers.key_path(output_dir)) if pseudonymize else None
    named = identifiers.name_outputs([ct_io.CaseSource(case_id, source) for case_id, source in scans.items()],
                                     list(found.dead), roots, key)
    dead = list(named.dead)
    if pseudonymize:
        dicom_seg = False

    import jax

    run = trained_run.open_run(model_dir)
    outputs.check_distinct({case.case_id: outputs.planned_outputs(
        case.case_id, case.image, output_format_name, probabilities, dicom_seg,
        _class_names(info, run.config.model.num_classes)) for case in named.cases}, probabilities)
    devices = jax.devices()
    loaded, split = trained_run.load_split(run, input_partition_dims, one_replica=True)
    config, dims, split_reason = loaded.config, split["input_partition_dims"], split["why"]
    patch, why = _window(config, info, sliding_window)
    predictor = inference.VolumePredictor(loaded.model, loaded.state, config.partition, devices,
                                          config.model.downsampling_levels, device_memory, patch_size=patch,
                                          pad_as=run.config.partition.input_partition_dims)
    names = _class_names(info, config.model.num_classes)
    shown_dims = ",".join(map(str, dims))
    if not info.get("data_modality"):
        log(f"note: {run_files.MODEL_INFO} does not record what the model's training scans were (trained before "
            "fullres recorded it), so scans are not checked against their modality")
    if pseudonymize:
        mapping = identifiers.mapping_path(output_dir)
        identifiers.write_mapping(mapping, {"input": roots[0], **named.mapping})
        log(f"pseudonymized {len(named.cases)} case ids (no DICOM SEG: it would carry the series' patient "
            f"attributes); the mapping back is in {mapping} (keep it off shared storage)")
    log(f"fullres predict: {len(scans)} scan(s) from {'--input' if pseudonymize else input_path}, model {model_dir} ({len(names)} classes: "
        f"{', '.join(names)}), each split {shown_dims} over {config.partition.num_cores_per_replica} "
        f"{devices[0].platform} device(s) ({split_reason}), {predictor.describe()}{why}; {len(dead)} input(s) set aside")
    notes = [named.scrubber(note) for note in found.notes]  # e.g. links left alone
    for note in notes:
        log(f"note: {note}")

    os.makedirs(output_dir, exist_ok=True)
    output_guard.write_marker(output_dir, "predict", sorted(written))
    cases = []
    for number, named_case in enumerate(named.cases, 1):
        case_id, source = named_case.case_id, named_case.image
        scrub = identifiers.case_scrubber(named.scrubber, named_case, pseudonymize, roots)
        started = time.perf_counter()
        # Listed before they are written: a case that fails halfway leaves nothing a rerun would call foreign.
        written.update(outputs.planned_outputs(case_id, source, output_format_name, probabilities, dicom_seg, names))
        output_guard.write_marker(output_dir, "predict", sorted(written))
        try:
            case = _predict_case(case_id, source, info, predictor, names, output_dir, output_format_name,
                                 probabilities, dicom_seg, model_dir, (max_voxels, max_decoded_bytes), strict)
        except inference.VolumeTooLarge as error:
            dead.append(dead_letters.dead_letter(source.name, "predict", "too_large", scrub(str(error))))
            log(f"[{number}/{len(scans)}] {case_id}: skipped (too_large: {scrub(str(error))})")
            continue
        except dead_letters.CaseError as error:
            dead.append(dead_letters.dead_letter(source.name, error.stage, error.reason, scrub(error.detail)))
            log(f"[{number}/{len(scans)}] {case_id}: skipped ({error.reason}: {scrub(error.detail)})")
            continue
        except OSError as error:
            if error.errno in file_writes.WRITE_ERRORS:  # a full or read-only disk fails every case alike: stop
                raise
            reason, detail = _failure(error, predictor)
            dead.append(dead_letters.dead_letter(source.path, "predict", reason, detail))
            log(f"[{number}/{len(scans)}] {case_id}: skipped ({reason}: {detail})")
            continue
        except Exception as error:  # one scan's failure (e.g. out of device memory) never stops the others
            reason, detail = _failure(error, predictor)
            dead.append(dead_letters.dead_letter(source.name, "predict", reason, scrub(detail)))
            log(f"[{number}/{len(scans)}] {case_id}: skipped ({reason}: {scrub(detail)})")
            continue
        beyond = predictor.pads_beyond(case["model_grid_shape"])  # an asked split the training padding cannot run
        case["problems"] = [scrub(problem) for problem in case["problems"] + ([f"note: {beyond}"] if beyond else [])]
        case["notes"] = [{"reason": reason, "detail": scrub(detail)} for _, reason, detail in source.notes]
        case["seconds"] = round(time.perf_counter() - started, 3)
        cases.append(case)
        log(f"[{number}/{len(scans)}] {case_id}: {'×'.join(map(str, case['shape']))} voxels -> "
            f"{', '.join(os.path.basename(p) for p in case['outputs'])} ({case['seconds']:.1f} s)"
            + "".join(f"; {problem}" for problem in case["problems"])
            + "".join(f"; note: {note['reason']}: {note['detail']}" for note in case["notes"]))

    summary = {"model": os.path.abspath(model_dir), "input": None if pseudonymize else os.path.basename(roots[0]),
               "pseudonymized": pseudonymize, "ok": len(cases),
               "failed": len(dead), "input_partition_dims": list(config.partition.input_partition_dims),
               "devices": f"{config.partition.num_cores_per_replica} {devices[0].platform}",
               "split": split,
               "class_names": names, "inference": {"method": "whole" if patch is None else "sliding_window",
                                                   "patch_size": None if patch is None else list(patch),
                                                   "described": predictor.describe() + why},
               "notes": notes, "cases": cases, "dead_letters": dead}
    summary_path = outputs.write_summary_and_dead_letters(output_dir, summary)
    log(f"predicted {len(cases)} scan(s), {len(dead)} dead letter(s); summary in {summary_path}")
    too_many = outputs.too_many_failed(len(cases), len(dead), max_failed_fraction, output_dir, "inputs")
    if too_many:
        raise TooManyFailed(too_many)
    return summary


def _predict_case(case_id, source, info, predictor, names, output_dir, format_name, probabilities, dicom_seg,
                  model_dir, limits, strict=False) -> dict:
    prepared = scan_grid.prepare(source, info["preprocessing"], max_voxels=limits[0], max_decoded_bytes=limits[1])
    mismatched = _check_against_training(prepared, source, info, strict)
    probs = predictor.probabilities(prepared.volume, prepared.fill)
    mask, on_original = scan_grid.to_original_grid(probs, prepared.grid, prepared.original)
    suffix = scan_grid.FORMATS[scan_grid.output_format(source, format_name)]
    files = [os.path.join(output_dir, case_id + suffix)]
    outputs.write_image(mask, files[0])
    if probabilities:
        for index, name in enumerate(names):
            path = os.path.join(output_dir, f"{case_id}_probability_{name}{suffix}")
            outputs.write_image(sitk.VectorIndexSelectionCast(on_original, index, sitk.sitkFloat32), path)
            files.append(path)
    problems = list(mismatched)
    if source.is_dicom and dicom_seg is not False:
        from trainer.predict import dicom_seg as dicom_seg_lib

        try:
            files.append(dicom_seg_lib.write_dicom_seg(
                mask, source.dicom_files, names[1:], os.path.join(output_dir, case_id + ".seg.dcm"),
                algorithm_parameters={"model": os.path.abspath(model_dir)}))
        except dead_letters.CaseError as error:  # the mask is written; only its DICOM SEG is missing, and says why
            problems.append(f"no DICOM SEG: {error.detail}")
    return {"case_id": case_id, "problems": problems, "source": source.name, "shape": list(prepared.original.GetSize()[::-1]),
            "model_grid_shape": list(prepared.volume.shape[:3]),
            "padded_shape": list(predictor.padded_shape(prepared.volume.shape[:3])),
            "input_partition_dims": list(predictor.partition.input_partition_dims),
            **({"windows": predictor.windows} if predictor.patch_size is not None else {}), "outputs": files}


SCAN_SUFFIXES = (".nii", ".nii.gz", ".nrrd", ".nhdr", ".mha", ".mhd", ".dcm", ".ima")


def _refuse_videos(input_path: str, model_dir: str) -> None:
    """Refuses, in one sentence, an `--input` of videos or video frames (a DAVIS folder, `frames/00000.jpg`) for a CT
    model: it holds such files and none that could be a scan (a scan suffix, or none: DICOM files often have none).
    Before: the DICOM reader tried every frame and the terminal filled with its errors (88 for a DAVIS folder)."""
    from preprocessing.video import video_discovery, video_files

    media = video_discovery.FRAME_SUFFIXES + video_files.VIDEO_SUFFIXES
    names = ([os.path.basename(input_path)] if os.path.isfile(input_path) else
             [name for _, _, files in os.walk(input_path) for name in files if not name.startswith(".")])
    lowered = [name.lower() for name in names]
    if any(name.endswith(SCAN_SUFFIXES) or "." not in name for name in lowered):
        return
    found = sorted({os.path.splitext(name)[1] for name in lowered if name.endswith(media)})
    if found:
        raise ModelRefused(
            f"--input {input_path} holds videos or video frames ({', '.join(found)}) and no scan, but --model "
            f"{model_dir} is a CT model, which segments scans (NIfTI, NRRD, MetaImage, DICOM); predict videos with a "
            "model trained on video clips (fullres preprocess video, then fullres train --preset video).")


def _window(config: config_lib.TrainConfig, info: dict, asked: bool) -> tuple[tuple[int, ...] | None, str]:
    """(the sliding window's patch or None, why, in words): a patch-trained model's patch; asked, the training shape."""
    if config.patch_size is not None:
        return tuple(config.patch_size), " (the model was trained on patches of that size)"
    if not asked:
        return None, ""
    return tuple(info["image_shape"][:-1]), " (--sliding-window; the model was trained on whole volumes of that shape)"


def _check_against_training(prepared: scan_grid.Prepared, source: ct_io.VolumeSource, info: dict, strict: bool) -> list[str]:
    """The ways the scan differs from the model's training scans (`scan_check`), as warnings for the case's
    `problems`; under `strict` the first is a dead letter instead."""
    from trainer.predict import scan_check

    found = scan_check.mismatches(sitk.GetArrayViewFromImage(prepared.original), intensity.dicom_modality(source),
                                  info.get("data_modality"))
    if found and strict:
        raise dead_letters.CaseError("check", *found[0])
    return [f"warning: {sentence} (--strict sets such scans aside as dead letters)" for _, sentence in found]


def _failure(error: Exception, predictor) -> tuple[str, str]:
    """(reason, one sentence) for a scan whose prediction failed."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or isinstance(error, MemoryError):
        cores = predictor.partition.num_cores_per_replica
        return "out_of_memory", (f"the volume does not fit {cores} device(s) split "
                                 f"{','.join(map(str, predictor.partition.input_partition_dims))}; split it over more "
                                 f"cores with --input-partition-dims (size it first: fullres plan --image-size D,H,W "
                                 f"--partitions N --layouts all)")
    return "predict_failed", f"{type(error).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"
