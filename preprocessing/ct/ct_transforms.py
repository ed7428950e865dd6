"""One CT case to one training record: put the label on the image grid, orient, resample, normalize, crop or pad.

Plain functions on SimpleITK images and NumPy arrays, so they are tested
directly and run unchanged inside a Beam `DoFn` on any runner.

This module holds the configuration every case is brought to and runs the
steps on one case (`preprocess_case`); the steps live by job: `intensity` (the
CT window or the z-score, and which one a case gets), `geometry` (the label on
the image grid, resampling, cropping or padding) and `label_maps` (the label's
values checked and counted).
"""

from __future__ import annotations

import dataclasses
import decimal
import logging
import math
import os

import numpy as np
import SimpleITK as sitk

from common import dead_letters
from common import sizes
from preprocessing.ct import ct_io, ct_settings, dicom_series, geometry, intensity, label_maps, volume_header
from preprocessing.records import tfrecord_schema

AIR_HU = -1024.0
LOGGER = logging.getLogger("fullres.preprocess")
# 2**29 voxels: a 512×512 matrix with 2048 slices (the longest routine thin-slice scans) fits; a worker then holds
# about 20 bytes per voxel at its peak (float32 image, its resampled copy, the array and windowed copies, labels),
# some 10 GiB, which is what one worker of an ordinary 4-core, 64 GiB machine (or a Dataflow highmem worker) has.
DEFAULT_MAX_VOXELS = 2**29
# Decoding a volume holds its values as stored and the float32 copy fullres works on (`volume_header.decoded_bytes`).
# 3 GiB: that 512×512×2048 scan stored as int16 (1 GiB + 2 GiB) fits; the same voxels stored as float64 (4 GiB +
# 2 GiB) do not, nor does a 2 MB float64 .nii.gz of zeros that expands to 2.2 GiB of 2.9e8 voxels (3.2 GiB decoded).
DEFAULT_MAX_DECODED_BYTES = 3 * 2**30
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
        max_decoded_bytes: the most bytes one volume of a case may take once decoded
            (its stored type and the float32 working copy), read from the header before
            decompressing; larger volumes are dead letters.
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
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES

    def __post_init__(self):
        if not 0 <= self.spacing_tolerance < 1:
            raise ValueError(f"--spacing-tolerance needs a fraction in [0, 1), e.g. 0.05, got {self.spacing_tolerance}.")
        if len({name.strip().lower() for name in self.classes}) != len(self.classes) or not all(n.strip() for n in self.classes):
            raise ValueError(f"--classes needs distinct, non-empty names, got {','.join(self.classes)!r}.")
        ct_settings.check_grid(self.spacing, self.window, self.shape)  # the one rule, as the text readers apply it
        if self.modality not in intensity.MODALITIES:
            raise ValueError(f"--modality {self.modality!r} is not known; use {', '.join(intensity.MODALITIES)}.")
        if not 0 <= self.max_label <= 255:
            raise ValueError(f"--num-classes must be 1 to 256 (records store class ids as uint8), got {self.max_label + 1}.")
        if self.max_voxels < 1:
            raise ValueError(f"--max-voxels must be positive, got {self.max_voxels}.")
        if self.max_decoded_bytes < 1:
            raise ValueError(f"--max-decoded-bytes must be positive, e.g. 3GiB, got {self.max_decoded_bytes}.")
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


def check_size(case: ct_io.CaseSource, config: CtPreprocessConfig) -> None:
    """Refuses a case from its headers, before any voxel is decompressed (`check_volume` on its image and label).

    Raises:
        dead_letters.CaseError: see `check_volume`.
    """
    for source in (case.image, case.label):
        if source is None or source.dicom_label:  # a DICOM SEG/RTSTRUCT is drawn onto the image's grid
            continue
        spacing = config.spacing if source is case.image else None
        check_volume(source, config.max_voxels, config.max_decoded_bytes, spacing,
                     f" resampled to --spacing {','.join(f'{t:g}' for t in spacing)}" if spacing else "")


def check_volume(source: ct_io.VolumeSource, max_voxels: int, max_decoded_bytes: int,
                 spacing: tuple[float, float, float] | None = None, resampled_to: str = "",
                 holder: str = "each worker") -> None:
    """Refuses one volume from its header: geometry fullres would guess, 4-D, too small, or too large to decode.

    `preprocess ct` (`check_size`) and `predict` (per scan, before reading it) both call this: one rule.

    Args:
        spacing: the grid (x, y, z) mm the volume will be resampled to, if any: its size there is checked too.
        resampled_to: how the sentence names that grid, e.g. " resampled to --spacing 1,1,1".
        holder: what holds the volume in memory ("each worker", "this machine"), for the sentence's advice.

    Raises:
        dead_letters.CaseError: `invalid_geometry`, `four_dimensional`, `not_scalar`, `too_small`
            (`volume_header.check_header`), `too_many_voxels` (as stored or resampled), `too_many_bytes`
            (decoded), or `unreadable`.
    """
    header = volume_header.read_header(source)
    name = volume_header.name_of(source)  # no absolute paths in dead letters
    volume_header.check_header(header, name)
    advice = f"more than --max-voxels {max_voxels:,}; raise --max-voxels if {holder} has about 20 bytes per voxel of memory"
    if header.voxels > max_voxels:
        raise dead_letters.CaseError("read", "too_many_voxels",
                                     f"{name} holds {' x '.join(map(str, header.size))} = {header.voxels:,} voxels, "
                                     f"{advice}")
    if header.decoded_bytes > max_decoded_bytes:
        raise dead_letters.CaseError(
            "read", "too_many_bytes",
            f"{name} holds {' x '.join(map(str, header.size))} {header.stored_type} voxels, "
            f"{sizes.human_bytes(header.decoded_bytes)} once decoded ({header.stored_bytes * header.components} bytes a "
            f"voxel as stored and {volume_header.WORKING_BYTES_PER_VOXEL} as float32), more than --max-decoded-bytes "
            f"{sizes.human_bytes(max_decoded_bytes)}; raise --max-decoded-bytes if {holder} has that memory to spare")
    if spacing is not None:
        along = [max(1.0, n * s / t) for n, s, t in zip(header.size, header.spacing, spacing)]
        if not all(math.isfinite(v) for v in along):  # a grid so fine the count is not even a float
            raise dead_letters.CaseError("read", "too_many_voxels",
                                         f"{name}{resampled_to} would hold more voxels than can be counted, {advice}")
        resampled = [max(1, int(round(v))) for v in along]
        voxels = math.prod(resampled)  # Python's integers: numpy's int64 wrapped around for very fine grids
        if voxels > max_voxels:
            raise dead_letters.CaseError("read", "too_many_voxels",
                                         f"{name}{resampled_to} would hold {' x '.join(_count(n, grouped=False) for n in resampled)} = "
                                         f"{_count(voxels)} voxels, {advice}")
        volume_header.check_minimum(resampled, name, resampled_to)


def _count(number: int, grouped: bool = True) -> str:
    """A count as people read it: the digits (grouped, unless not `grouped`), or (from 10^15) three significant
    digits, however large.

    >>> _count(336_000_000_000), _count(8000, grouped=False), _count(8 * 10**900)
    ('336,000,000,000', '8000', '8.00e+900')
    """
    return (f"{number:,}" if grouped else str(number)) if number < 10**15 else f"{decimal.Decimal(number):.3g}"


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
    normalization, warnings = intensity.choose_normalization(values, modality, intensity.dicom_modality(source))
    background = AIR_HU if normalization == intensity.CT_WINDOW else float(values.min())
    return image, normalization, warnings, background


def preprocess_case(case: ct_io.CaseSource, config: CtPreprocessConfig) -> tfrecord_schema.CtRecord:
    """Reads and transforms one case into a `CtRecord`.

    Raises:
        dead_letters.CaseError: for anything wrong with this case (read, geometry, values).
    """
    check_size(case, config)
    image, normalization, warnings, background = read_scan(case.image, config.modality, config.spacing_tolerance)
    values_read = sitk.GetArrayViewFromImage(image)  # what the scan turned out to be, for summary.json
    modality_seen = intensity.scan_modality(values_read, intensity.dicom_modality(case.image))
    intensity_range = intensity.central_range(values_read)
    raw_image, image = image, sitk.DICOMOrient(image, config.orientation)
    if case.label is not None:
        label = ct_io.read_volume(case.label, sitk.sitkUnknown, reference=raw_image, classes=config.classes)
        label = label_maps.check_label_values(label, case.label.name or case.label.path, config.max_label)
        label_values = tuple(int(v) for v in np.flatnonzero(label_maps.class_counts(sitk.GetArrayViewFromImage(label))))
        label = geometry.label_on_image_grid(image, sitk.DICOMOrient(label, config.orientation))
    else:
        label = sitk.Image(image.GetSize(), sitk.sitkUInt8)
        label.CopyInformation(image)
        label_values = ()

    image = geometry.resample(image, config.spacing, sitk.sitkLinear, background, sitk.sitkFloat32)
    label = geometry.resample(label, config.spacing, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)

    volume = sitk.GetArrayFromImage(image)  # (D, H, W)
    labels = sitk.GetArrayFromImage(label)  # (D, H, W)
    original_shape = volume.shape
    scaled, window, padding = intensity.normalize(volume, normalization, config.window)
    for warning in warnings:
        LOGGER.warning("case %s: %s (%s)", case.case_id, warning, intensity.WARNING_TEXT[warning])
    origin = np.array(image.GetOrigin())
    cropped_voxels = ()
    if config.shape is not None:
        centre = geometry.foreground_centre(labels) if config.crop == "foreground" else None
        before = label_maps.class_counts(labels)
        scaled, start = geometry.crop_or_pad(scaled, config.shape, padding, centre)
        labels, _ = geometry.crop_or_pad(labels, config.shape, 0, centre)
        cut = before - label_maps.class_counts(labels)
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
        modality_seen=modality_seen,
        intensity_range=intensity_range,
    )
