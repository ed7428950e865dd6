"""Intensities by modality: a CT window in Hounsfield units, or a z-score for MR, and which one a case gets.

CT is clipped to the HU window and mapped onto [0, 1] (`ct_window`). MR has no
physical unit, so it is not windowed: it is z-scored per case as nnU-Net does
(`zscore`), over the non-zero voxels when they are under 3/4 of the volume (the
background of skull-stripped or masked scans is exactly 0, and stays 0), else
over the whole volume. The modality comes from `--modality`; with `auto`, from a
DICOM series' Modality tag, and for volume files from the values (`looks_like_hu`).
"""

from __future__ import annotations

import numpy as np
import pydicom

from preprocessing.ct import ct_io

MODALITIES = ("auto", "ct", "mr")
CT_WINDOW, ZSCORE = "ct_window", "zscore"
# Warnings counted in summary.json.
WARNING_NON_HU = "ct_window_on_non_hu_values"
WARNING_MODALITY = "modality_differs_from_dicom"
WARNING_TEXT = {
    WARNING_NON_HU: "a CT window was applied to values that do not look like Hounsfield units; check --modality "
                    "and the scan's rescale slope/intercept",
    WARNING_MODALITY: "--modality overrides the series' DICOM Modality tag",
}


def window_and_scale(volume_hu: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """Clips HU to `window` = (low, high) and maps it linearly onto [0, 1] (float32)."""
    low, high = window
    return ((np.clip(volume_hu, low, high) - low) / (high - low)).astype(np.float32)


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


def scan_modality(volume: np.ndarray, dicom_tag: str | None) -> str:
    """What a scan turned out to be: its DICOM Modality tag (`CT`, `MR`, `PT`, ...) where it has one, else from its
    values, as `--modality auto` decides: `CT` when they look like Hounsfield units (`looks_like_hu`), else `MR`.

    Recorded per training scan in summary.json (`data_modality`) and checked by `fullres predict` on each new scan.

    >>> scan_modality(np.full((2, 2, 2), 100.0), "MR")
    'MR'
    """
    return dicom_tag or ("CT" if looks_like_hu(volume) else "MR")


def central_range(volume: np.ndarray) -> tuple[float, float]:
    """The 1st and 99th percentiles of a scan's values as read (HU for CT): the intensities it mostly holds.

    A million voxels decide, as in `looks_like_hu`.

    >>> central_range(np.arange(1001.0))
    (10.0, 990.0)
    """
    sample = np.asarray(volume).ravel()[:: max(1, volume.size // 1_000_000)]
    low, high = np.percentile(sample, (1, 99))
    return float(low), float(high)


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
