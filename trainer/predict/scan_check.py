"""Does a new scan look like the scans the model was trained on? Its modality and the range of its values.

`fullres preprocess ct` records what its scans turned out to be (summary.json's
`data_modality`: each scan's DICOM Modality, else CT or MR from its values, and
the range their values mostly lie in); `fullres train` copies that into
model_info.json. `fullres predict` describes each new scan the same way
(`intensity.scan_modality`, `intensity.central_range`) and says so when it does
not match: a CT model on an MR scan returns a confident, meaningless mask.

The intensity range is checked for models trained on CT only: Hounsfield units
mean the same on every scanner, so a CT scan whose values lie mostly outside
the training scans' (a wrong rescale slope or intercept, a scan stored raw) is
suspect; MR values have no unit and are z-scored per scan, so their range says
nothing.
"""

from __future__ import annotations

import numpy as np

from preprocessing.ct import intensity

MODALITY_MISMATCH, INTENSITY_MISMATCH = "modality_mismatch", "intensity_mismatch"
# A CT scan is out of range when less than this fraction of its central range (1st to 99th percentile) lies within
# the training scans' (their lowest 1st to highest 99th percentile).
MIN_OVERLAP = 0.5


def _described(modalities: dict[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(modalities.items(), key=lambda item: -item[1]))


def mismatches(values: np.ndarray, dicom_tag: str | None, data_modality: dict | None) -> list[tuple[str, str]]:
    """(reason, one sentence) for each way a scan differs from the model's training scans; [] when it matches.

    Args:
        values: the scan's voxels as read (HU for CT).
        dicom_tag: its DICOM Modality tag, None for volume files.
        data_modality: model_info.json's `data_modality` (`{"modalities": {"CT": 12}, "intensity_range": [lo, hi]}`);
            None checks nothing.

    Example:
        >>> mr = np.full((4, 4, 4), 300.0)
        >>> mismatches(mr, "MR", {"modalities": {"CT": 6}, "intensity_range": [-1024, 1460]})[0][0]
        'modality_mismatch'
    """
    if not data_modality or not data_modality.get("modalities"):
        return []
    trained = data_modality["modalities"]
    modality = intensity.scan_modality(values, dicom_tag)
    if modality not in trained:
        basis = ("its DICOM Modality tag" if dicom_tag else
                 "its values look like Hounsfield units" if modality == "CT" else
                 "its values do not look like Hounsfield units")
        return [(MODALITY_MISMATCH,
                 f"the scan is {modality} ({basis}) but the model was trained on {_described(trained)} scans, so its "
                 f"mask is likely wrong; predict it with a model trained on {modality} scans")]
    known = data_modality.get("intensity_range")
    if set(trained) != {"CT"} or not known:
        return []
    low, high = intensity.central_range(values)
    trained_low, trained_high = known
    inside = max(0.0, min(high, trained_high) - max(low, trained_low)) / max(high - low, 1e-6)
    if inside >= MIN_OVERLAP:
        return []
    return [(INTENSITY_MISMATCH,
             f"the scan's values lie mostly in {low:.0f}..{high:.0f} but the model's CT training scans' in "
             f"{trained_low:.0f}..{trained_high:.0f} HU ({inside:.0%} overlap), so its mask is likely wrong; check the "
             "scan's rescale slope and intercept")]
