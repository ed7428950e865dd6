"""Reading CT cases: DICOM series, NIfTI, NRRD and MetaImage, with label maps.

A *case* is one image volume (a volume file, or the files of one DICOM series)
and, optionally, its label map. Reading uses SimpleITK for volume files;
DICOM series (grouping, multi-frame, compressed files, uneven slices) are
`preprocessing.ct.dicom_series`, DICOM SEG and RTSTRUCT labels `preprocessing.ct.dicom_labels`.
Cases are found by `volume_discovery` and paired with their label maps by `label_pairing`.

Every problem with one case raises `CaseError(stage, reason, detail)`, which the
pipeline turns into a dead-letter record; it never stops other cases.
"""

from __future__ import annotations

import dataclasses

import nibabel
import numpy as np
import SimpleITK as sitk
from nibabel import openers

from common import dead_letters
from preprocessing.ct import dicom_labels, dicom_series, volume_bytes


# The NaN/Inf check reads a NIfTI file's stored values in slabs of this many bytes.
_FINITE_CHECK_BYTES = 64 * 2**20


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
    name: str = ""  # how outputs name it: the path relative to the input root, or a pseudonym (`identifiers`)

    @property
    def is_dicom(self) -> bool:
        return bool(self.dicom_files) and not self.dicom_label


@dataclasses.dataclass(frozen=True)
class CaseSource:
    """An image volume and (optionally) its label map, under one case id."""

    case_id: str
    image: VolumeSource
    label: VolumeSource | None = None


def read_volume(source: VolumeSource, pixel_type=sitk.sitkFloat32, *, reference: sitk.Image | None = None,
                spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE,
                classes: tuple[str, ...] = ()) -> sitk.Image:
    """Reads a volume file, DICOM series or DICOM SEG/RTSTRUCT as a SimpleITK image (HU for CT).

    Args:
        reference: the image a DICOM SEG/RTSTRUCT label is rasterised onto.
        spacing_tolerance: see `dicom_series.read_series`.
        classes: segment/ROI names of DICOM labels; name i is class i + 1.

    Raises:
        dead_letters.CaseError: unreadable file, a file cut short (`volume_bytes`), a DICOM series with two
            different slices at one position, or a SEG/RTSTRUCT naming a segment not in `classes`.
    """
    if source.dicom_label:
        if reference is None:
            raise dead_letters.CaseError("read", "unpaired_label", f"{source.path} is a DICOM {source.dicom_label}, which labels an "
                            "image series; give it together with that series")
        return dicom_labels.read_label(source.path, source.dicom_label, reference, classes)
    if source.is_dicom:
        return dicom_series.read_series(source.dicom_files, spacing_tolerance)
    volume_bytes.check_complete(source.path)  # ITK's NIfTI reader would fill a cut-short file with zeros
    try:
        image = sitk.ReadImage(source.path, pixel_type)
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    if source.path.lower().endswith((".nii", ".nii.gz")):
        _check_nifti_finite(source.path)
    return image


def _check_nifti_finite(path: str) -> None:
    """Refuses NaN/Inf voxels in a NIfTI file.

    ITK's NIfTI reader silently turns NaN and Inf into 0, so the values it
    returns cannot show them; the stored values are read as they are, in
    slabs of `_FINITE_CHECK_BYTES`, so the check never holds a second copy of
    the volume beside the one SimpleITK decoded.
    """
    image = nibabel.load(path)
    stored = image.get_data_dtype()  # with the file's byte order
    if not np.issubdtype(stored, np.floating):
        return
    remaining, bad = int(np.prod(image.shape, dtype=np.int64)), 0
    step = max(1, _FINITE_CHECK_BYTES // stored.itemsize)
    with openers.ImageOpener(path) as file:
        file.seek(int(image.dataobj.offset))  # the header copy nibabel keeps says 0
        while remaining:
            block = np.frombuffer(file.read(min(step, remaining) * stored.itemsize), stored)
            if not block.size:
                break  # a short file: SimpleITK has read what it holds
            bad += int(block.size - np.count_nonzero(np.isfinite(block)))
            remaining -= block.size
    if bad:
        raise dead_letters.CaseError("validate", "non_finite_voxels", f"{bad} voxels of {path} are NaN or infinite")
