"""One CT case to one training record: orient, resample, window, crop or pad.

Plain functions on SimpleITK images and NumPy arrays, so they are tested
directly and run unchanged inside a Beam `DoFn` on any runner.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import SimpleITK as sitk

from preprocessing import ct_io, dicom_series, tfrecord_schema

AIR_HU = -1024.0


@dataclasses.dataclass(frozen=True)
class CtPreprocessConfig:
    """How every case is brought to a common grid.

    Args:
        spacing: target voxel spacing in mm, (x, y, z); None keeps each case's own.
        window: HU window (low, high) clipped and mapped onto [0, 1].
        shape: target (D, H, W), centre-cropped or padded (with the window's low
            end and background label); None keeps the resampled size.
        orientation: canonical orientation code (DICOM convention, ITK's "LPS"
            gives the identity direction for axis-aligned scans).
        spacing_tolerance: DICOM slice gaps may vary by this fraction of their
            median; beyond it the slices are interpolated onto a uniform grid.
        classes: names of DICOM SEG segments / RTSTRUCT ROIs; name i is class i + 1.

    Example:
        >>> config = CtPreprocessConfig(spacing=(1.5, 1.5, 2.0), window=(-160, 240), shape=(64, 128, 128))
    """

    spacing: tuple[float, float, float] | None = (1.0, 1.0, 1.0)
    window: tuple[float, float] = (-1000.0, 1000.0)
    shape: tuple[int, int, int] | None = None
    orientation: str = "LPS"
    spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE
    classes: tuple[str, ...] = ()

    def __post_init__(self):
        if not 0 <= self.spacing_tolerance < 1:
            raise ValueError(f"--spacing-tolerance needs a fraction in [0, 1), e.g. 0.05, got {self.spacing_tolerance}.")
        if len({name.strip().lower() for name in self.classes}) != len(self.classes) or not all(n.strip() for n in self.classes):
            raise ValueError(f"--classes needs distinct, non-empty names, got {','.join(self.classes)!r}.")
        if self.spacing is not None and (len(self.spacing) != 3 or min(self.spacing) <= 0):
            raise ValueError(f"--spacing needs three positive values X,Y,Z in mm, got {self.spacing}.")
        if len(self.window) != 2 or self.window[0] >= self.window[1]:
            raise ValueError(f"--window needs LOW,HIGH with LOW < HIGH, got {self.window}.")
        if self.shape is not None and (len(self.shape) != 3 or min(self.shape) < 1):
            raise ValueError(f"--shape needs three positive sizes D,H,W, got {self.shape}.")


def class_names(text: str) -> tuple[str, ...]:
    """`--classes`: NAME1,NAME2,... (NAME1 is class 1), or a label map JSON file {"name": id, ...} with ids 1..N.

    Raises:
        ValueError: a label map file that is not {"name": id} with ids 1..N (0 may name the background).
    """
    if not text.lower().endswith(".json"):
        return tuple(name.strip() for name in text.split(","))
    import json

    try:
        with open(text) as file:
            mapping = {str(name): int(class_id) for name, class_id in json.load(file).items() if int(class_id) != 0}
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"--classes {text} must be a JSON object {{\"name\": class id}} ({error}).") from None
    if sorted(mapping.values()) != list(range(1, len(mapping) + 1)):
        raise ValueError(f"--classes {text} must number its classes 1..{len(mapping)}, got {sorted(mapping.values())}.")
    return tuple(sorted(mapping, key=mapping.get))


def window_and_scale(volume_hu: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """Clips HU to `window` = (low, high) and maps it linearly onto [0, 1] (float32)."""
    low, high = window
    return ((np.clip(volume_hu, low, high) - low) / (high - low)).astype(np.float32)


def resample(image: sitk.Image, spacing, interpolator, default_value: float, pixel_type) -> sitk.Image:
    """Resamples onto a grid of `spacing` covering the same physical extent, same origin and direction."""
    if spacing is None:
        return sitk.Cast(image, pixel_type)
    size = [max(1, int(round(n * s / t))) for n, s, t in zip(image.GetSize(), image.GetSpacing(), spacing)]
    return sitk.Resample(
        image, size, sitk.Transform(), interpolator, image.GetOrigin(), tuple(spacing), image.GetDirection(),
        default_value, pixel_type,
    )


def crop_or_pad(array: np.ndarray, shape, fill) -> tuple[np.ndarray, np.ndarray]:
    """Centre-crops or pads (D, H, W) `array` to `shape`.

    Returns:
        (array, start): `start` (z, y, x) is the index in the input of output
        voxel (0, 0, 0) — negative where padding was added.
    """
    # Centre; an odd remainder is cropped from, or padded at, the end of the axis.
    start = np.array([(n - t) // 2 if n >= t else -((t - n) // 2) for n, t in zip(array.shape, shape)])
    output = np.full(shape, fill, array.dtype)
    source = tuple(slice(max(s, 0), max(s, 0) + min(t, n - max(s, 0))) for s, t, n in zip(start, shape, array.shape))
    target = tuple(slice(max(-s, 0), max(-s, 0) + (src.stop - src.start)) for s, src in zip(start, source))
    output[target] = array[source]
    return output, start


def _same_geometry(image: sitk.Image, label: sitk.Image) -> str | None:
    if image.GetSize() != label.GetSize():
        return f"label size {label.GetSize()} differs from image size {image.GetSize()}"
    if not np.allclose(image.GetSpacing(), label.GetSpacing(), rtol=1e-3):
        return f"label spacing {label.GetSpacing()} differs from image spacing {image.GetSpacing()}"
    tolerance = 1e-2 * max(image.GetSpacing())
    if not np.allclose(image.GetOrigin(), label.GetOrigin(), atol=tolerance):
        return f"label origin {label.GetOrigin()} differs from image origin {image.GetOrigin()}"
    if not np.allclose(image.GetDirection(), label.GetDirection(), atol=1e-4):
        return "label direction differs from image direction"
    return None


def preprocess_case(case: ct_io.CaseSource, config: CtPreprocessConfig) -> tfrecord_schema.CtRecord:
    """Reads and transforms one case into a `CtRecord`.

    Raises:
        ct_io.CaseError: for anything wrong with this case (read, geometry, values).
    """
    image = ct_io.read_volume(case.image, spacing_tolerance=config.spacing_tolerance)
    values = sitk.GetArrayViewFromImage(image)
    if values.size == 0:
        raise ct_io.CaseError("read", "empty_volume", "the volume has no voxels")
    if not np.isfinite(values).all():
        raise ct_io.CaseError("validate", "non_finite_voxels",
                              f"{int(np.size(values) - np.isfinite(values).sum())} voxels are NaN or infinite")
    if case.label is not None:
        label = ct_io.read_volume(case.label, sitk.sitkUInt8, reference=image, classes=config.classes)
        mismatch = _same_geometry(image, label)
        if mismatch:
            raise ct_io.CaseError("validate", "geometry_mismatch", mismatch)
    else:
        label = sitk.Image(image.GetSize(), sitk.sitkUInt8)
        label.CopyInformation(image)

    image = sitk.DICOMOrient(image, config.orientation)
    label = sitk.DICOMOrient(label, config.orientation)
    image = resample(image, config.spacing, sitk.sitkLinear, AIR_HU, sitk.sitkFloat32)
    label = resample(label, config.spacing, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)

    volume = sitk.GetArrayFromImage(image)  # (D, H, W)
    labels = sitk.GetArrayFromImage(label)  # (D, H, W)
    original_shape = volume.shape
    scaled = window_and_scale(volume, config.window)
    origin = np.array(image.GetOrigin())
    if config.shape is not None:
        scaled, start = crop_or_pad(scaled, config.shape, 0.0)
        labels, _ = crop_or_pad(labels, config.shape, 0)
        # Output voxel 0 sits at input index `start` (z, y, x): move the origin there.
        index_xyz = start[::-1].astype(float)
        direction = np.array(image.GetDirection()).reshape(3, 3)
        origin = origin + direction @ (index_xyz * np.array(image.GetSpacing()))
    return tfrecord_schema.CtRecord(
        case_id=case.case_id,
        source_path=case.image.path,
        image=scaled,
        label=labels,
        spacing=tuple(image.GetSpacing()),
        origin=tuple(origin.tolist()),
        direction=tuple(image.GetDirection()),
        original_shape=tuple(original_shape),
        window=tuple(config.window),
    )
