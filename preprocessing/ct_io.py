"""Finding and reading CT cases: DICOM series, NIfTI, NRRD and MetaImage, with label maps.

A *case* is one image volume (a volume file, or the files of one DICOM series)
and, optionally, its label map. Reading uses SimpleITK for volume files and
pydicom for DICOM: slices are grouped by SeriesInstanceUID and ordered by their
position along the slice normal — never by file name or InstanceNumber — and
rescale slope/intercept turn stored values into Hounsfield units.

Every problem with one case raises `CaseError(stage, reason, detail)`, which the
pipeline turns into a dead-letter record; it never stops other cases.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import os

import nibabel
import numpy as np
import pydicom
import SimpleITK as sitk

from preprocessing.conversion import dead_letter

VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd")
# Files that sit next to images but are never images themselves.
IGNORED_SUFFIXES = (".raw", ".zraw", ".json", ".txt", ".md", ".csv")


class CaseError(Exception):
    """One case cannot be used. `reason` is a short stable key for counting."""

    def __init__(self, stage: str, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.stage, self.reason, self.detail = stage, reason, detail


@dataclasses.dataclass(frozen=True)
class VolumeSource:
    """Where one volume comes from: a volume file, or the files of a DICOM series."""

    path: str  # the file, or the series' directory
    dicom_files: tuple[str, ...] = ()

    @property
    def is_dicom(self) -> bool:
        return bool(self.dicom_files)


@dataclasses.dataclass(frozen=True)
class CaseSource:
    """An image volume and (optionally) its label map, under one case id."""

    case_id: str
    image: VolumeSource
    label: VolumeSource | None = None


def case_id_of(path: str) -> str:
    """`images/case7.nii.gz` -> `case7`; a DICOM series directory -> its name."""
    name = os.path.basename(os.path.normpath(path))
    for suffix in VOLUME_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def discover(root: str) -> tuple[dict[str, VolumeSource], list[dict]]:
    """Finds every volume under `root` (a file or a directory tree).

    Returns:
        (volumes by case id, dead letters for files that could not be used).
        A DICOM series takes the name of its directory as case id; when a
        directory holds several series, `-` and the end of the SeriesInstanceUID
        are appended.
    """
    if not os.path.exists(root):
        raise FileNotFoundError(f"input {root!r} does not exist; pass a CT file or a directory of CT files.")
    files = [root] if os.path.isfile(root) else sorted(
        os.path.join(directory, name)
        for directory, _, names in os.walk(root)
        for name in names
        if not name.startswith(".")
    )
    volumes: dict[str, VolumeSource] = {}
    dead: list[dict] = []
    series: dict[str, list[str]] = collections.defaultdict(list)
    for path in files:
        lower = path.lower()
        if lower.endswith(VOLUME_SUFFIXES):
            _add(volumes, dead, case_id_of(path), VolumeSource(path))
        elif lower.endswith(IGNORED_SUFFIXES):
            continue
        else:
            try:
                header = pydicom.dcmread(path, stop_before_pixels=True)
                uid = str(header.SeriesInstanceUID)
            except Exception as error:  # pydicom raises many kinds for non-DICOM or corrupt files
                dead.append(dead_letter(path, "discover", "unreadable", f"not a readable DICOM or volume file ({error})"))
                continue
            series[uid].append(path)
    directories = collections.Counter(os.path.dirname(paths[0]) for paths in series.values())
    for uid, paths in sorted(series.items()):
        directory = os.path.dirname(paths[0])
        case_id = case_id_of(directory) if directories[directory] == 1 else f"{case_id_of(directory)}-{uid[-8:]}"
        _add(volumes, dead, case_id, VolumeSource(directory, tuple(sorted(paths))))
    return volumes, dead


def _add(volumes: dict, dead: list, case_id: str, source: VolumeSource) -> None:
    if case_id in volumes:
        dead.append(dead_letter(source.path, "discover", "duplicate_case_id",
                                f"case id {case_id!r} is also used by {volumes[case_id].path}; rename one of them"))
    else:
        volumes[case_id] = source


def pair_with_labels(images: dict[str, VolumeSource], labels: str | None) -> tuple[list[CaseSource], list[dict]]:
    """Pairs images with label maps from a directory (same case id) or a manifest CSV (`image,label` rows).

    Returns:
        (cases, dead letters): an image without a label is a dead letter when
        labels were asked for; a label without an image is reported too.
    """
    if labels is None:
        return [CaseSource(case_id, source) for case_id, source in sorted(images.items())], []
    dead: list[dict] = []
    if os.path.isfile(labels) and labels.lower().endswith(".csv"):
        by_case = _read_manifest(labels, images, dead)
    else:
        by_case, label_dead = discover(labels)
        dead.extend(label_dead)
    cases = []
    for case_id, source in sorted(images.items()):
        label = by_case.get(case_id)
        if label is None:
            dead.append(dead_letter(source.path, "pair", "missing_label", f"no label map for case {case_id!r} in {labels}"))
        else:
            cases.append(CaseSource(case_id, source, label))
    for case_id in sorted(set(by_case) - set(images)):
        dead.append(dead_letter(by_case[case_id].path, "pair", "missing_image", f"label for case {case_id!r} has no image"))
    return cases, dead


def _read_manifest(path: str, images: dict[str, VolumeSource], dead: list) -> dict[str, VolumeSource]:
    base = os.path.dirname(os.path.abspath(path))
    by_image_path = {os.path.abspath(source.path): case_id for case_id, source in images.items()}
    by_case = {}
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        if reader.fieldnames is None or not {"image", "label"} <= set(reader.fieldnames):
            raise ValueError(f"manifest {path} needs a header row with the columns image,label.")
        for line, row in enumerate(reader, start=2):
            image_path = os.path.abspath(os.path.join(base, row["image"]))
            label_path = os.path.join(base, row["label"])
            case_id = by_image_path.get(image_path)
            if case_id is None:
                dead.append(dead_letter(f"{path}:{line}", "pair", "missing_image",
                                        f"manifest image {row['image']!r} is not among the input images"))
            else:
                by_case[case_id] = VolumeSource(label_path)
    return by_case


def read_volume(source: VolumeSource, pixel_type=sitk.sitkFloat32) -> sitk.Image:
    """Reads a volume file or DICOM series as a SimpleITK image (HU for CT).

    Raises:
        CaseError: unreadable file, or a DICOM series with missing, duplicate or
            unevenly spaced slices.
    """
    if source.is_dicom:
        return read_dicom_series(source.dicom_files)
    try:
        image = sitk.ReadImage(source.path, pixel_type)
    except RuntimeError as error:
        raise CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    if source.path.lower().endswith((".nii", ".nii.gz")):
        _check_nifti_finite(source.path)
    return image


def _check_nifti_finite(path: str) -> None:
    """Refuses NaN/Inf voxels in a NIfTI file.

    ITK's NIfTI reader silently turns NaN and Inf into 0, so the values it
    returns cannot show them; nibabel reads the stored values as they are.
    """
    stored = np.asanyarray(nibabel.load(path).dataobj)
    if np.issubdtype(stored.dtype, np.floating):
        bad = int(stored.size - np.count_nonzero(np.isfinite(stored)))
        if bad:
            raise CaseError("validate", "non_finite_voxels", f"{bad} voxels of {path} are NaN or infinite")


def read_dicom_series(files: tuple[str, ...]) -> sitk.Image:
    """Reads one DICOM series into a float32 HU image with its patient-space geometry."""
    try:
        datasets = [pydicom.dcmread(path) for path in files]
    except Exception as error:
        raise CaseError("read", "unreadable", f"a slice of the series cannot be read ({error})") from None
    if len(datasets) < 2:
        raise CaseError("read", "too_few_slices", f"series has {len(datasets)} slice; a volume needs at least 2")
    try:
        orientation = np.array([float(v) for v in datasets[0].ImageOrientationPatient])
        positions = np.array([[float(v) for v in ds.ImagePositionPatient] for ds in datasets])
        orientations = np.array([[float(v) for v in ds.ImageOrientationPatient] for ds in datasets])
        pixel_spacing = [float(v) for v in datasets[0].PixelSpacing]  # (row spacing, column spacing)
    except AttributeError as error:
        raise CaseError("read", "missing_geometry", f"a slice lacks a geometry attribute ({error})") from None
    if np.abs(orientations - orientation).max() > 1e-4:
        raise CaseError("read", "inconsistent_orientation", "slices of the series have different ImageOrientationPatient")
    row_direction, column_direction = orientation[:3], orientation[3:]
    normal = np.cross(row_direction, column_direction)
    along_normal = positions @ normal
    order = np.argsort(along_normal, kind="stable")
    gaps = np.diff(along_normal[order])
    step = float(np.median(gaps))
    if np.any(gaps < 1e-3 * max(abs(step), 1e-6)):
        raise CaseError("read", "duplicate_slice", f"two slices share a position along the slice normal ({len(files)} files)")
    if np.abs(gaps - step).max() > 0.01 * step + 1e-3:
        if np.any(np.abs(gaps / step - np.round(gaps / step)) < 0.05) and np.any(np.round(gaps / step) >= 2):
            raise CaseError("read", "missing_slice", f"gaps of {gaps.max():.3g} mm between slices spaced {step:.3g} mm")
        raise CaseError("read", "non_uniform_spacing", f"slice gaps range from {gaps.min():.3g} to {gaps.max():.3g} mm")
    slices = []
    for index in order:
        dataset = datasets[index]
        try:
            pixels = dataset.pixel_array.astype(np.float32)
        except Exception as error:
            raise CaseError("read", "unreadable", f"pixel data of {files[index]} cannot be decoded ({error})") from None
        slope = float(getattr(dataset, "RescaleSlope", 1.0))
        intercept = float(getattr(dataset, "RescaleIntercept", 0.0))
        slices.append(pixels * slope + intercept)
    if len({s.shape for s in slices}) != 1:
        raise CaseError("read", "inconsistent_slice_shape", "slices of the series have different rows/columns")
    image = sitk.GetImageFromArray(np.stack(slices))  # (D, H, W)
    image.SetSpacing((pixel_spacing[1], pixel_spacing[0], step))
    image.SetOrigin(tuple(float(v) for v in positions[order[0]]))
    # ITK direction: row-major 3×3 whose columns are the x (row), y (column) and z (normal) axes.
    image.SetDirection(tuple(np.stack([row_direction, column_direction, normal], axis=1).reshape(-1).tolist()))
    return image
