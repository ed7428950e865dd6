"""DICOM files as scanners and PACS write them, grouped into volumes, each under a readable case id.

Files are grouped by SeriesInstanceUID, then by orientation, frame of
reference and image size, so a localizer that shares its series' UID becomes
a group of its own (set aside and noted) instead of spoiling the series. A file
that repeats another one (same position, same pixels) is dropped and noted;
two files at one position with different pixels refuse the series, naming both.
A multi-frame (enhanced) file is one volume of its own. DICOM SEG and RTSTRUCT
files are not volumes: they are label objects, with the series they reference.
Reading a group's files is `dicom_series.read_series`.

Example:
    >>> groups, label_objects, dead = group_files(["series/IM1.dcm", "series/IM2.dcm"])  # doctest: +SKIP
    >>> image = dicom_series.read_series(groups[0].files)  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re

import numpy as np
import pydicom

from common import dead_letters
from preprocessing.ct import dicom_frames, dicom_series, geometry

LABEL_MODALITIES = ("SEG", "RTSTRUCT")
_ORIENTATION_DECIMALS = 3  # ImageOrientationPatient written by different tools differs in the 4th decimal


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


MEDIA_STORAGE_DIRECTORY = "1.2.840.10008.1.3.10"  # the SOP class of a DICOMDIR


def is_label_object(header: pydicom.Dataset) -> bool:
    return str(getattr(header, "Modality", "")).upper() in LABEL_MODALITIES


def group_files(
    paths: list[str], spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE
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


def _index(paths: list[str]
           ) -> tuple[dict[tuple, list[dicom_frames.Frame]], dict[str, pydicom.Dataset], list[LabelObject], list[dict]]:
    """Reads headers: frames keyed by (series UID, orientation, frame of reference, size, multi-frame file), label objects."""
    groups: dict[tuple, list[dicom_frames.Frame]] = collections.defaultdict(list)
    headers, labels, dead = {}, [], []
    for path in paths:
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            dead.append(dead_letters.dead_letter(path, "discover", "empty_file", "the file is empty (0 bytes): a copy or "
                                                 "download that never wrote it; copy it again from its source"))
            continue
        try:
            header = pydicom.dcmread(path, stop_before_pixels=True)
            if MEDIA_STORAGE_DIRECTORY in (str(getattr(header, "SOPClassUID", "")),
                                           str(getattr(getattr(header, "file_meta", None), "MediaStorageSOPClassUID", ""))):
                continue  # a DICOMDIR index under another name: the series it lists are read from their own files
            uid = str(header.SeriesInstanceUID)
            if is_label_object(header):
                labels.append(LabelObject(path, str(header.Modality).upper(), referenced_series_uid(header)))
                continue
            frames = dicom_frames.frames_of(header, path)
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


def _series_volumes(groups: list[list[dicom_frames.Frame]], headers: dict[str, pydicom.Dataset], spacing_tolerance: float
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
        if len(frames) < geometry.MIN_VOXELS_PER_AXIS:
            dead.append(dead_letters.dead_letter(files[0], "discover", "too_few_slices",
                                               f"{files[0]} holds the only slice of its series; a volume needs at least "
                                               f"{geometry.MIN_VOXELS_PER_AXIS}"))
            continue
        try:
            frames, notes = dicom_series.drop_identical(frames, dicom_series.along_normal(frames))
        except dead_letters.CaseError:
            notes = []  # two different slices at one position: reading refuses the case, naming both files
        files = tuple(sorted({f.path for f in frames}))
        directory = os.path.dirname(files[0])
        along = np.sort(dicom_series.along_normal(frames))
        step, resample = dicom_series.slice_grid(along, spacing_tolerance) if len(frames) > 1 else (0.0, False)
        if resample:
            notes.append((directory, "slices_resampled", f"slice gaps of {directory} range from {np.diff(along).min():.3g} "
                          f"to {np.diff(along).max():.3g} mm, beyond the {spacing_tolerance:.0%} tolerance; slices were "
                          f"interpolated onto a {step:.3g} mm grid"))
        number = getattr(header, "SeriesNumber", None)  # absent, or present and empty (None): no number to show
        volumes.append(SeriesGroup(directory, files, str(header.SeriesInstanceUID), "" if number is None else str(number),
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
