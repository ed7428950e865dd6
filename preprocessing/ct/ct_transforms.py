"""One CT case to one training record: put the label on the image grid, orient, resample, normalize, crop or pad.

Plain functions on SimpleITK images and NumPy arrays, so they are tested
directly and run unchanged inside a Beam `DoFn` on any runner.

Intensities are normalized by modality. CT is clipped to the HU window and
mapped onto [0, 1] (`ct_window`). MR has no physical unit, so it is not
windowed: it is z-scored per case as nnU-Net does (`zscore`), over the non-zero
voxels when they are under 3/4 of the volume (the background of skull-stripped
or masked scans is exactly 0, and stays 0), else over the whole volume. The
modality comes from `--modality`; with `auto`, from a DICOM series' Modality
tag, and for volume files from the values (`looks_like_hu`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os

import numpy as np
import pydicom
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import ct_io, dicom_series
from preprocessing.records import dataset_files, tfrecord_schema

AIR_HU = -1024.0
MODALITIES = ("auto", "ct", "mr")
CT_WINDOW, ZSCORE = "ct_window", "zscore"
# A label grid within this fraction of a voxel of the image grid is the same grid (nearest neighbour is exact).
GRID_TOLERANCE_VOXELS = 0.1
# Warnings counted in summary.json.
WARNING_NON_HU = "ct_window_on_non_hu_values"
WARNING_MODALITY = "modality_differs_from_dicom"
LOGGER = logging.getLogger("fullres.preprocess")
_WARNING_TEXT = {
    WARNING_NON_HU: "a CT window was applied to values that do not look like Hounsfield units; check --modality "
                    "and the scan's rescale slope/intercept",
    WARNING_MODALITY: "--modality overrides the series' DICOM Modality tag",
}
# 2**29 voxels: a 512×512 matrix with 2048 slices (the longest routine thin-slice scans) fits; a worker then holds
# about 20 bytes per voxel at its peak (float32 image, its resampled copy, the array and windowed copies, labels),
# some 10 GiB, which is what one worker of an ordinary 4-core, 64 GiB machine (or a Dataflow highmem worker) has.
DEFAULT_MAX_VOXELS = 2**29
CROPS = ("center", "foreground")


@dataclasses.dataclass(frozen=True)
class CtPreprocessConfig:
    """How every case is brought to a common grid.

    Args:
        spacing: target voxel spacing in mm, (x, y, z); None keeps each case's own.
        window: HU window (low, high) clipped and mapped onto [0, 1] (CT only).
        shape: target (D, H, W), centre-cropped or padded (with the window's low
            end and background label); None keeps the resampled size.
        orientation: canonical orientation code (DICOM convention, ITK's "LPS"
            gives the identity direction for axis-aligned scans).
        spacing_tolerance: DICOM slice gaps may vary by this fraction of their
            median; beyond it the slices are interpolated onto a uniform grid.
        classes: names of DICOM SEG segments / RTSTRUCT ROIs; name i is class i + 1.
        modality: `ct` (HU window), `mr` (z-score), or `auto` (DICOM's
            Modality tag, else `looks_like_hu`).
        max_label: the largest class id a label map may hold (`--num-classes` - 1;
            255, the most a uint8 record stores, when not given).
        max_voxels: the most voxels a case may have, read from the header before
            decompressing, and after resampling; larger cases are dead letters.
        crop: where `shape` crops: "center" of the volume, or "foreground",
            centred on the labelled voxels' bounding box.

    Example:
        >>> config = CtPreprocessConfig(spacing=(1.5, 1.5, 2.0), window=(-160, 240), shape=(64, 128, 128))
    """

    spacing: tuple[float, float, float] | None = None
    window: tuple[float, float] = (-1000.0, 1000.0)
    shape: tuple[int, int, int] | None = None
    orientation: str = "LPS"
    spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE
    classes: tuple[str, ...] = ()
    modality: str = "auto"
    max_label: int = 255
    max_voxels: int = DEFAULT_MAX_VOXELS
    crop: str = "center"

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
        if self.modality not in MODALITIES:
            raise ValueError(f"--modality {self.modality!r} is not known; use {', '.join(MODALITIES)}.")
        if not 0 <= self.max_label <= 255:
            raise ValueError(f"--num-classes must be 1 to 256 (records store class ids as uint8), got {self.max_label + 1}.")
        if self.max_voxels < 1:
            raise ValueError(f"--max-voxels must be positive, got {self.max_voxels}.")
        if self.crop not in CROPS:
            raise ValueError(f"--crop {self.crop!r} is not known; use center or foreground.")


def preprocessing_record(config: CtPreprocessConfig) -> dict:
    """What a model needs to prepare a new scan as its training data were: recorded in summary.json.

    `fullres train` copies it into the run's model_info.json, and `fullres predict`
    applies exactly this to each scan.
    """
    return {
        "spacing": list(config.spacing) if config.spacing is not None else None,  # (x, y, z) mm
        "orientation": config.orientation,
        "window": list(config.window),  # HU (low, high), CT only
        "modality": config.modality,  # ct: HU window; mr: z-score; auto: decided per scan
        "shape": list(config.shape) if config.shape is not None else None,  # (D, H, W) the model trained on
    }

def class_names(text: str) -> tuple[str, ...]:
    """`--classes`: NAME1,NAME2,... (NAME1 is class 1), or a label map JSON file {"name": id, ...} with ids 1..N.

    The file is read by the one label-map rule (`dataset_files.read_label_map_file`: 0 may name only the
    background); the classes it names must then be numbered 1..N, as the label values are.

    Raises:
        ValueError: a label map file that breaks the rule or skips an id.
    """
    if not text.lower().endswith(".json"):
        return tuple(name.strip() for name in text.split(","))
    try:
        mapping = dataset_files.foreground(dataset_files.read_label_map_file(text, flag="--classes"))
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
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


def crop_or_pad(array: np.ndarray, shape, fill, centre=None) -> tuple[np.ndarray, np.ndarray]:
    """Crops or pads (D, H, W) `array` to `shape`, around the volume's centre or `centre`.

    Args:
        centre: (z, y, x) index (may be fractional) the crop is centred on, moved
            as little as needed to stay inside the volume; None: the volume's centre.
            Axes that are padded are always padded evenly.

    Returns:
        (array, start): `start` (z, y, x) is the index in the input of output
        voxel (0, 0, 0) — negative where padding was added.
    """
    # Centre; an odd remainder is cropped from, or padded at, the end of the axis.
    start = np.array([(n - t) // 2 if n >= t else -((t - n) // 2) for n, t in zip(array.shape, shape)])
    if centre is not None:
        start = np.array([min(max(int(np.floor(c - t / 2 + 0.5)), 0), n - t) if n >= t else s
                          for c, t, n, s in zip(centre, shape, array.shape, start)])
    output = np.full(shape, fill, array.dtype)
    source = tuple(slice(max(s, 0), max(s, 0) + min(t, n - max(s, 0))) for s, t, n in zip(start, shape, array.shape))
    target = tuple(slice(max(-s, 0), max(-s, 0) + (src.stop - src.start)) for s, src in zip(start, source))
    output[target] = array[source]
    return output, start


def looks_like_hu(volume: np.ndarray) -> bool:
    """True if the values look like Hounsfield units: CT, for `--modality auto` on volume files.

    At least 90 % of the voxels lie in [-1100, 3100] HU and the 1st percentile is
    at most -500 HU (air, around the body or in the lungs, is in every CT field
    of view). Voxels at the volume's minimum below -1100 are left out first: the
    padding some scanners write outside the round field of view (-2048, -3024).
    Raw MR (no negative values) and z-scored data fail the air test. A CT
    cropped to air-free tissue fails it too: pass `--modality ct` for those.
    """
    sample = np.asarray(volume).ravel()[:: max(1, volume.size // 1_000_000)]  # a million voxels decide
    low = sample.min()
    if low < -1100:
        sample = sample[sample > low]
    if sample.size == 0:
        return False
    in_range = np.count_nonzero((sample >= -1100) & (sample <= 3100)) / sample.size
    return bool(in_range >= 0.9 and np.percentile(sample, 1) <= -500)


def dicom_modality(source: ct_io.VolumeSource) -> str | None:
    """The Modality tag of a DICOM series (`CT`, `MR`, ...), None for volume files or when it is absent."""
    if not source.is_dicom:
        return None
    try:
        header = pydicom.dcmread(source.dicom_files[0], stop_before_pixels=True, specific_tags=["Modality"])
    except Exception:  # the reader reports unreadable files itself; here the tag is just unknown
        return None
    return str(getattr(header, "Modality", "") or "").upper() or None


def choose_normalization(volume: np.ndarray, modality: str, dicom_tag: str | None) -> tuple[str, tuple[str, ...]]:
    """`ct_window` or `zscore` for one case, and the warnings that come with it.

    Args:
        volume: the case's voxel values as read.
        modality: the `--modality` setting (`auto`, `ct` or `mr`).
        dicom_tag: the series' Modality tag, if it is DICOM.

    Returns:
        (normalization, warnings): `WARNING_NON_HU` when a CT window meets values
        that do not look like HU; `WARNING_MODALITY` when `--modality` overrides a
        different DICOM Modality tag.
    """
    hu = looks_like_hu(volume)
    if modality == "auto":
        kind = {"CT": "ct", "MR": "mr"}.get(dicom_tag or "") or ("ct" if hu else "mr")
    else:
        kind = modality
    warnings = []
    if kind == "ct" and not hu:
        warnings.append(WARNING_NON_HU)
    if modality != "auto" and dicom_tag in ("CT", "MR") and dicom_tag.lower() != modality:
        warnings.append(WARNING_MODALITY)
    return (CT_WINDOW if kind == "ct" else ZSCORE), tuple(warnings)


def zscore(volume: np.ndarray) -> tuple[np.ndarray, tuple[float, float], float]:
    """Z-scores a (D, H, W) volume as nnU-Net does for MR (see the module docstring).

    Returns:
        (normalized float32 volume, (mean, std) used, the value padding gets: the normalized background).
    """
    nonzero = volume != 0
    use_mask = np.count_nonzero(nonzero) < 0.75 * volume.size
    values = volume[nonzero] if use_mask else volume
    if values.size == 0:
        return np.zeros(volume.shape, np.float32), (0.0, 1.0), 0.0
    mean, std = float(values.mean()), float(values.std())
    std = std if std > 1e-8 else 1.0  # a constant volume stays constant instead of dividing by zero
    normalized = ((volume - mean) / std).astype(np.float32)
    if use_mask:
        normalized[~nonzero] = 0.0
        return normalized, (mean, std), 0.0
    return normalized, (mean, std), float((volume.min() - mean) / std)


def normalize(volume: np.ndarray, normalization: str, window: tuple[float, float]):
    """Applies `ct_window` or `zscore` to a (D, H, W) volume.

    Returns:
        (float32 volume, the record's `window` field: the HU window, or the
        z-score's (mean, std), the value padding gets).
    """
    if normalization == CT_WINDOW:
        return window_and_scale(volume, window), tuple(window), 0.0
    return zscore(volume)


def _grid(image: sitk.Image) -> np.ndarray:
    """(4, 4) affine from voxel index (x, y, z) to physical point (mm)."""
    affine = np.eye(4)
    affine[:3, :3] = np.array(image.GetDirection()).reshape(3, 3) @ np.diag(image.GetSpacing())
    affine[:3, 3] = image.GetOrigin()
    return affine


def label_on_image_grid(image: sitk.Image, label: sitk.Image) -> sitk.Image:
    """The label map on the image's voxel grid, when both cover the same physical grid.

    The grids are compared in physical space, so a label stored with its axes
    in another order or flipped (NIfTI from dcm2niix, nibabel, 3D Slicer,
    TotalSegmentator beside a DICOM series) pairs. Callers reorient both to the
    canonical orientation first (`sitk.DICOMOrient`), after which such a label
    has the image's grid and is returned as it is. Otherwise every label voxel
    centre must land within `GRID_TOLERANCE_VOXELS` of an image voxel centre, one
    to one, and the label is resampled onto the image grid by nearest neighbour,
    which only reorders its voxels.

    Raises:
        dead_letters.CaseError: `geometry_mismatch`, naming the difference in mm.
    """
    if (image.GetSize() == label.GetSize() and np.allclose(image.GetSpacing(), label.GetSpacing(), rtol=1e-3)
            and np.allclose(image.GetOrigin(), label.GetOrigin(), atol=1e-2 * max(image.GetSpacing()))
            and np.allclose(image.GetDirection(), label.GetDirection(), atol=1e-4)):
        return label
    to_image = np.linalg.inv(_grid(image)) @ _grid(label)  # label index -> image continuous index
    linear = np.round(to_image[:3, :3])
    signed_permutation = (np.all(np.isin(linear, (-1.0, 0.0, 1.0)))
                          and np.all(np.abs(linear).sum(axis=0) == 1) and np.all(np.abs(linear).sum(axis=1) == 1))
    corners = np.array([[*corner, 1.0] for corner in itertools.product(*[(0, n - 1) for n in label.GetSize()])]).T
    mapped = (to_image @ corners)[:3]  # (3, 8) image indices of the label's corner voxels
    image_corners = {tuple(c) for c in itertools.product(*[(0, n - 1) for n in image.GetSize()])}
    if (signed_permutation and np.abs(mapped - np.round(mapped)).max() <= GRID_TOLERANCE_VOXELS
            and {tuple(int(v) for v in c) for c in np.round(mapped).T} == image_corners):
        return sitk.Resample(label, image, sitk.Transform(), sitk.sitkNearestNeighbor, 0, label.GetPixelID())
    raise dead_letters.CaseError("validate", "geometry_mismatch", describe_grid_mismatch(image, label))


def describe_grid_mismatch(image: sitk.Image, label: sitk.Image) -> str:
    """One sentence on how the label's grid differs from the image's, in mm, after reorienting both to LPS."""
    image, label = sitk.DICOMOrient(image, "LPS"), sitk.DICOMOrient(label, "LPS")
    parts = []
    image_spacing, label_spacing = np.array(image.GetSpacing()), np.array(label.GetSpacing())
    if not np.allclose(image_spacing, label_spacing, rtol=1e-3):
        parts.append(f"label voxels are {_mm(label_spacing)} mm, image voxels {_mm(image_spacing)} mm")
    image_extent = (np.array(image.GetSize()) - 1) * image_spacing
    label_extent = (np.array(label.GetSize()) - 1) * label_spacing
    if np.abs(image_extent - label_extent).max() > GRID_TOLERANCE_VOXELS * image_spacing.min():
        parts.append(f"the label spans {_mm(label_extent)} mm ({'×'.join(map(str, label.GetSize()))} voxels), "
                     f"the image {_mm(image_extent)} mm ({'×'.join(map(str, image.GetSize()))} voxels)")
    shift = np.array(label.GetOrigin()) - np.array(image.GetOrigin())
    if np.linalg.norm(shift) > GRID_TOLERANCE_VOXELS * image_spacing.min():
        parts.append(f"the label's first voxel is {np.linalg.norm(shift):.1f} mm from the image's "
                     f"(x, y, z shift {_mm(shift, ', ')} mm)")
    rotation = np.array(image.GetDirection()).reshape(3, 3).T @ np.array(label.GetDirection()).reshape(3, 3)
    angle = float(np.degrees(np.arccos(np.clip((np.trace(rotation) - 1) / 2, -1.0, 1.0))))
    if angle > 0.1:
        parts.append(f"the label's axes are rotated {angle:.1f}° from the image's")
    return ("the label map does not cover the image's voxel grid: " + "; ".join(parts or ["the grids differ"])
            + "; use the label map made for this image, or resample it onto the image first")


def _mm(values, separator: str = "×") -> str:
    return separator.join(f"{v:.4g}" for v in values)


def foreground_centre(labels: np.ndarray) -> tuple[float, ...] | None:
    """The centre (z, y, x) of the bounding box of the labelled (non-zero) voxels; None if there are none."""
    if not labels.any():
        return None
    centre = []
    for axis in range(labels.ndim):
        present = np.flatnonzero(labels.any(axis=tuple(a for a in range(labels.ndim) if a != axis)))
        centre.append((present[0] + present[-1] + 1) / 2)
    return tuple(centre)


def class_counts(labels: np.ndarray) -> np.ndarray:
    """Voxels of each class id 0..255 in a (D, H, W) uint8 label array, counted slice by slice (bounded memory)."""
    counts = np.zeros(256, np.int64)
    for plane in labels:
        counts += np.bincount(plane.ravel(), minlength=256)
    return counts


def _listed(values) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:8])
    return shown + (f" and {len(values) - 8} more" if len(values) > 8 else "")


def check_label_values(label: sitk.Image, path: str, max_label: int) -> sitk.Image:
    """Refuses a label map whose values are not class ids 0..`max_label`; returns it as uint8.

    Float label maps are accepted when every value is a whole number.

    Raises:
        dead_letters.CaseError: non-integer, negative or too large values, named in the detail.
    """
    values = sitk.GetArrayViewFromImage(label)
    name = os.path.basename(os.path.normpath(path))  # a file, or a DICOM series' folder
    if np.issubdtype(values.dtype, np.floating):
        fractional = values != np.round(values)
        if fractional.any():
            raise dead_letters.CaseError(
                "validate", "non_integer_labels",
                f"label map {name} holds non-integer values {_listed(np.unique(values[fractional]))}; labels must be "
                f"whole class ids 0..{max_label}, not probabilities or interpolated values (resample label maps with "
                "nearest-neighbour interpolation)")
    if values.min() < 0 or values.max() > max_label:
        outside = np.unique(values[(values < 0) | (values > max_label)])
        rule = (f"for --num-classes {max_label + 1}; pass the data's number of classes" if max_label < 255
                else "(class ids; fullres stores at most 256 classes)")
        raise dead_letters.CaseError("validate", "label_out_of_range",
                              f"label map {name} holds values {_listed(outside)}; labels must be integers 0..{max_label} {rule}")
    return sitk.Cast(label, sitk.sitkUInt8)


def check_size(case: ct_io.CaseSource, config: CtPreprocessConfig) -> None:
    """Refuses a case over `config.max_voxels`, from its headers, before any voxel is decompressed.

    Raises:
        dead_letters.CaseError: `too_many_voxels`, with the size found; or `unreadable`.
    """
    advice = f"more than --max-voxels {config.max_voxels:,}; raise --max-voxels if each worker has about 20 bytes per voxel of memory"
    for source in (case.image, case.label):
        if source is None or source.dicom_label:  # a DICOM SEG/RTSTRUCT is drawn onto the image's grid
            continue
        size, spacing = ct_io.read_size(source)
        name = source.name or os.path.basename(os.path.normpath(source.path))  # no absolute paths in dead letters
        voxels = int(np.prod(size, dtype=np.int64))
        if voxels > config.max_voxels:
            raise dead_letters.CaseError("read", "too_many_voxels",
                                  f"{name} holds {' x '.join(map(str, size))} = {voxels:,} voxels, {advice}")
        if source is case.image and config.spacing is not None:
            resampled = [max(1, int(round(n * s / t))) for n, s, t in zip(size, spacing, config.spacing)]
            voxels = int(np.prod(resampled, dtype=np.int64))
            if voxels > config.max_voxels:
                raise dead_letters.CaseError("read", "too_many_voxels",
                                      f"{name} resampled to --spacing {','.join(f'{t:g}' for t in config.spacing)} "
                                      f"would hold {' x '.join(map(str, resampled))} = {voxels:,} voxels, {advice}")



def read_scan(source: ct_io.VolumeSource, modality: str, spacing_tolerance: float
              ) -> tuple[sitk.Image, str, tuple[str, ...], float]:
    """Reads one scan, checks its voxels and chooses its normalization (`preprocess ct` and `predict` alike).

    Returns:
        (image as read, normalization, its warnings, the value outside the scan: air for CT, the minimum otherwise).

    Raises:
        dead_letters.CaseError: unreadable, empty or non-finite scans.
    """
    image = ct_io.read_volume(source, spacing_tolerance=spacing_tolerance)
    values = sitk.GetArrayViewFromImage(image)
    if values.size == 0:
        raise dead_letters.CaseError("read", "empty_volume", "the volume has no voxels")
    if not np.isfinite(values).all():
        raise dead_letters.CaseError("validate", "non_finite_voxels",
                              f"{int(np.size(values) - np.isfinite(values).sum())} voxels are NaN or infinite")
    normalization, warnings = choose_normalization(values, modality, dicom_modality(source))
    background = AIR_HU if normalization == CT_WINDOW else float(values.min())
    return image, normalization, warnings, background


def preprocess_case(case: ct_io.CaseSource, config: CtPreprocessConfig) -> tfrecord_schema.CtRecord:
    """Reads and transforms one case into a `CtRecord`.

    Raises:
        dead_letters.CaseError: for anything wrong with this case (read, geometry, values).
    """
    check_size(case, config)
    image, normalization, warnings, background = read_scan(case.image, config.modality, config.spacing_tolerance)
    raw_image, image = image, sitk.DICOMOrient(image, config.orientation)
    if case.label is not None:
        label = ct_io.read_volume(case.label, sitk.sitkUnknown, reference=raw_image, classes=config.classes)
        label = check_label_values(label, case.label.name or case.label.path, config.max_label)
        label_values = tuple(int(v) for v in np.flatnonzero(class_counts(sitk.GetArrayViewFromImage(label))))
        label = label_on_image_grid(image, sitk.DICOMOrient(label, config.orientation))
    else:
        label = sitk.Image(image.GetSize(), sitk.sitkUInt8)
        label.CopyInformation(image)
        label_values = ()

    image = resample(image, config.spacing, sitk.sitkLinear, background, sitk.sitkFloat32)
    label = resample(label, config.spacing, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)

    volume = sitk.GetArrayFromImage(image)  # (D, H, W)
    labels = sitk.GetArrayFromImage(label)  # (D, H, W)
    original_shape = volume.shape
    scaled, window, padding = normalize(volume, normalization, config.window)
    for warning in warnings:
        LOGGER.warning("case %s: %s (%s)", case.case_id, warning, _WARNING_TEXT[warning])
    origin = np.array(image.GetOrigin())
    cropped_voxels = ()
    if config.shape is not None:
        centre = foreground_centre(labels) if config.crop == "foreground" else None
        before = class_counts(labels)
        scaled, start = crop_or_pad(scaled, config.shape, padding, centre)
        labels, _ = crop_or_pad(labels, config.shape, 0, centre)
        cut = before - class_counts(labels)
        cropped_voxels = tuple((int(c), int(cut[c])) for c in np.flatnonzero(cut) if c > 0)
        # Output voxel 0 sits at input index `start` (z, y, x): move the origin there.
        index_xyz = start[::-1].astype(float)
        direction = np.array(image.GetDirection()).reshape(3, 3)
        origin = origin + direction @ (index_xyz * np.array(image.GetSpacing()))
    return tfrecord_schema.CtRecord(
        case_id=case.case_id,
        source_path=case.image.name or os.path.basename(case.image.path),
        image=scaled,
        label=labels,
        spacing=tuple(image.GetSpacing()),
        origin=tuple(origin.tolist()),
        direction=tuple(image.GetDirection()),
        original_shape=tuple(original_shape),
        window=window,
        normalization=normalization,
        warnings=warnings,
        label_values=label_values,
        cropped_voxels=cropped_voxels,
    )
