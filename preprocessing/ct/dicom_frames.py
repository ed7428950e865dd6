"""What one DICOM file holds: the slices its header places in patient space, and its pixels, decoded and rescaled.

A single-frame file holds one slice; a multi-frame (enhanced) file one per
frame, each placed by its functional groups (per-frame first, then shared).
Geometry is checked, never guessed. Compressed transfer syntaxes decode through
pydicom's GDCM and pylibjpeg plug-ins. Ordering the slices of a volume and
stacking them is `dicom_series`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pydicom

from common import dead_letters


@dataclasses.dataclass(frozen=True)
class Frame:
    """One 2-D slice: a single-frame file, or one frame of a multi-frame file (`index` 0-based)."""

    path: str
    index: int | None
    position: tuple[float, float, float]  # ImagePositionPatient, mm
    orientation: tuple[float, ...]  # ImageOrientationPatient: row then column direction cosines
    pixel_spacing: tuple[float, float]  # (row spacing, column spacing) mm
    size: tuple[int, int]  # (rows, columns)

    @property
    def name(self) -> str:
        return self.path if self.index is None else f"{self.path} (frame {self.index + 1})"


def _floats(values, count: int, path: str, field: str) -> tuple[float, ...]:
    try:
        result = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        result = ()
    if len(result) != count:
        raise dead_letters.CaseError("read", "missing_geometry", f"{path} has no valid {field} ({count} numbers expected)")
    return result


def _checked(frame: Frame) -> Frame:
    """The frame, if its geometry is usable: zero or non-finite spacing, direction or position is refused, never guessed.

    Raises:
        CaseError: `invalid_geometry`, naming the file and the field.
    """
    row, column = np.asarray(frame.orientation[:3]), np.asarray(frame.orientation[3:])

    def values(numbers) -> str:  # as DICOM writes multiple values: a\b\c
        return "\\".join(f"{v:g}" for v in numbers)

    problem = None
    if not np.all(np.isfinite(frame.pixel_spacing)) or min(frame.pixel_spacing) <= 0:
        problem = f"PixelSpacing {values(frame.pixel_spacing)}"
    elif (not np.all(np.isfinite(frame.orientation)) or min(np.linalg.norm(row), np.linalg.norm(column)) < 0.5
          or np.linalg.norm(np.cross(row, column)) < 0.5):
        problem = f"ImageOrientationPatient {values(frame.orientation)}"
    elif not np.all(np.isfinite(frame.position)):
        problem = f"ImagePositionPatient {values(frame.position)}"
    if problem:
        raise dead_letters.CaseError("read", "invalid_geometry", f"{frame.name} has {problem}; fullres does not guess "
                                     "geometry, so export the series with its true geometry")
    return frame


def functional_group(group, sequence: str, shared):
    """The first item of functional group `sequence`, per-frame first, then shared; None when neither has it."""
    for source in (group, shared):
        if source is not None and sequence in source and len(source[sequence].value):
            return source[sequence].value[0]
    return None


def frames_of(dataset: pydicom.Dataset, path: str) -> list[Frame]:
    """The slices a header describes: one for a single-frame file, one per frame of an enhanced file.

    Raises:
        CaseError: `missing_geometry`, naming the file and the field.
    """
    per_frame = getattr(dataset, "PerFrameFunctionalGroupsSequence", None)
    if per_frame is None:
        if "ImagePositionPatient" not in dataset or "ImageOrientationPatient" not in dataset or "PixelSpacing" not in dataset:
            raise dead_letters.CaseError("read", "missing_geometry", f"{path} lacks ImagePositionPatient, "
                                      "ImageOrientationPatient or PixelSpacing, so it cannot be placed in a volume")
        return [_checked(Frame(path, None, _floats(dataset.ImagePositionPatient, 3, path, "ImagePositionPatient"),
                               _floats(dataset.ImageOrientationPatient, 6, path, "ImageOrientationPatient"),
                               _floats(dataset.PixelSpacing, 2, path, "PixelSpacing"),
                               (int(dataset.Rows), int(dataset.Columns))))]
    shared = dataset.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in dataset else None
    frames = []
    for index, group in enumerate(per_frame):
        position = functional_group(group, "PlanePositionSequence", shared)
        orientation = functional_group(group, "PlaneOrientationSequence", shared)
        measures = functional_group(group, "PixelMeasuresSequence", shared)
        if position is None or orientation is None or measures is None:
            raise dead_letters.CaseError("read", "missing_geometry", f"frame {index + 1} of {path} has no Plane Position, "
                                      "Plane Orientation or Pixel Measures functional group")
        frames.append(_checked(Frame(path, index, _floats(position.ImagePositionPatient, 3, path, "ImagePositionPatient"),
                                     _floats(orientation.ImageOrientationPatient, 6, path, "ImageOrientationPatient"),
                                     _floats(measures.PixelSpacing, 2, path, "PixelSpacing"),
                                     (int(dataset.Rows), int(dataset.Columns)))))
    return frames


def normal(orientation) -> np.ndarray:
    return np.cross(np.asarray(orientation[:3]), np.asarray(orientation[3:]))


def rescale(dataset: pydicom.Dataset, index: int | None) -> tuple[float, float]:
    """(slope, intercept) of one frame: Pixel Value Transformation (per-frame, then shared), else the top level."""
    if index is not None and "PerFrameFunctionalGroupsSequence" in dataset:
        shared = dataset.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in dataset else None
        transform = functional_group(dataset.PerFrameFunctionalGroupsSequence[index], "PixelValueTransformationSequence", shared)
        if transform is not None:
            return float(getattr(transform, "RescaleSlope", 1.0)), float(getattr(transform, "RescaleIntercept", 0.0))
    return float(getattr(dataset, "RescaleSlope", 1.0)), float(getattr(dataset, "RescaleIntercept", 0.0))


def _check_complete(dataset: pydicom.Dataset, path: str) -> None:
    """Refuses uncompressed pixel data shorter than rows × columns × frames × samples × bits promise (`cut_short`,
    the reason `volume_bytes` gives volume files); compressed data are checked by their decoders."""
    syntax = getattr(getattr(dataset, "file_meta", None), "TransferSyntaxUID", None)
    if "PixelData" not in dataset or syntax is None or syntax.is_compressed:
        return
    try:
        promised = (int(dataset.Rows) * int(dataset.Columns) * int(getattr(dataset, "NumberOfFrames", 1) or 1)
                    * int(getattr(dataset, "SamplesPerPixel", 1) or 1) * int(dataset.BitsAllocated) + 7) // 8
    except (AttributeError, TypeError, ValueError):
        return  # a header without the sizes: decoding names what is missing
    held = len(dataset.PixelData)
    if held < promised:
        raise dead_letters.CaseError("read", "cut_short", f"{path} holds {held:,} of the {promised:,} pixel data bytes "
                                     "its header promises: the file was cut short (a copy or download that stopped), "
                                     "so copy it again from its source")


def _decode(dataset: pydicom.Dataset, path: str) -> np.ndarray:
    """A file's stored pixels as (frames, rows, columns), through pydicom's decoder plug-ins."""
    _check_complete(dataset, path)
    try:
        pixels = dataset.pixel_array
    except Exception as error:  # pydicom and its decoder plug-ins raise many kinds
        syntax = getattr(getattr(dataset, "file_meta", None), "TransferSyntaxUID", None)
        described = f" (transfer syntax {syntax.name})" if syntax is not None else ""
        raise dead_letters.CaseError("read", "unreadable", f"pixel data of {path}{described} cannot be decoded ({error})") from None
    return pixels[None] if pixels.ndim == 2 else pixels  # (frames, H, W)


def read_pixels(path: str) -> tuple[pydicom.Dataset, np.ndarray]:
    try:
        dataset = pydicom.dcmread(path)
    except Exception as error:  # pydicom raises many kinds for corrupt files
        raise dead_letters.CaseError("read", "unreadable", f"{path} cannot be read ({error})") from None
    return dataset, _decode(dataset, path)
