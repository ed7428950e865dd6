"""Finding CT volumes under a file or folder: volume files and DICOM series, sorted into images and label maps.

Volume files (NIfTI, NRRD, MetaImage) take their case id from their name, and
their role (image or label map) from the layouts of `ct_layouts`; DICOM files
are grouped into series (`dicom_grouping`), and DICOM SEG and RTSTRUCT files
are label maps of the series they reference. A file that cannot be used is a
dead letter naming it; it never stops the others.

Hidden files and folders (`._*`, `.DS_Store`, `Thumbs.db`, `__MACOSX/`,
`.ipynb_checkpoints/`: `common.hidden_files`) are never read, and counted.

Inputs stay inside the input: a symbolic link is followed only when it
resolves inside the folder given (or when the user asks, `follow_links`); one
that leads out is left alone and named in a note. A named pipe, socket or
device is never opened (reading one would block): it is a dead letter
(`not_a_file`).
"""

from __future__ import annotations

import dataclasses
import os

from common import dead_letters, hidden_files
from preprocessing.ct import ct_io, ct_layouts, dicom_grouping, dicom_series, volume_bytes

VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd")
# Files that sit next to images but are never images themselves.
IGNORED_SUFFIXES = (".raw", ".zraw", ".json", ".txt", ".md", ".csv")
# The DICOMDIR index a CD or PACS export puts beside the series: the series it lists are read from their own files.
# (The desktops' Thumbs.db and desktop.ini are hidden files: `common.hidden_files`.)
IGNORED_NAMES = frozenset({"dicomdir"})


def case_id_of(path: str) -> str:
    """`images/case7.nii.gz` -> `case7`; a DICOM series directory -> its name."""
    name = os.path.basename(os.path.normpath(path))
    for suffix in VOLUME_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def discover(root: str, spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE, follow_links: bool = False
             ) -> tuple[dict[str, ct_io.VolumeSource], list[dict]]:
    """Finds every image volume under `root` (a file or a directory tree).

    Returns:
        (volumes by case id, dead letters for files that could not be used).
        Label maps named as such (`ct_layouts`) are not images and are left
        out; DICOM SEG and RTSTRUCT files are returned, under `dicom_label`.
    """
    found = find_volumes(root, spacing_tolerance=spacing_tolerance, follow_links=follow_links)
    return {**found.images, **{key: source for key, source in found.labels.items() if source.dicom_label}}, found.dead


@dataclasses.dataclass(frozen=True)
class Found:
    """The volumes under one root, by role and case id (see `find_volumes`)."""

    images: dict[str, ct_io.VolumeSource]
    labels: dict[str, ct_io.VolumeSource]
    layouts: dict[str, str]  # (role, case id) -> the layout its name follows, where one does
    notes: tuple[str, ...]
    dead: list[dict]
    hidden: int = 0  # hidden files and folders left out (`common.hidden_files`)


def find_volumes(root: str, neutral_role: str = ct_layouts.IMAGE, exclude: frozenset[str] = frozenset(),
                 spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE, follow_links: bool = False) -> Found:
    """Finds every volume under `root` and sorts it into images and label maps by its name (`ct_layouts`).

    A DICOM series takes the name of its directory as case id (`dicom_volumes`)
    and the role `neutral_role`; DICOM SEG and RTSTRUCT files are label maps,
    keyed `MODALITY:path` until pairing gives them the case of their series. A
    file given as `root` itself is taken in `neutral_role`.

    Args:
        root: a file or a directory tree.
        neutral_role: the role of volumes whose names do not say (`ct_layouts.IMAGE` or `ct_layouts.LABEL`).
        exclude: absolute real paths of files or directories to leave out (the other side's files).
        spacing_tolerance: see `dicom_series.read_series`.
        follow_links: follow symbolic links that lead outside `root` too (by default they are left alone, and
            named in `notes`).
    """
    if not os.path.exists(root):
        raise FileNotFoundError(f"input {root!r} does not exist; pass a CT file or a directory of CT files.")
    root = os.path.abspath(root)
    listing = _Listing([root], []) if not os.path.isdir(root) else _files_under(root, follow_links)
    files = [path for path in listing.files if not excluded(path, exclude)]
    dead: list[dict] = []
    for path in list(files):
        kind = volume_bytes.special_kind(path)
        if kind is not None:  # never opened: the DICOM grouping below would block on a named pipe
            files.remove(path)
            error = volume_bytes.not_a_file(path, kind)
            dead.append(dead_letters.dead_letter(path, error.stage, error.reason, error.detail))
    other_files: list[str] = []
    volume_files: list[tuple[str, str]] = []
    for path in files:
        lower = path.lower()
        if lower.endswith(VOLUME_SUFFIXES):
            volume_files.append((path, case_id_of(path)))
        elif not lower.endswith(IGNORED_SUFFIXES) and os.path.basename(lower) not in IGNORED_NAMES:
            other_files.append(path)
    if not os.path.isdir(root):
        path, stem = volume_files[0] if volume_files else (None, None)
        named = ct_layouts.name_file(path, stem) if path else None
        classified = ct_layouts.Classified(
            (dataclasses.replace(named, role=neutral_role),) if named and neutral_role == ct_layouts.IMAGE else (),
            (dataclasses.replace(named, role=neutral_role),) if named and neutral_role == ct_layouts.LABEL else ())
    else:
        classified = ct_layouts.classify(volume_files, neutral_role)
    images: dict[str, ct_io.VolumeSource] = {}
    labels: dict[str, ct_io.VolumeSource] = {}
    layouts = {}
    for target, named_files in ((images, classified.images), (labels, classified.labels)):
        for named in named_files:
            if _add(target, dead, named.case_id, ct_io.VolumeSource(named.path)) and named.layout:
                layouts[(named.role, named.case_id)] = named.layout
    neutral = images if neutral_role == ct_layouts.IMAGE else labels
    dicom, dicom_dead = dicom_volumes(other_files, set(neutral), spacing_tolerance)
    dead.extend(dicom_dead)
    for key, source in dicom.items():
        _add(labels if source.dicom_label else neutral, dead, key, source)
    return Found(images, labels, layouts, classified.notes + _link_notes(listing.outside, root), dead, listing.hidden)


def dicom_volumes(paths: list[str], taken: set[str], spacing_tolerance: float
                  ) -> tuple[dict[str, ct_io.VolumeSource], list[dict]]:
    """DICOM series (and SEG/RTSTRUCT files) among `paths`, under case ids unique among themselves and `taken`."""
    groups, label_objects, dead = dicom_grouping.group_files(paths, spacing_tolerance)
    volumes = {
        case_id: ct_io.VolumeSource(group.directory, group.files, group.series_uid, notes=group.notes)
        for case_id, group in zip(dicom_grouping.case_ids(groups, taken), groups)
    }
    for label in label_objects:
        key = f"{label.modality}:{label.path}"  # not a case: pair_with_labels gives it the case of its series
        volumes[key] = ct_io.VolumeSource(label.path, (label.path,), label.referenced_series_uid, label.modality)
    return volumes, dead


@dataclasses.dataclass(frozen=True)
class _Listing:
    files: list[str]  # every file to look at, sorted
    outside: list[str]  # links left alone: they lead outside the root
    hidden: int = 0  # hidden files and folders left out


def _files_under(root: str, follow_links: bool = False) -> _Listing:
    """Every file below `root`, sorted, hidden ones left out (hidden folders not entered); each directory once.

    Links (to folders or files) that resolve inside `root` are followed; those that lead outside it only with
    `follow_links`, and are listed in `outside` otherwise. A link back up the tree is read once.
    """
    inside_root = os.path.realpath(root)
    visited, files, outside, hidden = set(), [], [], 0

    def leads_out(path: str) -> bool:
        return (not follow_links and os.path.islink(path)
                and not excluded(path, frozenset({inside_root})))  # `excluded`: resolves, then compares

    for directory, subdirectories, names in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:  # a link back up the tree, or a second way to the same folder
            subdirectories[:] = []
            continue
        visited.add(real)
        hidden += sum(hidden_files.is_hidden(name) for name in (*subdirectories, *names))
        subdirectories[:] = [name for name in subdirectories if not hidden_files.is_hidden(name)]
        for name in [n for n in subdirectories if leads_out(os.path.join(directory, n))]:
            outside.append(os.path.join(directory, name))
            subdirectories.remove(name)
        for name in names:
            path = os.path.join(directory, name)
            if hidden_files.is_hidden(name):
                continue
            if leads_out(path) and os.path.exists(path):  # a broken link is a file the reader names
                outside.append(path)
                continue
            files.append(path)
    return _Listing(sorted(files), sorted(outside), hidden)


def _link_notes(outside: list[str], root: str) -> tuple[str, ...]:
    """The sentence naming the links that were left alone, relative to `root`; not where they lead: a path outside
    the input may name a patient, and notes reach summary.json and the log."""
    if not outside:
        return ()
    shown = ", ".join(os.path.relpath(path, root) for path in outside[:3])
    more = f" and {len(outside) - 3} more" if len(outside) > 3 else ""
    return (f"{len(outside)} link(s) lead outside the input and were not followed ({shown}{more}); pass "
            "--follow-links to read what they point to",)


def excluded(path: str, exclude: frozenset[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == item or real.startswith(item.rstrip(os.sep) + os.sep) for item in exclude)


def _add(volumes: dict, dead: list, case_id: str, source: ct_io.VolumeSource) -> bool:
    if case_id in volumes:
        dead.append(dead_letters.dead_letter(source.path, "discover", "duplicate_case_id",
                                f"case id {case_id!r} is also used by {volumes[case_id].path}; rename one of them"))
        return False
    volumes[case_id] = source
    return True
