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

from common import dead_letters
from preprocessing.ct import dicom_labels, dicom_series


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
        dead_letters.CaseError: unreadable file, a DICOM series with two different slices at
            one position, or a SEG/RTSTRUCT naming a segment not in `classes`.
    """
    if source.dicom_label:
        if reference is None:
            raise dead_letters.CaseError("read", "unpaired_label", f"{source.path} is a DICOM {source.dicom_label}, which labels an "
                            "image series; give it together with that series")
        return dicom_labels.read_label(source.path, source.dicom_label, reference, classes)
    if source.is_dicom:
        return dicom_series.read_series(source.dicom_files, spacing_tolerance)
    try:
        image = sitk.ReadImage(source.path, pixel_type)
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    if source.path.lower().endswith((".nii", ".nii.gz")):
        _check_nifti_finite(source.path)
    return image


def read_size(source: VolumeSource) -> tuple[tuple[int, int, int], tuple[float, float, float]]:
    """A volume's size and spacing, both (x, y, z), from its header alone: no voxel is read or decompressed.

    Raises:
        dead_letters.CaseError: the header cannot be read.
    """
    import pydicom

    try:
        if source.is_dicom:
            header = pydicom.dcmread(source.dicom_files[0], stop_before_pixels=True)
            row_spacing, column_spacing = (float(v) for v in getattr(header, "PixelSpacing", (1.0, 1.0)))
            frames = int(getattr(header, "NumberOfFrames", 1) or 1)  # multi-frame (enhanced) files hold many slices
            size = (int(header.Columns), int(header.Rows), frames * len(source.dicom_files))
            return size, (column_spacing, row_spacing, float(getattr(header, "SliceThickness", None) or 1.0))
        reader = sitk.ImageFileReader()
        reader.SetFileName(source.path)
        reader.ReadImageInformation()
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    except Exception as error:  # pydicom raises many kinds for corrupt headers
        raise dead_letters.CaseError("read", "unreadable", f"the header of {source.dicom_files[0]} cannot be read ({error})") from None
    size = tuple(reader.GetSize()) + (1,) * (3 - reader.GetDimension())
    return size[:3], tuple(reader.GetSpacing())[:3]


def _check_nifti_finite(path: str) -> None:
    """Refuses NaN/Inf voxels in a NIfTI file.

    ITK's NIfTI reader silently turns NaN and Inf into 0, so the values it
    returns cannot show them; nibabel reads the stored values as they are.
    """
    stored = np.asanyarray(nibabel.load(path).dataobj)
    if np.issubdtype(stored.dtype, np.floating):
        bad = int(stored.size - np.count_nonzero(np.isfinite(stored)))
        if bad:
            raise dead_letters.CaseError("validate", "non_finite_voxels", f"{bad} voxels of {path} are NaN or infinite")
