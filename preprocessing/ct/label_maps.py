"""A case's label map as class ids: the names `--classes` gives them, their values checked, voxels counted per class."""

from __future__ import annotations

import os

import numpy as np
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import ct_io
from preprocessing.records import dataset_files


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


def _listed(values) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:8])
    return shown + (f" and {len(values) - 8} more" if len(values) > 8 else "")


def values_in(paths: list[str]) -> list[int]:
    """The class ids the label map files at `paths` hold, together (sorted); a file that cannot be read, or holds
    values that are not class ids, adds none (preprocessing makes it a dead letter that says why).

    Read one at a time, each as stored (no cast that would wrap 256 to 0).
    """
    found: set[int] = set()
    for path in paths:
        try:
            image = ct_io.read_volume(ct_io.VolumeSource(path), sitk.sitkUnknown)  # held: a view does not keep it
        except (dead_letters.CaseError, RuntimeError, OSError):
            continue
        values = np.unique(sitk.GetArrayViewFromImage(image))
        if np.issubdtype(values.dtype, np.floating) and not np.array_equal(values, np.round(values)):
            continue
        found.update(int(v) for v in values if v >= 0)
    return sorted(found)


def class_counts(labels: np.ndarray) -> np.ndarray:
    """Voxels of each class id 0..255 in a (D, H, W) uint8 label array, counted slice by slice (bounded memory)."""
    counts = np.zeros(256, np.int64)
    for plane in labels:
        counts += np.bincount(plane.ravel(), minlength=256)
    return counts
