"""Clinical label formats: a DICOM SEG or RTSTRUCT as the label map of the series it references.

Both are turned into a uint8 label map on the grid of the image they label.
Segment labels (SEG) and ROI names (RTSTRUCT) become class ids through the
class names the user gives (`--classes liver,kidney`: liver is 1, kidney 2);
a name outside that list refuses the case, naming it and the fix. Where
segments overlap, the higher class id wins.

SEG is read with highdicom, which decodes the frames and their plane
positions; each frame is placed on the image slice at its position.

RTSTRUCT contours are rasterised here: a voxel belongs to a contour when its
centre lies inside the polygon (even-odd rule, so a contour inside another on
the same slice is a hole, as RTSTRUCT writers encode holes). rt-utils was
considered and left out: it reads the image series again from a folder on its
own (single-frame, uncompressed only), so it cannot use the grid this reader
built from multi-frame, compressed or resampled series; it fills polygons with
OpenCV on integer-rounded vertices, which shifts boundaries by up to half a
pixel and includes edge pixels; and it pulls in the full OpenCV build.

Example:
    >>> label = read_label("rt.dcm", "RTSTRUCT", image, ("liver", "kidney"))  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pydicom
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import dicom_frames


def class_ids(names: list[str], classes: tuple[str, ...], path: str, kind: str) -> list[int]:
    """Class id of each segment/ROI name; refuses names `classes` lacks (compared without case)."""
    index = {name.strip().lower(): i + 1 for i, name in enumerate(classes)}
    unknown = sorted({name for name in names if name.strip().lower() not in index})
    if unknown:
        known = f"the classes given are {', '.join(classes)}" if classes else "no --classes were given"
        raise dead_letters.CaseError("read", "unknown_segment", f"{kind} {path} names {', '.join(map(repr, unknown))} but "
                              f"{known}; list every name in --classes (e.g. --classes {','.join([*classes, *unknown])})")
    return [index[name.strip().lower()] for name in names]


def read_label(path: str, modality: str, reference: sitk.Image, classes: tuple[str, ...]) -> sitk.Image:
    """Reads a SEG or RTSTRUCT file as a uint8 label map on `reference`'s grid."""
    label = np.zeros(sitk.GetArrayViewFromImage(reference).shape, np.uint8)  # (D, H, W)
    masks = _seg_masks(path, reference) if modality == "SEG" else _rtstruct_masks(path, reference)
    ids = class_ids([name for name, _ in masks], classes, path, modality)
    for class_id, (_, mask) in sorted(zip(ids, masks), key=lambda item: item[0]):
        label[mask] = class_id
    image = sitk.GetImageFromArray(label)
    image.CopyInformation(reference)
    return image


def _slice_index(reference: sitk.Image, point, source: str, corner: bool = False) -> int:
    """The reference slice a plane at `point` (mm) lies on; refuses planes between slices or outside the volume.

    With `corner`, `point` must also be the slice's first pixel (a SEG frame covers the whole slice).
    """
    continuous = reference.TransformPhysicalPointToContinuousIndex(tuple(float(v) for v in point))
    index = int(round(continuous[2]))
    off_corner = corner and max(abs(continuous[0]), abs(continuous[1])) > 0.25
    if abs(continuous[2] - index) > 0.25 or not 0 <= index < reference.GetSize()[2] or off_corner:
        raise dead_letters.CaseError("read", "geometry_mismatch", f"{source} lies at index {tuple(round(v, 2) for v in continuous)} "
                              "of the image it references, not on one of its slices; export the label on the image's grid")
    return index


def _seg_masks(path: str, reference: sitk.Image) -> list[tuple[str, np.ndarray]]:
    import highdicom

    try:
        segmentation = highdicom.seg.segread(path)
    except Exception as error:  # highdicom raises many kinds for files it cannot parse
        raise dead_letters.CaseError("read", "unreadable", f"SEG {path} cannot be read by highdicom ({error})") from None
    shape = sitk.GetArrayViewFromImage(reference).shape  # (D, H, W)
    if (int(segmentation.Rows), int(segmentation.Columns)) != shape[1:]:
        raise dead_letters.CaseError("read", "geometry_mismatch", f"SEG {path} frames are {segmentation.Rows}×"
                              f"{segmentation.Columns}, the image slices {shape[1]}×{shape[2]}")
    masks = {number: np.zeros(shape, bool) for number in segmentation.get_segment_numbers()}
    shared = segmentation.SharedFunctionalGroupsSequence[0]
    first_frame = segmentation.PerFrameFunctionalGroupsSequence[0]
    plane = dicom_frames.functional_group(first_frame, "PlaneOrientationSequence", shared)
    orientation = np.asarray([float(v) for v in plane.ImageOrientationPatient])
    direction = np.asarray(reference.GetDirection()).reshape(3, 3)
    if np.abs(orientation - np.concatenate([direction[:, 0], direction[:, 1]])).max() > 1e-3:
        raise dead_letters.CaseError("read", "geometry_mismatch", f"SEG {path} frames are oriented {orientation.round(3).tolist()}, "
                              "unlike the image slices it references; export the SEG on the image's grid")
    for index, group in enumerate(segmentation.PerFrameFunctionalGroupsSequence):
        number = int(group.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
        position = dicom_frames.functional_group(group, "PlanePositionSequence", shared).ImagePositionPatient
        z = _slice_index(reference, position, f"frame {index + 1} of SEG {path}", corner=True)
        masks[number][z] |= np.asarray(segmentation.get_frame(index + 1)) >= 0.5  # binary 1, fractional ≥ half
    return [(segmentation.get_segment_description(number).segment_label, mask) for number, mask in masks.items()]


def _rtstruct_masks(path: str, reference: sitk.Image) -> list[tuple[str, np.ndarray]]:
    try:
        structure = pydicom.dcmread(path)
        names = {int(roi.ROINumber): str(roi.ROIName) for roi in structure.StructureSetROISequence}
        contours = list(structure.ROIContourSequence)
    except Exception as error:  # a malformed structure set raises many kinds
        raise dead_letters.CaseError("read", "unreadable", f"RTSTRUCT {path} cannot be read ({error})") from None
    shape = sitk.GetArrayViewFromImage(reference).shape  # (D, H, W)
    masks = []
    for roi in contours:
        mask = np.zeros(shape, bool)
        for contour in getattr(roi, "ContourSequence", []):
            if str(getattr(contour, "ContourGeometricType", "CLOSED_PLANAR")).upper() not in ("CLOSED_PLANAR",):
                continue  # points and open polylines mark no area
            points = np.asarray([float(v) for v in contour.ContourData]).reshape(-1, 3)  # (N, 3) mm
            indices = np.array([reference.TransformPhysicalPointToContinuousIndex(tuple(p)) for p in points])  # (N, 3) x, y, z
            z = _slice_index(reference, points[0], f"a contour of ROI {names.get(int(roi.ReferencedROINumber))!r} in {path}")
            mask[z] ^= polygon_mask(indices[:, :2], shape[1:])
        masks.append((names.get(int(roi.ReferencedROINumber), f"ROI {roi.ReferencedROINumber}"), mask))
    return masks


def polygon_mask(vertices: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Pixels of a (rows, columns) grid whose centres lie inside a polygon (even-odd rule).

    Args:
        vertices: (N, 2) continuous (column, row) indices; pixel (r, c) has its centre at (c, r).
        shape: (rows, columns).
    """
    mask = np.zeros(shape, bool)
    if len(vertices) < 3:
        return mask
    low = np.clip(np.floor(vertices.min(axis=0)).astype(int), 0, None)
    high = np.minimum(np.ceil(vertices.max(axis=0)).astype(int) + 1, shape[::-1])
    if np.any(high <= low):
        return mask
    rows, columns = np.mgrid[low[1]:high[1], low[0]:high[0]]  # (h, w) each
    inside = np.zeros(rows.shape, bool)
    x0, y0 = vertices[:, 0], vertices[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    for ax, ay, bx, by in zip(x0, y0, x1, y1):
        if ay == by:
            continue  # a horizontal edge crosses no row of centres
        crosses = (ay > rows) != (by > rows)
        at = ax + (rows - ay) * (bx - ax) / (by - ay)
        inside ^= crosses & (columns < at)
    mask[low[1]:high[1], low[0]:high[0]] = inside
    return mask
