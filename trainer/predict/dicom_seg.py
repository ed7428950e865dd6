"""DICOM SEG output: a predicted label map written as a DICOM Segmentation of the series it was predicted from.

`fullres predict` writes one for DICOM input, so the mask opens over its scan
in OHIF, 3D Slicer or a PACS. The SEG (highdicom, BINARY: the type every
viewer reads) has one segment per class, segment number = class id, labelled
with the model's class name, algorithm type AUTOMATIC, identified as fullres
and its version. It references the source series and each of its SOP
instances, and every frame names the source instance (and, for an enhanced
multi-frame source, the frame) it segments.

Slices: the mask is on the grid `dicom_series.read_series` reads from the
series, and the source frames are ordered by the same `dicom_series.slice_stack`
(position along the slice normal, never file name or InstanceNumber), so the
mask's slice k is the frame the reader stacked k-th. Where the reader
interpolated uneven slices onto a uniform grid, each source slice takes the
mask slice nearest its true position.

Segment codes: a model's class names are free text, so no anatomical code can
be inferred from them. Every segment gets SNOMED CT "Tissue" (85756007) as
its Segmented Property Category and Type, which is what 3D Slicer assigns a
segment it knows nothing more about; "Organ" would be wrong for lesions, and
a made-up code would mislead. The class name is the SegmentLabel viewers show.

Empty classes: a class the model did not predict anywhere keeps its segment
(so segment numbers stay the class ids) and has no frames. A mask with no
foreground at all is still written: highdicom cannot write a SEG without
frames, so it then stores every frame, all zero.

Example:
    >>> mask = ct_io.read_volume(source)  # doctest: +SKIP
    >>> write_dicom_seg(predicted, source.dicom_files, ("liver", "tumour"), "out/case.seg.dcm")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pydicom
import SimpleITK as sitk

from common import dead_letters
from common import output_guard
from preprocessing.ct import dicom_frames, dicom_series

MANUFACTURER = "fullres"
# Type 2 attributes of the Patient and General Study modules: a source may lack them (anonymisers drop
# them); the SEG copies them, and the standard lets them be present and empty.
_EMPTY_IF_MISSING = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyDate", "StudyTime",
                     "ReferringPhysicianName", "StudyID", "AccessionNumber")
# Type 1 attributes a SEG needs from its source: what it references, and the frame of reference it shares.
_REQUIRED = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "SOPClassUID", "FrameOfReferenceUID")
_SEGMENT_LABEL_LENGTH = 64  # SegmentLabel is a LO: at most 64 characters


def fullres_version() -> str:
    """The installed fullres version, recorded in the SEG as SoftwareVersions and AlgorithmVersion."""
    try:
        return importlib.metadata.version("fullres")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def write_dicom_seg(
    mask: sitk.Image,
    source_files: Sequence[str],
    class_names: Sequence[str],
    output_path: str,
    *,
    series_number: int | None = None,
    series_description: str = "fullres segmentation",
    algorithm_parameters: Mapping[str, str] | None = None,
    spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE,
) -> str:
    """Writes `mask` as a DICOM SEG that references the series made of `source_files`.

    Args:
        mask: class ids (0 background, 1..K), on the grid fullres reads from
            this series (`ct_io.read_volume` of its `VolumeSource`): same size,
            spacing, origin and direction.
        source_files: the series' files, as discovery found them
            (`VolumeSource.dicom_files`); only headers are read.
        class_names: the name of class 1, 2, ... K; each becomes a segment label.
        output_path: the file to write; an existing file is replaced only if it
            is a DICOM SEG fullres wrote.
        series_number: SeriesNumber of the SEG; by default the source's plus
            1000, so it sorts beside its source in a viewer.
        series_description: SeriesDescription of the SEG.
        algorithm_parameters: name -> value pairs recorded in the segments'
            AlgorithmIdentificationSequence (e.g. the model's run).
        spacing_tolerance: the tolerance the series was read with (see
            `dicom_series.read_series`).

    Returns:
        `output_path`.

    Raises:
        ValueError: `class_names` cannot be segment labels.
        CaseError: the series cannot be referenced, or the mask is not on its
            grid or holds ids beyond the class names; the detail names the
            file or field and the fix.
        OutputRefused: `output_path` is a file fullres did not write.
    """
    import highdicom
    from pydicom.sr.codedict import codes

    names = _checked_names(class_names)
    headers = _read_headers(source_files)
    frames = [frame for path, header in headers.items() for frame in dicom_frames.frames_of(header, path)]
    stack = dicom_series.slice_stack(frames, spacing_tolerance)
    labels = _labels_on_grid(mask, stack, names)  # (D, H, W)
    source_images, pixels = _frames_for_sources(stack, headers, labels)  # pixels: (source frames, H, W)
    _refuse_foreign_file(output_path)
    algorithm = highdicom.AlgorithmIdentificationSequence(
        name="fullres", family=codes.DCM.ArtificialIntelligence, version=fullres_version(), source=MANUFACTURER,
        parameters=dict(algorithm_parameters) if algorithm_parameters else None)
    descriptions = [
        highdicom.seg.SegmentDescription(
            segment_number=class_id, segment_label=name, segmented_property_category=codes.SCT.Tissue,
            segmented_property_type=codes.SCT.Tissue, algorithm_type=highdicom.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
            algorithm_identification=algorithm)
        for class_id, name in enumerate(names, start=1)]
    with _no_patient_attributes_in_warnings():
        try:
            segmentation = highdicom.seg.Segmentation(
                source_images=source_images, pixel_array=pixels,
                segmentation_type=highdicom.seg.SegmentationTypeValues.BINARY, segment_descriptions=descriptions,
                series_instance_uid=highdicom.UID(),
                series_number=series_number if series_number is not None else 1000 + _series_number(source_images[0]),
                sop_instance_uid=highdicom.UID(), instance_number=1, manufacturer=MANUFACTURER,
                manufacturer_model_name=MANUFACTURER, software_versions=fullres_version(), device_serial_number="",
                content_label="FULLRES", content_description=series_description[:64],
                series_description=series_description[:64])
        except (ValueError, TypeError, AttributeError, KeyError) as error:  # highdicom checks the sources as it builds
            raise dead_letters.CaseError("write", "seg_refused", f"highdicom cannot build a DICOM SEG referencing the series of "
                                  f"{stack.frames[0].path} ({str(error).rstrip('.')}); check that its files are one valid "
                                  "image series") from None
        return _save(segmentation, output_path)


@contextlib.contextmanager
def _no_patient_attributes_in_warnings():
    """Keeps highdicom's and pydicom's warnings off the terminal while a SEG is built and written.

    They quote the attribute values they doubt: highdicom warns that a one-part PatientName ("JANEDOE7731") is
    "unlikely to represent the intended person name", with the name in the message. A SEG copies the source's
    patient attributes as they are, so such a warning says nothing fullres could act on, and it would print a
    patient's name where logs are read. Warnings from other modules are passed on as they came.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if not re.search(r"[/\\](highdicom|pydicom)[/\\]", warning.filename):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _series_number(header: pydicom.Dataset) -> int:
    """The source's SeriesNumber, 0 where it is missing or not a number."""
    try:
        return int(float(str(getattr(header, "SeriesNumber", "") or 0)))
    except ValueError:
        return 0


def _checked_names(class_names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(str(name).strip() for name in class_names)
    if not names:
        raise ValueError("class_names is empty; a DICOM SEG needs the name of each class id 1..K.")
    for name in names:
        if not name or len(name) > _SEGMENT_LABEL_LENGTH or "\\" in name:
            raise ValueError(f"class name {name!r} cannot be a DICOM SegmentLabel (1 to {_SEGMENT_LABEL_LENGTH} "
                             "characters, no backslash); rename the class in the model's class names.")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"class names {', '.join(map(repr, duplicates))} repeat; each segment needs its own label.")
    return names


def _read_headers(source_files: Sequence[str]) -> dict[str, pydicom.Dataset]:
    """The headers of the source files, with empty Type 2 patient/study attributes where they are missing."""
    if not source_files:
        raise dead_letters.CaseError("write", "no_source", "no DICOM files were given for the SEG to reference; pass the "
                              "series' files (VolumeSource.dicom_files)")
    headers = {}
    for path in source_files:
        try:
            header = pydicom.dcmread(path, stop_before_pixels=True)
        except Exception as error:  # pydicom raises many kinds for corrupt files
            raise dead_letters.CaseError("write", "unreadable", f"{path} cannot be read ({error})") from None
        for field in _REQUIRED:
            if not str(getattr(header, field, "") or ""):
                raise dead_letters.CaseError("write", "missing_reference", f"{path} has no {field}, which a DICOM SEG needs "
                                      "to reference its source; write the mask as NIfTI instead, or repair the series")
        for field in _EMPTY_IF_MISSING:
            if field not in header:
                setattr(header, field, "")
        headers[path] = header
    return headers


def _labels_on_grid(mask: sitk.Image, stack: dicom_series.SliceStack, names: tuple[str, ...]) -> np.ndarray:
    """The mask's class ids as (D, H, W) uint8/16, after checking it lies on the grid the series reads as."""
    spacing, origin, direction = stack.geometry()
    rows, columns = stack.frames[0].size
    expected = (columns, rows, stack.depth)
    where = os.path.dirname(stack.frames[0].path) or stack.frames[0].path
    checks = (("size", tuple(mask.GetSize()), expected, 0), ("spacing", mask.GetSpacing(), spacing, 1e-3),
              ("origin", mask.GetOrigin(), origin, 1e-3), ("direction", mask.GetDirection(), direction, 1e-4))
    wrong = [f"{field} {np.round(mine, 4).tolist()} (the series: {np.round(theirs, 4).tolist()})"
             for field, mine, theirs, tolerance in checks
             if len(mine) != len(theirs) or not np.allclose(mine, theirs, rtol=0, atol=tolerance)]
    if wrong:
        raise dead_letters.CaseError("write", "geometry_mismatch", f"the mask is not on the grid of series {where}: its "
                              f"{', '.join(wrong)}; map the prediction back onto the image fullres reads from that "
                              "series before writing the SEG")
    values = sitk.GetArrayFromImage(mask)  # (D, H, W)
    if not np.issubdtype(values.dtype, np.integer) and not np.array_equal(values, np.round(values)):
        raise dead_letters.CaseError("write", "not_class_ids", f"the mask for series {where} holds non-integer values; "
                              "pass class ids (the argmax), not probabilities")
    beyond = sorted(int(v) for v in np.unique(values) if v < 0 or v > len(names))
    if beyond:
        raise dead_letters.CaseError("write", "unknown_class", f"the mask for series {where} holds class ids {beyond[:5]} but "
                              f"only {len(names)} class names were given ({', '.join(names)}); pass one name per class id")
    return values.astype(np.uint8 if len(names) < 256 else np.uint16)


def _frames_for_sources(stack: dicom_series.SliceStack, headers: dict[str, pydicom.Dataset], labels: np.ndarray
                        ) -> tuple[list[pydicom.Dataset], np.ndarray]:
    """The source images highdicom references and the mask of each source frame, in highdicom's order.

    highdicom pairs `pixels[i]` with `source_images[i]` (single-frame files)
    or with frame i + 1 of the one multi-frame source.

    Returns:
        (source headers, (frames, H, W) class ids).
    """
    slices = stack.volume_slices()
    if stack.frames[0].index is None:
        return [headers[frame.path] for frame in stack.frames], labels[slices]  # (N, H, W)
    paths = {frame.path for frame in stack.frames}
    if len(paths) > 1:
        raise dead_letters.CaseError("write", "mixed_multiframe", f"the volume of {sorted(paths)[0]} is made of {len(paths)} "
                              "multi-frame files; a DICOM SEG references one multi-frame source, so pass one file")
    header = headers[stack.frames[0].path]
    pixels = np.zeros((int(header.NumberOfFrames), *labels.shape[1:]), labels.dtype)  # (frames of the file, H, W)
    for frame, z in zip(stack.frames, slices):
        pixels[frame.index] = labels[z]
    return [header], pixels


def _refuse_foreign_file(output_path: str) -> None:
    """Refuses to replace a file fullres did not write (anything but a DICOM SEG with fullres as its model)."""
    if not os.path.lexists(output_path):
        return
    try:
        header = pydicom.dcmread(output_path, stop_before_pixels=True)
        ours = str(header.Modality) == "SEG" and str(getattr(header, "ManufacturerModelName", "")) == MANUFACTURER
    except Exception:  # not DICOM, unreadable: not ours either way
        ours = False
    if not ours or os.path.islink(output_path):
        raise output_guard.OutputRefused(f"{output_path} exists and is not a DICOM SEG fullres wrote; choose another "
                                         "output path or move that file away.")


def _save(segmentation, output_path: str) -> str:
    """Writes to a temporary file beside `output_path`, then renames it: a crash never leaves half a SEG."""
    directory = os.path.dirname(os.path.abspath(output_path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".fullres-seg-", suffix=".partial", dir=directory)
    os.close(handle)
    try:
        segmentation.save_as(temporary, enforce_file_format=True)
        os.replace(temporary, output_path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return output_path

