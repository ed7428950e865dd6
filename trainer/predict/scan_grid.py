"""A scan onto the model's grid as its training scans were prepared, and the model's mask back onto the scan's own grid.

`prepare` repeats the preprocessing a run recorded (`model_info.json`'s
`preprocessing`: spacing, orientation, HU window, modality) with the same
functions as `fullres preprocess ct`; `to_original_grid` maps the class
probabilities back by physical position, so every mask has the scan's exact
size, spacing, origin and direction.
"""

import dataclasses

import numpy as np
import SimpleITK as sitk

from preprocessing.ct import ct_io, ct_transforms, dicom_series, geometry, intensity

FORMATS = {"nifti": ".nii.gz", "nrrd": ".nrrd", "mha": ".mha"}
_FORMAT_OF_SUFFIX = {".nii.gz": "nifti", ".nii": "nifti", ".nrrd": "nrrd", ".nhdr": "nrrd", ".mha": "mha", ".mhd": "mha"}


@dataclasses.dataclass
class Prepared:
    """One scan made ready for the model.

    `original` is the scan as read (its grid is the one the mask is written on);
    `grid` is the model's grid (reoriented and resampled as in training, an
    empty image carrying the geometry); `volume` (D, H, W, 1) the normalized
    voxels on it; `fill` the value padding gets (air, or the z-score's minimum).
    """

    original: sitk.Image
    grid: sitk.Image
    volume: np.ndarray
    fill: float


def output_format(source: ct_io.VolumeSource, requested: str | None) -> str:
    """`requested`, or the input's own format (NIfTI for a DICOM series)."""
    if requested is not None:
        if requested not in FORMATS:
            raise ValueError(f"--format {requested!r} is not known; use one of {', '.join(FORMATS)}.")
        return requested
    lower = source.path.lower()
    return next((name for suffix, name in _FORMAT_OF_SUFFIX.items() if lower.endswith(suffix)), "nifti")


def prepare(source: ct_io.VolumeSource, preprocessing: dict,
            spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE,
            max_voxels: int = ct_transforms.DEFAULT_MAX_VOXELS,
            max_decoded_bytes: int = ct_transforms.DEFAULT_MAX_DECODED_BYTES) -> Prepared:
    """Reads `source` and applies the model's recorded preprocessing (`model_info.json`'s `preprocessing`).

    The same functions as `fullres preprocess ct` (`ct_transforms`): the header
    checked before any voxel is decoded (geometry, 4-D, the size limits, on the
    scan and on the model's grid), orientation, resampling to the recorded
    spacing (linear, air outside), CT window or z-score. No crop: the whole
    volume goes through the model.

    Raises:
        dead_letters.CaseError: unreadable, empty, non-finite, too small or too large scans, or ones whose
            geometry would have to be guessed.
    """
    spacing = preprocessing["spacing"]
    ct_transforms.check_volume(
        source, max_voxels, max_decoded_bytes, tuple(spacing) if spacing else None,
        f" resampled to the model's spacing {','.join(f'{t:g}' for t in spacing)}" if spacing else "", "this machine")
    original, normalization, _, background = ct_transforms.read_scan(source, preprocessing["modality"],
                                                                     spacing_tolerance)
    oriented = sitk.DICOMOrient(original, preprocessing["orientation"])
    grid = geometry.resample(oriented, tuple(spacing) if spacing else None, sitk.sitkLinear, background,
                                  sitk.sitkFloat32)
    scaled, _, fill = intensity.normalize(sitk.GetArrayFromImage(grid), normalization,
                                              tuple(preprocessing["window"]))
    return Prepared(original, grid, scaled[..., None].astype(np.float32), float(fill))


def to_original_grid(probabilities: np.ndarray, grid: sitk.Image, original: sitk.Image
                     ) -> tuple[sitk.Image, sitk.Image]:
    """Class probabilities on the model's grid -> (class ids, probabilities) on the scan's own grid.

    The probabilities are resampled (linear interpolation, by physical position:
    reorientation and spacing are undone together) and the argmax is taken on
    the original grid. Resampling class ids with nearest neighbour instead
    would put every boundary on the coarser grid's voxel edges; interpolated
    probabilities place it between them. Original voxels past the last model
    voxel centre (up to half a model voxel at the far edges) take the nearest
    model voxel's probabilities rather than none.

    Args:
        probabilities: (D, H, W, K) on `grid` (numpy order: z, y, x).
        grid: an image with the model grid's geometry.
        original: the scan as read.

    Returns:
        (uint8 class ids, float32 K-component probabilities), both with `original`'s size, spacing, origin and direction.
    """
    vector = sitk.GetImageFromArray(np.ascontiguousarray(probabilities, np.float32), isVector=True)
    vector.SetSpacing(grid.GetSpacing())
    vector.SetOrigin(grid.GetOrigin())
    vector.SetDirection(grid.GetDirection())
    resampler = sitk.ResampleImageFilter()
    resampler.SetReferenceImage(original)
    resampler.SetInterpolator(sitk.sitkLinear)
    resampler.SetUseNearestNeighborExtrapolator(True)
    resampled = resampler.Execute(vector)
    on_original = sitk.GetArrayFromImage(resampled)  # (D, H, W, K)
    mask = sitk.GetImageFromArray(np.argmax(on_original, axis=-1).astype(np.uint8))
    mask.CopyInformation(original)
    return mask, resampled
