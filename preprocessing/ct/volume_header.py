"""What a volume's header says, read before any voxel is decoded: size, geometry, stored type; and what it may not say.

Geometry is never guessed. ITK and nibabel both read a NIfTI whose `pixdim`
is zero (or NaN) as 1 mm voxels, and a MetaImage or NRRD reader hands back
zero spacing or a zero direction as it found it; a scan placed on such a
guess is resampled and predicted on it without a word. So the header is read
first, by the same rules for every format (`read_header`), and
`check_header` refuses a volume whose spacing or direction is zero or not
finite (naming the header field), a 4-D file (saying how many volumes it
holds), a file of vectors, and a volume with fewer than
`geometry.MIN_VOXELS_PER_AXIS` voxels along an axis (the rule DICOM series
follow too). The memory a volume needs once decoded is counted from the
stored type here as well (`VolumeHeader.decoded_bytes`).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import ct_io, geometry, volume_bytes

# Bytes a voxel takes once fullres works on it: every volume is read into a float32 copy. (A DICOM series is
# decoded file by file into a float32 volume, and SimpleITK copies that once more as the read ends: for a moment
# 8 bytes a voxel and one file's pixels, against 2 + 4 counted for int16 slices.)
WORKING_BYTES_PER_VOXEL = 4

# The header fields that hold the spacing and the direction, by format (for the sentence that names them).
_FIELDS = {
    "nifti": ("pixdim[1:4]", "sform (srow_x, srow_y, srow_z) or qform (quatern_b/c/d, qoffset_x/y/z)"),
    "nrrd": ("space directions (or spacings)", "space directions"),
    "meta": ("ElementSpacing", "TransformMatrix"),
    "dicom": ("PixelSpacing", "ImageOrientationPatient"),
}


@dataclasses.dataclass(frozen=True)
class VolumeHeader:
    """One volume as its header describes it; all (x, y, z).

    `volumes` is the length of a 4th axis (1 for a 3-D file), `components`
    the values per voxel (1 for a scalar image), `stored_type` the numpy name
    of the stored values and `stored_bytes` their size.
    """

    size: tuple[int, int, int]
    spacing: tuple[float, float, float]
    direction: tuple[float, ...]  # row-major 3×3
    stored_type: str
    stored_bytes: int
    volumes: int = 1
    components: int = 1
    format: str = "meta"  # one of _FIELDS

    @property
    def voxels(self) -> int:
        return int(np.prod(self.size, dtype=np.int64))

    @property
    def decoded_bytes(self) -> int:
        """Bytes the voxels take once decoded: as stored, and the float32 copy fullres works on."""
        return self.voxels * (self.stored_bytes * self.components + WORKING_BYTES_PER_VOXEL)


def format_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith((".nii", ".nii.gz")):
        return "nifti"
    if lower.endswith((".nrrd", ".nhdr")):
        return "nrrd"
    return "meta"


def read_header(source: ct_io.VolumeSource) -> VolumeHeader:
    """The header of a volume file or of a DICOM series' first file; no voxel is read or decompressed.

    Raises:
        dead_letters.CaseError: the header cannot be read, or (NIfTI) its spacing or direction fields are zero
            or not finite, which NIfTI readers would silently replace.
    """
    if source.is_dicom:
        return _dicom_header(source)
    volume_bytes.check_regular(source.path)  # a named pipe would block the header reader for ever
    if os.path.isfile(source.path) and os.path.getsize(source.path) == 0:
        raise dead_letters.CaseError("read", "empty_file", f"{name_of(source)} is empty (0 bytes): a copy or download "
                                                           "that never wrote it; copy it again from its source")
    kind = format_of(source.path)
    if kind == "nifti":
        _check_nifti_fields(source)
    elif kind in ("nrrd", "meta"):
        _check_text_header(source, kind)
    reader = sitk.ImageFileReader()
    reader.SetFileName(source.path)
    try:
        reader.ReadImageInformation()
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: "
                                     f"{str(error).strip().splitlines()[-1]}") from None
    dimension = reader.GetDimension()
    size = tuple(reader.GetSize()) + (1,) * (3 - dimension)
    # ITK's NIfTI header gives a negative pixdim as it is (the image it reads is flipped, with the spacing positive).
    spacing = tuple(abs(s) for s in reader.GetSpacing()[:3]) + (1.0,) * (3 - dimension)  # 2-D: refused by its size
    direction = np.eye(3)
    direction[:min(dimension, 3), :min(dimension, 3)] = np.array(reader.GetDirection()).reshape(
        dimension, dimension)[:3, :3]
    volumes = int(np.prod(size[3:], dtype=np.int64)) if dimension > 3 else 1
    stored = _stored_dtype(reader.GetPixelID())
    return VolumeHeader(tuple(int(n) for n in size[:3]), tuple(float(s) for s in spacing),
                        tuple(direction.reshape(-1).tolist()), stored.name, stored.itemsize, volumes,
                        int(reader.GetNumberOfComponents()), kind)


def check_header(header: VolumeHeader, name: str) -> None:
    """Refuses a volume fullres would have to guess about: geometry, a 4th axis, vectors, too few voxels.

    Args:
        name: how the dead letter names the file (relative, never an absolute path).

    Raises:
        dead_letters.CaseError: `four_dimensional`, `not_scalar`, `invalid_geometry` or `too_small`.
    """
    spacing_field, direction_field = _FIELDS[header.format]
    dims = " x ".join(map(str, header.size))
    if header.volumes > 1:
        raise dead_letters.CaseError(
            "read", "four_dimensional",
            f"{name} is 4-D, {header.volumes} volumes of {dims} voxels; fullres reads one 3-D volume per file, so "
            "save the volume to use as a file of its own (e.g. nibabel.load(path).slicer[..., INDEX])")
    if header.components > 1:
        raise dead_letters.CaseError(
            "read", "not_scalar", f"{name} holds {header.components} values per voxel (a vector or colour image); "
            "a CT or MR volume holds one, so save the channel to use as a file of its own")
    spacing = np.array(header.spacing)
    if not np.all(np.isfinite(spacing)) or np.any(spacing == 0):
        raise dead_letters.CaseError(
            "read", "invalid_geometry",
            f"{name} has voxel spacing {' x '.join(f'{s:g}' for s in spacing)} mm in its header ({spacing_field}); "
            "fullres does not guess geometry, so write the scan's true voxel size into its header")
    direction = np.array(header.direction).reshape(3, 3)
    if not np.all(np.isfinite(direction)) or abs(np.linalg.det(direction)) < 1e-6:
        raise dead_letters.CaseError(
            "read", "invalid_geometry",
            f"{name} has a zero or non-finite direction in its header ({direction_field}); fullres does not guess "
            "orientation, so write the scan's true orientation into its header")
    check_minimum(header.size, name)


def check_minimum(size, name: str, after: str = "") -> None:
    """Refuses fewer than `geometry.MIN_VOXELS_PER_AXIS` voxels along an axis: a point or a slice is not a volume.

    Args:
        size: (x, y, z) voxels.
        after: what would make the size, e.g. " resampled to --spacing 5,5,5" (empty: as stored).

    Raises:
        dead_letters.CaseError: `too_small`.
    """
    if min(size) < geometry.MIN_VOXELS_PER_AXIS:
        raise dead_letters.CaseError(
            "read", "too_small",
            f"{name}{after} {'would be' if after else 'is'} {' x '.join(map(str, size))} voxels; a volume needs at least "
            f"{geometry.MIN_VOXELS_PER_AXIS} along each axis (a point or a single slice is not padded into a scan)")


def name_of(source: ct_io.VolumeSource) -> str:
    """How dead letters name a volume: its relative name, else its file or folder name (never an absolute path)."""
    return source.name or os.path.basename(os.path.normpath(source.path))


def _stored_dtype(pixel_id: int) -> np.dtype:
    """The numpy type SimpleITK stores a pixel type's components in (a one-voxel image tells)."""
    try:
        return sitk.GetArrayViewFromImage(sitk.Image([1, 1], pixel_id)).dtype
    except RuntimeError:  # a pixel type numpy cannot view: count the widest
        return np.dtype(np.float64)


def _dicom_header(source: ct_io.VolumeSource) -> VolumeHeader:
    import pydicom

    try:
        header = pydicom.dcmread(source.dicom_files[0], stop_before_pixels=True)
        row_spacing, column_spacing = (float(v) for v in getattr(header, "PixelSpacing", (1.0, 1.0)))
        frames = int(getattr(header, "NumberOfFrames", 1) or 1)  # multi-frame (enhanced) files hold many slices
        size = (int(header.Columns), int(header.Rows), frames * len(source.dicom_files))
        bits = int(getattr(header, "BitsAllocated", 16) or 16)
        samples = int(getattr(header, "SamplesPerPixel", 1) or 1)
    except Exception as error:  # pydicom raises many kinds for corrupt headers
        raise dead_letters.CaseError("read", "unreadable",
                                     f"the header of {source.dicom_files[0]} cannot be read ({error})") from None
    # Slice geometry is checked per file when the series is read (`dicom_frames.frames_of`); here only the size matters.
    stored = np.dtype(f"int{max(8, bits)}") if bits in (8, 16, 32, 64) else np.dtype(np.float64)
    return VolumeHeader(size, (column_spacing, row_spacing, float(getattr(header, "SliceThickness", None) or 1.0)),
                        tuple(np.eye(3).reshape(-1).tolist()), stored.name, stored.itemsize, 1, samples, "dicom")


def _check_text_header(source: ct_io.VolumeSource, kind: str) -> None:
    """Refuses a NRRD or MetaImage header whose data file is missing (naming it), or that gives no voxel spacing at
    all (readers would take 1 mm, as a NIfTI reader takes a zero pixdim: `_check_nifti_fields`)."""
    try:
        fields, _ = (volume_bytes.nrrd_fields if kind == "nrrd" else volume_bytes.meta_fields)(source.path)
    except Exception:  # no header this module can read: SimpleITK's reader says what is wrong in its own words
        return
    field, data_file = next(((key, fields[key]) for key in ("data file", "datafile", "ElementDataFile")
                             if fields.get(key)), (None, ""))
    one_file = data_file and data_file.upper() not in ("LOCAL", "LIST") and not any(c in data_file for c in " %")
    if one_file and not os.path.exists(os.path.join(os.path.dirname(source.path), data_file)):
        raise dead_letters.CaseError(
            "read", "missing_data_file",
            f"{name_of(source)} keeps its voxels in {data_file} (its header's {field}), which does not exist beside "
            "it; copy the data file next to the header, or correct the header's file name")
    spacing = ("space directions", "spacings") if kind == "nrrd" else ("ElementSpacing", "ElementSize")
    if not any(fields.get(field) for field in spacing):
        raise dead_letters.CaseError(
            "read", "invalid_geometry",
            f"{name_of(source)} gives no voxel spacing in its header ({' or '.join(spacing)}), which readers take as "
            "1 mm; fullres does not guess geometry, so write the scan's true voxel size into its header")


def _check_nifti_fields(source: ct_io.VolumeSource) -> None:
    """Refuses zero or non-finite pixdims and qform/sform fields in a NIfTI header, naming the field."""
    name = name_of(source)
    try:
        header = volume_bytes.raw_nifti_header(source.path)
    except Exception:  # not gzip, truncated: SimpleITK's reader says it in its own words
        return
    if header is None:
        return
    dims = max(1, min(3, int(header["dim"][0])))
    pixdim = np.asarray(header["pixdim"][1:1 + dims], np.float64)
    if not np.all(np.isfinite(pixdim)) or np.any(pixdim == 0):
        raise dead_letters.CaseError(
            "read", "invalid_geometry",
            f"{name} has voxel spacing {' x '.join(f'{s:g}' for s in pixdim)} mm in its header (NIfTI "
            f"pixdim[1:{1 + dims}]); fullres does not guess geometry, so write the scan's true voxel size into its "
            "header")
    if int(header["sform_code"]) > 0:
        rows = np.array([header[f"srow_{axis}"] for axis in "xyz"], np.float64)  # (3, 4)
        if not np.all(np.isfinite(rows)) or abs(np.linalg.det(rows[:, :3])) < 1e-12:
            raise dead_letters.CaseError(
                "read", "invalid_geometry",
                f"{name} has a zero or non-finite affine in its header (NIfTI sform: srow_x, srow_y, srow_z); "
                "fullres does not guess orientation, so write the scan's true orientation into its header")
    if int(header["qform_code"]) > 0:
        quaternion = np.array([header[field] for field in ("quatern_b", "quatern_c", "quatern_d", "qoffset_x",
                                                           "qoffset_y", "qoffset_z")], np.float64)
        if not np.all(np.isfinite(quaternion)):
            raise dead_letters.CaseError(
                "read", "invalid_geometry",
                f"{name} has a non-finite qform in its header (NIfTI quatern_b/c/d, qoffset_x/y/z); fullres does not "
                "guess orientation, so write the scan's true orientation into its header")
    _check_nifti_transforms(header, name)


def _check_nifti_transforms(header, name: str) -> None:
    """Refuses a header with neither transform, a sheared sform, and a qform and sform that place the volume
    differently, naming them.

    ITK (and so fullres's reader) holds only perpendicular axes: a sheared
    sform is dropped for the qform, the nearest rotation, without a word (or
    the file is unreadable where there is no qform). Where both transforms are
    set and disagree, readers choose differently (ITK took the qform where
    nibabel and FSL take the sform), so the masks written back would sit
    elsewhere for one of them. Agreement within half a voxel at every corner
    of the volume (float32 rounding of the quaternion) passes.
    """
    sform = header.get_sform() if int(header["sform_code"]) > 0 else None
    qform = header.get_qform() if int(header["qform_code"]) > 0 else None
    if sform is None and qform is None:
        raise dead_letters.CaseError(
            "read", "invalid_geometry",
            f"{name} has neither a qform nor an sform in its header (NIfTI qform_code and sform_code 0), so where it "
            "lies and which way it faces are unknown (ITK and nibabel would place it mirrored left to right); fullres "
            "does not guess orientation, so write the scan's true orientation into its header (e.g. nibabel: "
            "image.set_sform(affine, code=1))")
    if sform is not None:
        axes = sform[:3, :3] / np.linalg.norm(sform[:3, :3], axis=0)
        cosines = np.abs(axes.T @ axes - np.eye(3))
        if cosines.max() > 1e-3:
            first, second = np.unravel_index(int(np.argmax(cosines)), cosines.shape)
            angle = float(np.degrees(np.arccos(np.clip(axes[:, first] @ axes[:, second], -1, 1))))
            raise dead_letters.CaseError(
                "read", "sheared_geometry",
                f"{name} has a sheared affine in its header (NIfTI sform: its voxel axes {'ijk'[first]} and "
                f"{'ijk'[second]} meet at {angle:.2f}° instead of 90°), which ITK-based readers and fullres's records "
                "cannot hold (ITK would silently take the qform's rotation instead); resample the scan onto a grid with "
                "perpendicular axes first (e.g. 3D Slicer's Resample Scalar Volume, or antsApplyTransforms)")
    if sform is None or qform is None:
        return
    size = [max(1, int(n)) for n in header["dim"][1:4]]
    corners = np.array([[i, j, k, 1] for i in (0, size[0] - 1) for j in (0, size[1] - 1) for k in (0, size[2] - 1)],
                       np.float64).T
    apart = float(np.linalg.norm((sform - qform)[:3] @ corners, axis=0).max())
    voxel = float(np.min(np.linalg.norm(sform[:3, :3], axis=0)))
    if apart > 0.5 * voxel:
        raise dead_letters.CaseError(
            "read", "conflicting_geometry",
            f"{name} has a qform and an sform that place the volume up to {apart:.1f} mm apart (NIfTI qform_code "
            f"{int(header['qform_code'])}, sform_code {int(header['sform_code'])}); readers choose between them "
            "differently, so fullres does not guess: make them agree, e.g. with nibabel "
            "(image.set_qform(image.get_sform())) or FSL (fslorient -copysform2qform)")
