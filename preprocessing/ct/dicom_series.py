"""DICOM as scanners and PACS write it: grouping files into volumes, and reading them.

Files are grouped by SeriesInstanceUID, then by orientation, frame of
reference and image size, so a localizer that shares its series' UID becomes
a group of its own (set aside and noted) instead of spoiling the series. A file
that repeats another one (same position, same pixels) is dropped and noted;
two files at one position with different pixels refuse the series, naming both.
A multi-frame (enhanced) file is one volume of its own, read from its
functional groups. Compressed transfer syntaxes decode through pydicom's GDCM
and pylibjpeg plug-ins.

Slices are ordered by their position along the slice normal, never by file
name or InstanceNumber. Gaps that vary by up to `spacing_tolerance` (scanners
round positions) are taken as uniform; beyond it (a missing slice, a variable
pitch) the slices are interpolated linearly onto a uniform grid at the median
gap, from their true positions, and the case carries a `slices_resampled` note.

Example:
    >>> groups, label_objects, dead = group_files(["series/IM1.dcm", "series/IM2.dcm"])  # doctest: +SKIP
    >>> image = read_series(groups[0].files)  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re

import numpy as np
import pydicom
import SimpleITK as sitk

from common import dead_letters

DEFAULT_SPACING_TOLERANCE = 0.05
LABEL_MODALITIES = ("SEG", "RTSTRUCT")
_ORIENTATION_DECIMALS = 3  # ImageOrientationPatient written by different tools differs in the 4th decimal


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


@dataclasses.dataclass(frozen=True)
class SeriesGroup:
    """The files of one volume, ready to be read, with what grouping did to them.

    `notes` are (source, reason, detail) triples: files set aside or dropped,
    slices that will be resampled. They do not fail the case.
    """

    directory: str
    files: tuple[str, ...]
    series_uid: str
    series_number: str
    modality: str
    notes: tuple[tuple[str, str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class LabelObject:
    """A DICOM SEG or RTSTRUCT file and the SeriesInstanceUID of the images it labels."""

    path: str
    modality: str  # "SEG" or "RTSTRUCT"
    referenced_series_uid: str


def is_label_object(header: pydicom.Dataset) -> bool:
    return str(getattr(header, "Modality", "")).upper() in LABEL_MODALITIES


def _floats(values, count: int, path: str, field: str) -> tuple[float, ...]:
    try:
        result = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        result = ()
    if len(result) != count:
        raise dead_letters.CaseError("read", "missing_geometry", f"{path} has no valid {field} ({count} numbers expected)")
    return result


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
        return [Frame(path, None, _floats(dataset.ImagePositionPatient, 3, path, "ImagePositionPatient"),
                      _floats(dataset.ImageOrientationPatient, 6, path, "ImageOrientationPatient"),
                      _floats(dataset.PixelSpacing, 2, path, "PixelSpacing"),
                      (int(dataset.Rows), int(dataset.Columns)))]
    shared = dataset.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in dataset else None
    frames = []
    for index, group in enumerate(per_frame):
        position = functional_group(group, "PlanePositionSequence", shared)
        orientation = functional_group(group, "PlaneOrientationSequence", shared)
        measures = functional_group(group, "PixelMeasuresSequence", shared)
        if position is None or orientation is None or measures is None:
            raise dead_letters.CaseError("read", "missing_geometry", f"frame {index + 1} of {path} has no Plane Position, "
                                      "Plane Orientation or Pixel Measures functional group")
        frames.append(Frame(path, index, _floats(position.ImagePositionPatient, 3, path, "ImagePositionPatient"),
                            _floats(orientation.ImageOrientationPatient, 6, path, "ImageOrientationPatient"),
                            _floats(measures.PixelSpacing, 2, path, "PixelSpacing"),
                            (int(dataset.Rows), int(dataset.Columns))))
    return frames


def _normal(orientation) -> np.ndarray:
    return np.cross(np.asarray(orientation[:3]), np.asarray(orientation[3:]))


def _along_normal(frames: list[Frame]) -> np.ndarray:
    return np.array([f.position for f in frames]) @ _normal(frames[0].orientation)


def slice_grid(along: np.ndarray, tolerance: float) -> tuple[float, bool]:
    """The slice step of sorted positions `along` (mm) and whether they must be resampled to it.

    The step is the median gap; the positions are uniform when every gap is
    within `tolerance` (a fraction) of it.
    """
    gaps = np.diff(along)
    step = float(np.median(gaps))
    return step, bool(np.abs(gaps - step).max() > tolerance * step + 1e-3)


def _rescale(dataset: pydicom.Dataset, index: int | None) -> tuple[float, float]:
    """(slope, intercept) of one frame: Pixel Value Transformation (per-frame, then shared), else the top level."""
    if index is not None and "PerFrameFunctionalGroupsSequence" in dataset:
        shared = dataset.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in dataset else None
        transform = functional_group(dataset.PerFrameFunctionalGroupsSequence[index], "PixelValueTransformationSequence", shared)
        if transform is not None:
            return float(getattr(transform, "RescaleSlope", 1.0)), float(getattr(transform, "RescaleIntercept", 0.0))
    return float(getattr(dataset, "RescaleSlope", 1.0)), float(getattr(dataset, "RescaleIntercept", 0.0))


def _decode(dataset: pydicom.Dataset, path: str) -> np.ndarray:
    """A file's stored pixels as (frames, rows, columns), through pydicom's decoder plug-ins."""
    try:
        pixels = dataset.pixel_array
    except Exception as error:  # pydicom and its decoder plug-ins raise many kinds
        syntax = getattr(getattr(dataset, "file_meta", None), "TransferSyntaxUID", None)
        described = f" (transfer syntax {syntax.name})" if syntax is not None else ""
        raise dead_letters.CaseError("read", "unreadable", f"pixel data of {path}{described} cannot be decoded ({error})") from None
    return pixels[None] if pixels.ndim == 2 else pixels  # (frames, H, W)


def _read_pixels(path: str) -> tuple[pydicom.Dataset, np.ndarray]:
    try:
        dataset = pydicom.dcmread(path)
    except Exception as error:  # pydicom raises many kinds for corrupt files
        raise dead_letters.CaseError("read", "unreadable", f"{path} cannot be read ({error})") from None
    return dataset, _decode(dataset, path)


def _drop_identical(frames: list[Frame], along: np.ndarray) -> tuple[list[Frame], list[tuple[str, str, str]]]:
    """Drops files that repeat another file's position and pixels; refuses a position with different pixels.

    Returns:
        (frames left, `duplicate_file` notes naming each dropped file).

    Raises:
        CaseError: `duplicate_slice`, naming both files, when their pixels differ.
    """
    order = np.argsort(along, kind="stable")
    kept, notes = [order[0]], []
    step = float(np.median(np.abs(np.diff(np.sort(along))))) if len(along) > 1 else 1.0
    for index in order[1:]:
        previous = kept[-1]
        if abs(along[index] - along[previous]) > 1e-3 * max(step, 1e-3):
            kept.append(index)
            continue
        first, second = frames[previous], frames[index]
        same = first.index is None and second.index is None and _same_pixels(first.path, second.path)
        if not same:
            raise dead_letters.CaseError("read", "duplicate_slice", f"{first.name} and {second.name} lie at the same "
                                      "position with different pixels; remove the one that does not belong to the series")
        notes.append((second.path, "duplicate_file", f"{second.path} repeats {first.path} (same position and pixels); "
                                                     "it was left out"))
    kept.sort()
    return [frames[i] for i in kept], notes


def _same_pixels(first: str, second: str) -> bool:
    (a, pixels_a), (b, pixels_b) = _read_pixels(first), _read_pixels(second)
    return pixels_a.shape == pixels_b.shape and np.array_equal(pixels_a, pixels_b) and _rescale(a, None) == _rescale(b, None)


def group_files(
    paths: list[str], spacing_tolerance: float = DEFAULT_SPACING_TOLERANCE
) -> tuple[list[SeriesGroup], list[LabelObject], list[dict]]:
    """Groups DICOM files into volumes (headers only; pixels only to compare files at one position).

    Returns:
        (volumes, SEG/RTSTRUCT label objects, dead letters). Each dead letter
        names the file or files at fault.
    """
    groups, headers, labels, dead = _index(paths)
    by_series: dict[str, list[tuple]] = collections.defaultdict(list)
    for key in groups:
        by_series[key[0]].append(key)
    volumes: list[SeriesGroup] = []
    for _, keys in sorted(by_series.items()):
        series_volumes, series_dead = _series_volumes([groups[key] for key in keys], headers, spacing_tolerance)
        volumes.extend(series_volumes)
        dead.extend(series_dead)
    return volumes, labels, dead


def _index(paths: list[str]) -> tuple[dict[tuple, list[Frame]], dict[str, pydicom.Dataset], list[LabelObject], list[dict]]:
    """Reads headers: frames keyed by (series UID, orientation, frame of reference, size, multi-frame file), label objects."""
    groups: dict[tuple, list[Frame]] = collections.defaultdict(list)
    headers, labels, dead = {}, [], []
    for path in paths:
        try:
            header = pydicom.dcmread(path, stop_before_pixels=True)
            uid = str(header.SeriesInstanceUID)
            if is_label_object(header):
                labels.append(LabelObject(path, str(header.Modality).upper(), referenced_series_uid(header)))
                continue
            frames = frames_of(header, path)
        except dead_letters.CaseError as error:
            dead.append(dead_letters.dead_letter(path, "discover", error.reason, error.detail))
            continue
        except Exception as error:  # pydicom raises many kinds for non-DICOM or corrupt files
            dead.append(dead_letters.dead_letter(path, "discover", "unreadable", f"not a readable DICOM or volume file ({error})"))
            continue
        headers[path] = header
        multi_frame = frames[0].index is not None  # an enhanced file is a volume of its own
        for frame in frames:
            key = (uid, tuple(np.round(frame.orientation, _ORIENTATION_DECIMALS) + 0.0),
                   str(getattr(header, "FrameOfReferenceUID", "")), frame.size, path if multi_frame else "")
            groups[key].append(frame)
    return groups, headers, labels, dead


def _series_volumes(groups: list[list[Frame]], headers: dict[str, pydicom.Dataset], spacing_tolerance: float
                    ) -> tuple[list[SeriesGroup], list[dict]]:
    """The volumes of one SeriesInstanceUID; lone slices beside the main group (localizers, strays) are set aside."""
    groups = sorted(groups, key=lambda frames: (-len(frames), frames[0].path))  # the largest group is the series
    main_orientation = np.round(groups[0][0].orientation, _ORIENTATION_DECIMALS)
    volumes, set_aside, dead = [], [], []
    for frames in groups:
        header = headers[frames[0].path]
        files = tuple(sorted({f.path for f in frames}))
        if len(frames) < 2 and len(groups) > 1:
            localizer = "LOCALIZER" in [str(v).upper() for v in getattr(header, "ImageType", [])] or not np.array_equal(
                np.round(frames[0].orientation, _ORIENTATION_DECIMALS), main_orientation)
            set_aside.append((files[0], "localizer" if localizer else "stray_file",
                              f"{files[0]} shares its SeriesInstanceUID with other files but not their orientation, frame "
                              "of reference or size, and is a single slice; it was left out"))
            continue
        if len(frames) < 2:
            dead.append(dead_letters.dead_letter(files[0], "discover", "too_few_slices",
                                               f"{files[0]} holds the only slice of its series; a volume needs at least 2"))
            continue
        try:
            frames, notes = _drop_identical(frames, _along_normal(frames))
        except dead_letters.CaseError:
            notes = []  # two different slices at one position: reading refuses the case, naming both files
        files = tuple(sorted({f.path for f in frames}))
        directory = os.path.dirname(files[0])
        along = np.sort(_along_normal(frames))
        step, resample = slice_grid(along, spacing_tolerance) if len(frames) > 1 else (0.0, False)
        if resample:
            notes.append((directory, "slices_resampled", f"slice gaps of {directory} range from {np.diff(along).min():.3g} "
                          f"to {np.diff(along).max():.3g} mm, beyond the {spacing_tolerance:.0%} tolerance; slices were "
                          f"interpolated onto a {step:.3g} mm grid"))
        volumes.append(SeriesGroup(directory, files, str(header.SeriesInstanceUID), str(getattr(header, "SeriesNumber", "")),
                                   str(getattr(header, "Modality", "")), tuple(notes)))
    if volumes:
        volumes[0] = dataclasses.replace(volumes[0], notes=volumes[0].notes + tuple(set_aside))
    else:
        dead.extend(dead_letters.dead_letter(source, "discover", reason, detail) for source, reason, detail in set_aside)
    return volumes, dead


def referenced_series_uid(header: pydicom.Dataset) -> str:
    """The SeriesInstanceUID a SEG (ReferencedSeriesSequence) or RTSTRUCT (RTReferencedSeriesSequence) labels."""
    try:
        if str(header.Modality).upper() == "SEG":
            return str(header.ReferencedSeriesSequence[0].SeriesInstanceUID)
        frame_of_reference = header.ReferencedFrameOfReferenceSequence[0]
        return str(frame_of_reference.RTReferencedStudySequence[0].RTReferencedSeriesSequence[0].SeriesInstanceUID)
    except (AttributeError, IndexError):
        field = "ReferencedSeriesSequence" if str(header.Modality).upper() == "SEG" else \
            "ReferencedFrameOfReferenceSequence > RTReferencedStudySequence > RTReferencedSeriesSequence"
        raise dead_letters.CaseError("discover", "missing_reference", f"{header.Modality} has no {field}, so the series "
                                  "it labels is unknown; pair it through a manifest CSV instead") from None


def case_ids(groups: list[SeriesGroup], taken: set[str] = frozenset()) -> list[str]:
    """A readable, unique case id per group, never built from patient attributes.

    The id is the directory's name when it holds one volume; otherwise the
    directory's name and the SeriesNumber (`ct-s3`); where that still collides
    (with another group or with `taken`), as many characters of the end of the
    SeriesInstanceUID as make it unique.
    """
    per_directory = collections.Counter(g.directory for g in groups)
    ids = []
    for group in groups:
        base = os.path.basename(os.path.normpath(group.directory))
        if per_directory[group.directory] > 1:
            number = re.sub(r"[^0-9A-Za-z]+", "", group.series_number)
            base = f"{base}-s{number}" if number else base
        ids.append(base)
    bases = list(ids)
    counts = collections.Counter([*bases, *taken])
    for position, group in enumerate(groups):
        if counts[bases[position]] == 1:
            continue
        uid = re.sub(r"[^0-9]", "", group.series_uid)
        others = {re.sub(r"[^0-9]", "", g.series_uid) for g, b in zip(groups, bases) if b == bases[position]} - {uid}
        length = 8
        while length < len(uid) and any(other.endswith(uid[-length:]) for other in others):
            length += 1
        ids[position] = f"{bases[position]}-{uid[-length:]}"
    # Groups of one series UID (enhanced files of one series, stacks of several orientations): numbered in order.
    seen = collections.Counter()
    for position, case_id in enumerate(list(ids)):
        seen[case_id] += 1
        if seen[case_id] > 1:
            ids[position] = f"{case_id}-{seen[case_id]}"
    return ids


@dataclasses.dataclass(frozen=True)
class SliceStack:
    """The slices of one volume in the order of its z axis, and the grid they lie on.

    `frames` are sorted by their position along the slice normal (`along`, mm),
    never by file name or InstanceNumber. The volume's slice k lies at
    `along[0] + k * step`; `volume_slices` says on which slice each frame lies.
    """

    frames: tuple[Frame, ...]
    along: tuple[float, ...]  # each frame's position along the slice normal, ascending, mm
    step: float  # slice spacing of the volume, mm
    resampled: bool  # the gaps vary beyond the tolerance: the volume is interpolated onto a uniform grid

    @property
    def depth(self) -> int:
        """The number of slices of the volume read from these frames."""
        if not self.resampled:
            return len(self.frames)
        return int(round((self.along[-1] - self.along[0]) / self.step)) + 1

    def volume_slices(self) -> list[int]:
        """The volume slice of each frame: its rank, or the nearest grid slice where the volume is resampled."""
        if not self.resampled:
            return list(range(len(self.frames)))
        return [int(round((along - self.along[0]) / self.step)) for along in self.along]

    def geometry(self) -> tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, ...]]:
        """(spacing, origin, direction) of the volume, as SimpleITK takes them: x along rows, y along columns, z the normal."""
        orientation = np.asarray(self.frames[0].orientation)
        row_spacing, column_spacing = self.frames[0].pixel_spacing
        # ITK direction: row-major 3×3 whose columns are the x (row), y (column) and z (normal) axes.
        direction = np.stack([orientation[:3], orientation[3:], _normal(orientation)], axis=1).reshape(-1)
        return (column_spacing, row_spacing, self.step), self.frames[0].position, tuple(direction.tolist())


def slice_stack(frames: list[Frame], spacing_tolerance: float = DEFAULT_SPACING_TOLERANCE) -> SliceStack:
    """Orders the frames of one volume along the slice normal, as `read_series` stacks them.

    Files that repeat another one (same position, same pixels) are left out.

    Raises:
        CaseError: too few slices, inconsistent orientation or size, or two
            different slices at one position; the detail names the files.
    """
    if len(frames) < 2:
        files = sorted({frame.path for frame in frames})
        raise dead_letters.CaseError("read", "too_few_slices",
                                  f"{', '.join(files)} hold {len(frames)} slice; a volume needs at least 2")
    for frame in frames[1:]:
        if np.abs(np.subtract(frame.orientation, frames[0].orientation)).max() > 1e-4:
            raise dead_letters.CaseError("read", "inconsistent_orientation", f"{frame.name} and {frames[0].name} have "
                                      "different ImageOrientationPatient; keep one orientation per series folder")
        if frame.size != frames[0].size:
            raise dead_letters.CaseError("read", "inconsistent_slice_shape", f"{frame.name} has {frame.size} rows×columns, "
                                      f"{frames[0].name} has {frames[0].size}")
    frames, _ = _drop_identical(frames, _along_normal(frames))
    along = _along_normal(frames)
    order = np.argsort(along, kind="stable")
    frames, along = [frames[i] for i in order], along[order]
    step, resample = slice_grid(along, spacing_tolerance)
    return SliceStack(tuple(frames), tuple(float(v) for v in along), step, resample)


def read_series(files: tuple[str, ...], spacing_tolerance: float = DEFAULT_SPACING_TOLERANCE) -> sitk.Image:
    """Reads the files of one volume into a float32 image (rescaled: HU for CT) with its patient-space geometry.

    Raises:
        CaseError: unreadable or undecodable files, too few slices, inconsistent
            orientation or size, or two different slices at one position; the
            detail names the files.
    """
    datasets, frames = {}, []
    for path in files:
        try:
            datasets[path] = pydicom.dcmread(path)
        except Exception as error:  # pydicom raises many kinds for corrupt files
            raise dead_letters.CaseError("read", "unreadable", f"{path} cannot be read ({error})") from None
        frames.extend(frames_of(datasets[path], path))
    stack = slice_stack(frames, spacing_tolerance)
    slices, decoded = [], {}
    for frame in stack.frames:
        if frame.path not in decoded:
            decoded[frame.path] = _decode(datasets[frame.path], frame.path)
        slope, intercept = _rescale(datasets[frame.path], frame.index)
        slices.append(decoded[frame.path][frame.index or 0].astype(np.float32) * slope + intercept)
    volume = np.stack(slices)  # (D, H, W)
    if stack.resampled:
        volume = _interpolate_slices(volume, np.asarray(stack.along), stack.step)
    spacing, origin, direction = stack.geometry()
    image = sitk.GetImageFromArray(volume)  # (D, H, W)
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(direction)
    return image
def _interpolate_slices(volume: np.ndarray, along: np.ndarray, step: float) -> np.ndarray:
    """Linear interpolation of (D, H, W) slices at sorted positions `along` onto a uniform grid of `step` mm."""
    count = int(round((along[-1] - along[0]) / step)) + 1
    targets = along[0] + step * np.arange(count)
    upper = np.clip(np.searchsorted(along, targets, side="right"), 1, len(along) - 1)
    lower = upper - 1
    weight = np.clip((targets - along[lower]) / (along[upper] - along[lower]), 0.0, 1.0).astype(np.float32)
    return volume[lower] * (1 - weight)[:, None, None] + volume[upper] * weight[:, None, None]  # (count, H, W)
