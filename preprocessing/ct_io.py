"""Finding and reading CT cases: DICOM series, NIfTI, NRRD and MetaImage, with label maps.

A *case* is one image volume (a volume file, or the files of one DICOM series)
and, optionally, its label map. Reading uses SimpleITK for volume files;
DICOM series (grouping, multi-frame, compressed files, uneven slices) are
`preprocessing.dicom_series`, DICOM SEG and RTSTRUCT labels `preprocessing.dicom_labels`.

Every problem with one case raises `CaseError(stage, reason, detail)`, which the
pipeline turns into a dead-letter record; it never stops other cases.
"""

from __future__ import annotations

import csv
import dataclasses
import os

import nibabel
import numpy as np
import SimpleITK as sitk

from preprocessing import dicom_labels, dicom_series
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
    """Where one volume comes from: a volume file, the files of a DICOM series, or a DICOM SEG/RTSTRUCT.

    `series_uid` is a DICOM series' SeriesInstanceUID, or the one a SEG/RTSTRUCT
    (`dicom_label` names which) references. `notes` are (source, reason,
    detail) triples about files discovery dropped or slices to be resampled.
    """

    path: str  # the file, or the series' directory
    dicom_files: tuple[str, ...] = ()
    series_uid: str = ""
    dicom_label: str = ""  # "SEG" or "RTSTRUCT"
    notes: tuple[tuple[str, str, str], ...] = ()

    @property
    def is_dicom(self) -> bool:
        return bool(self.dicom_files) and not self.dicom_label


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


def discover(root: str, spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE
             ) -> tuple[dict[str, VolumeSource], list[dict]]:
    """Finds every volume under `root` (a file or a directory tree).

    Returns:
        (volumes by case id, dead letters for files that could not be used).
        A DICOM series takes the name of its directory as case id; when a
        directory holds several series, its SeriesNumber (and where needed the
        end of its SeriesInstanceUID) is appended (`dicom_volumes`). DICOM SEG
        and RTSTRUCT files are returned too, under `dicom_label`.
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
    other_files = []
    for path in files:
        lower = path.lower()
        if lower.endswith(VOLUME_SUFFIXES):
            _add(volumes, dead, case_id_of(path), VolumeSource(path))
        elif not lower.endswith(IGNORED_SUFFIXES):
            other_files.append(path)
    dicom, dicom_dead = dicom_volumes(other_files, set(volumes), spacing_tolerance)
    dead.extend(dicom_dead)
    for case_id, source in dicom.items():
        _add(volumes, dead, case_id, source)
    return volumes, dead


def dicom_volumes(paths: list[str], taken: set[str], spacing_tolerance: float
                  ) -> tuple[dict[str, VolumeSource], list[dict]]:
    """DICOM series (and SEG/RTSTRUCT files) among `paths`, under case ids unique among themselves and `taken`."""
    groups, label_objects, dead = dicom_series.group_files(paths, spacing_tolerance)
    volumes = {
        case_id: VolumeSource(group.directory, group.files, group.series_uid, notes=group.notes)
        for case_id, group in zip(dicom_series.case_ids(groups, taken), groups)
    }
    for label in label_objects:
        key = f"{label.modality}:{label.path}"  # not a case: pair_with_labels gives it the case of its series
        volumes[key] = VolumeSource(label.path, (label.path,), label.referenced_series_uid, label.modality)
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
    images, by_case, dead = _dicom_labels_by_case(images, images)
    if labels is None:
        return [CaseSource(case_id, source, by_case.get(case_id)) for case_id, source in sorted(images.items())], dead
    if os.path.isfile(labels) and labels.lower().endswith(".csv"):
        by_case.update(_read_manifest(labels, images, dead))
    else:
        found, label_dead = discover(labels)
        dead.extend(label_dead)
        found, dicom_labels_found, dicom_dead = _dicom_labels_by_case(found, images)
        dead.extend(dicom_dead)
        by_case.update({**found, **dicom_labels_found})
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


def _dicom_labels_by_case(volumes: dict[str, VolumeSource], images: dict[str, VolumeSource]
                          ) -> tuple[dict[str, VolumeSource], dict[str, VolumeSource], list[dict]]:
    """Takes DICOM SEG/RTSTRUCT files out of `volumes` and keys them by the case id of the series they reference.

    Returns:
        (the other volumes, labels by case id, dead letters for labels whose
        series is not among `images` or that share a series with another label).
    """
    by_uid = {source.series_uid: case_id for case_id, source in images.items() if source.is_dicom}
    others, by_case, dead = {}, {}, []
    for key, source in volumes.items():
        if not source.dicom_label:
            others[key] = source
            continue
        case_id = by_uid.get(source.series_uid)
        if case_id is None:
            dead.append(dead_letter(source.path, "pair", "missing_image", f"{source.dicom_label} {source.path} labels "
                                    f"series {source.series_uid}, which is not among the input images"))
        elif case_id in by_case:
            dead.append(dead_letter(source.path, "pair", "duplicate_label", f"{source.path} and {by_case[case_id].path} "
                                    f"both label case {case_id!r}; keep one of them"))
        else:
            by_case[case_id] = source
    return others, by_case, dead


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


def read_volume(source: VolumeSource, pixel_type=sitk.sitkFloat32, *, reference: sitk.Image | None = None,
                spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE,
                classes: tuple[str, ...] = ()) -> sitk.Image:
    """Reads a volume file, DICOM series or DICOM SEG/RTSTRUCT as a SimpleITK image (HU for CT).

    Args:
        reference: the image a DICOM SEG/RTSTRUCT label is rasterised onto.
        spacing_tolerance: see `dicom_series.read_series`.
        classes: segment/ROI names of DICOM labels; name i is class i + 1.

    Raises:
        CaseError: unreadable file, a DICOM series with two different slices at
            one position, or a SEG/RTSTRUCT naming a segment not in `classes`.
    """
    if source.dicom_label:
        if reference is None:
            raise CaseError("read", "unpaired_label", f"{source.path} is a DICOM {source.dicom_label}, which labels an "
                            "image series; give it together with that series")
        return dicom_labels.read_label(source.path, source.dicom_label, reference, classes)
    if source.is_dicom:
        return dicom_series.read_series(source.dicom_files, spacing_tolerance)
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
