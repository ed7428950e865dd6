"""Finding and reading CT cases: DICOM series, NIfTI, NRRD and MetaImage, with label maps.

A *case* is one image volume (a volume file, or the files of one DICOM series)
and, optionally, its label map. Reading uses SimpleITK for volume files;
DICOM series (grouping, multi-frame, compressed files, uneven slices) are
`preprocessing.ct.dicom_series`, DICOM SEG and RTSTRUCT labels `preprocessing.ct.dicom_labels`.

Every problem with one case raises `CaseError(stage, reason, detail)`, which the
pipeline turns into a dead-letter record; it never stops other cases.
"""

from __future__ import annotations

import csv
import dataclasses
import os

import nibabel
import numpy as np
import SimpleITK as sitk

from preprocessing.ct import ct_layouts, dicom_labels, dicom_series
from common import dead_letters

VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd")
# Files that sit next to images but are never images themselves.
IGNORED_SUFFIXES = (".raw", ".zraw", ".json", ".txt", ".md", ".csv")



@dataclasses.dataclass(frozen=True)
class VolumeSource:
    """Where one volume comes from: a volume file, the files of a DICOM series, or a DICOM SEG/RTSTRUCT.

    `series_uid` is a DICOM series' SeriesInstanceUID, or the one a SEG/RTSTRUCT
    (`dicom_label` names which) references. `notes` are (source, reason,
    detail) triples about files discovery dropped or slices to be resampled.
    """

    path: str  # the file, or the series' directory
    dicom_files: tuple[str, ...] = ()
    series_uid: str = ""
    dicom_label: str = ""  # "SEG" or "RTSTRUCT"
    notes: tuple[tuple[str, str, str], ...] = ()
    name: str = ""  # how outputs name it: the path relative to the input root, or a pseudonym (`identifiers`)

    @property
    def is_dicom(self) -> bool:
        return bool(self.dicom_files) and not self.dicom_label


@dataclasses.dataclass(frozen=True)
class CaseSource:
    """An image volume and (optionally) its label map, under one case id."""

    case_id: str
    image: VolumeSource
    label: VolumeSource | None = None


def case_id_of(path: str) -> str:
    """`images/case7.nii.gz` -> `case7`; a DICOM series directory -> its name."""
    name = os.path.basename(os.path.normpath(path))
    for suffix in VOLUME_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def discover(root: str, spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE
             ) -> tuple[dict[str, VolumeSource], list[dict]]:
    """Finds every image volume under `root` (a file or a directory tree).

    Returns:
        (volumes by case id, dead letters for files that could not be used).
        Label maps named as such (`ct_layouts`) are not images and are left
        out; DICOM SEG and RTSTRUCT files are returned, under `dicom_label`.
    """
    found = find_volumes(root, spacing_tolerance=spacing_tolerance)
    return {**found.images, **{key: source for key, source in found.labels.items() if source.dicom_label}}, found.dead


@dataclasses.dataclass(frozen=True)
class Found:
    """The volumes under one root, by role and case id (see `find_volumes`)."""

    images: dict[str, VolumeSource]
    labels: dict[str, VolumeSource]
    layouts: dict[str, str]  # (role, case id) -> the layout its name follows, where one does
    notes: tuple[str, ...]
    dead: list[dict]


def find_volumes(root: str, neutral_role: str = ct_layouts.IMAGE, exclude: frozenset[str] = frozenset(),
                 spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE) -> Found:
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
    """
    if not os.path.exists(root):
        raise FileNotFoundError(f"input {root!r} does not exist; pass a CT file or a directory of CT files.")
    root = os.path.abspath(root)
    files = [root] if os.path.isfile(root) else _files_under(root)
    files = [path for path in files if not _excluded(path, exclude)]
    dead: list[dict] = []
    other_files: list[str] = []
    volume_files: list[tuple[str, str]] = []
    for path in files:
        lower = path.lower()
        if lower.endswith(VOLUME_SUFFIXES):
            volume_files.append((path, case_id_of(path)))
        elif not lower.endswith(IGNORED_SUFFIXES):
            other_files.append(path)
    if os.path.isfile(root):
        path, stem = volume_files[0] if volume_files else (None, None)
        named = ct_layouts.name_file(path, stem) if path else None
        classified = ct_layouts.Classified(
            (dataclasses.replace(named, role=neutral_role),) if named and neutral_role == ct_layouts.IMAGE else (),
            (dataclasses.replace(named, role=neutral_role),) if named and neutral_role == ct_layouts.LABEL else ())
    else:
        classified = ct_layouts.classify(volume_files, neutral_role)
    images: dict[str, VolumeSource] = {}
    labels: dict[str, VolumeSource] = {}
    layouts = {}
    for target, named_files in ((images, classified.images), (labels, classified.labels)):
        for named in named_files:
            if _add(target, dead, named.case_id, VolumeSource(named.path)) and named.layout:
                layouts[(named.role, named.case_id)] = named.layout
    neutral = images if neutral_role == ct_layouts.IMAGE else labels
    dicom, dicom_dead = dicom_volumes(other_files, set(neutral), spacing_tolerance)
    dead.extend(dicom_dead)
    for key, source in dicom.items():
        _add(labels if source.dicom_label else neutral, dead, key, source)
    return Found(images, labels, layouts, classified.notes, dead)


def dicom_volumes(paths: list[str], taken: set[str], spacing_tolerance: float
                  ) -> tuple[dict[str, VolumeSource], list[dict]]:
    """DICOM series (and SEG/RTSTRUCT files) among `paths`, under case ids unique among themselves and `taken`."""
    groups, label_objects, dead = dicom_series.group_files(paths, spacing_tolerance)
    volumes = {
        case_id: VolumeSource(group.directory, group.files, group.series_uid, notes=group.notes)
        for case_id, group in zip(dicom_series.case_ids(groups, taken), groups)
    }
    for label in label_objects:
        key = f"{label.modality}:{label.path}"  # not a case: pair_with_labels gives it the case of its series
        volumes[key] = VolumeSource(label.path, (label.path,), label.referenced_series_uid, label.modality)
    return volumes, dead


def _files_under(root: str) -> list[str]:
    """Every file below `root`, sorted, hidden ones left out; directory symlinks are followed, each directory once."""
    visited, files = set(), []
    for directory, subdirectories, names in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:  # a link back up the tree, or a second way to the same folder
            subdirectories[:] = []
            continue
        visited.add(real)
        files.extend(os.path.join(directory, name) for name in names if not name.startswith("."))
    return sorted(files)


def _excluded(path: str, exclude: frozenset[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == item or real.startswith(item.rstrip(os.sep) + os.sep) for item in exclude)


def _add(volumes: dict, dead: list, case_id: str, source: VolumeSource) -> bool:
    if case_id in volumes:
        dead.append(dead_letters.dead_letter(source.path, "discover", "duplicate_case_id",
                                f"case id {case_id!r} is also used by {volumes[case_id].path}; rename one of them"))
        return False
    volumes[case_id] = source
    return True


@dataclasses.dataclass(frozen=True)
class Pairing:
    """Cases with their label maps, the inputs that could not be paired, and how the pairs were found.

    Attributes:
        cases: the cases to convert.
        dead: dead letters for files that could not be paired (each names its file).
        layout: how images and labels were paired: `nnunet`, `msd`, `kits`,
            `side_by_side`, `same_names` (a labels folder with the images' names),
            `manifest`, or `unlabelled`; several joined by `+`.
        notes: files a layout names but that were not converted, one sentence per kind.
        roots: absolute input and labels locations (for relative names in outputs).
    """

    cases: list[CaseSource]
    dead: list[dict]
    layout: str
    notes: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()


def pair(input_path: str, labels: str | None = None,
         spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE) -> Pairing:
    """Finds the cases under `input_path` and pairs each with its label map.

    Label maps come from the names under `input_path` (the layouts of
    `ct_layouts`), from DICOM SEG/RTSTRUCT files (the case of the series they
    reference), from a `labels` folder (same case ids), or from a manifest CSV
    (`image,label` rows). A file is never paired with itself, and a label map
    is never a case. Once any case has a label map, a case without one is a
    dead letter.

    Raises:
        FileNotFoundError: `input_path` or `labels` does not exist.
        ValueError: `labels` is the input folder but no file name there says
            which files are label maps; or the manifest has no header.
    """
    input_real = os.path.realpath(input_path)
    roots = (os.path.abspath(input_path),) + ((os.path.abspath(labels),) if labels is not None else ())
    if labels is not None and os.path.isfile(labels) and labels.lower().endswith(".csv"):
        rows = _manifest_rows(labels)
        label_files = frozenset(os.path.realpath(label) for _, image, label in rows
                                if os.path.realpath(label) != os.path.realpath(image))
        found = find_volumes(input_path, exclude=label_files, spacing_tolerance=spacing_tolerance)
        dead = list(found.dead)
        by_manifest = _match_manifest(labels, rows, found.images, dead)
        by_case, ambiguous = _merge_labels([found.labels, by_manifest], found.images, dead)
        cases, pair_dead = _match(_without(found.images, ambiguous), by_case, f"manifest {labels}")
        return Pairing(cases, dead + pair_dead, "manifest", found.notes, roots)
    if labels is not None and not os.path.exists(labels):
        raise FileNotFoundError(f"--labels {labels!r} does not exist; pass a folder of label maps or a manifest CSV.")
    if labels is None or os.path.realpath(labels) == input_real:
        found = find_volumes(input_path, spacing_tolerance=spacing_tolerance)
        if labels is not None and found.images and not found.labels:
            raise ValueError(
                f"--labels {labels} is the --input folder, and no file name there says which files are label maps; "
                "put the label maps in a folder of their own with the images' file names, name them like "
                "CASE_label.nii.gz beside CASE_image.nii.gz (or _seg/_mask beside _img/_ct), or pass a manifest CSV "
                "with image,label rows as --labels.")
        if not found.labels:
            return Pairing([CaseSource(case_id, source) for case_id, source in sorted(found.images.items())],
                           list(found.dead), "unlabelled", found.notes, roots)
        dead = list(found.dead)
        by_case, ambiguous = _merge_labels([found.labels], found.images, dead)
        cases, pair_dead = _match(_without(found.images, ambiguous), by_case, input_path, found.layouts)
        return Pairing(cases, dead + pair_dead, _layout_name(cases, found.layouts, "same_names"), found.notes, roots)
    labels_real = os.path.realpath(labels)
    # One location may hold the other (labels/ inside the input, or the input inside the labels' folder):
    # each side leaves the other's files out, so no file is both an image and a label map.
    input_inside_labels = _excluded(input_real, frozenset({labels_real}))
    found = find_volumes(input_path, exclude=frozenset() if input_inside_labels else frozenset({labels_real}),
                         spacing_tolerance=spacing_tolerance)
    label_found = find_volumes(labels, ct_layouts.LABEL, exclude=frozenset({input_real}),
                               spacing_tolerance=spacing_tolerance)
    dead = found.dead + label_found.dead
    # Label maps named as such beside the images count too; two for one case are refused.
    by_case, ambiguous = _merge_labels([label_found.labels, found.labels], found.images, dead)
    layouts = {**label_found.layouts, **found.layouts}
    cases, pair_dead = _match(_without(found.images, ambiguous), by_case, labels, layouts)
    return Pairing(cases, dead + pair_dead, _layout_name(cases, layouts, "same_names"),
                   found.notes + label_found.notes, roots)


def _merge_labels(sources: list[dict[str, VolumeSource]], images: dict[str, VolumeSource], dead: list
                  ) -> tuple[dict[str, VolumeSource], set[str]]:
    """Label maps by case id from several places; a case with two is a dead letter naming both files.

    Returns:
        (label maps by case id, the case ids that had more than one).
    """
    by_case: dict[str, VolumeSource] = {}
    ambiguous: set[str] = set()
    for labels in sources:
        others, dicom_by_case, dicom_dead = _dicom_labels_by_case(labels, images)
        dead.extend(dicom_dead)
        for group in (others, dicom_by_case):
            for case_id, source in sorted(group.items()):
                if case_id in ambiguous:
                    continue
                if case_id in by_case:
                    dead.append(dead_letters.dead_letter(source.path, "pair", "ambiguous_label",
                                            f"case {case_id!r} has two label maps, {source.path} and "
                                            f"{by_case[case_id].path}; keep one of them"))
                    ambiguous.add(case_id)
                    del by_case[case_id]
                else:
                    by_case[case_id] = source
    return by_case, ambiguous


def _without(images: dict[str, VolumeSource], case_ids: set[str]) -> dict[str, VolumeSource]:
    return {case_id: source for case_id, source in images.items() if case_id not in case_ids}


def _layout_name(cases: list[CaseSource], layouts: dict, default: str) -> str:
    names = {layouts.get((ct_layouts.IMAGE, c.case_id)) or layouts.get((ct_layouts.LABEL, c.case_id)) or default
             for c in cases}
    return "+".join(sorted(names)) or default


def pair_with_labels(images: dict[str, VolumeSource], labels: str | None) -> tuple[list[CaseSource], list[dict]]:
    """Pairs images (as `discover` returns them) with label maps from a directory or a manifest CSV.

    DICOM SEG/RTSTRUCT files among `images` label the case of their series.

    Returns:
        (cases, dead letters): an image without a label is a dead letter when
        labels were asked for; a label without an image is reported too.
    """
    images, in_input, dead = _dicom_labels_by_case(images, images)
    if labels is None:
        return [CaseSource(case_id, source, in_input.get(case_id)) for case_id, source in sorted(images.items())], dead
    if os.path.isfile(labels) and labels.lower().endswith(".csv"):
        found = _match_manifest(labels, _manifest_rows(labels), images, dead)
        where = f"manifest {labels}"
    else:
        exclude = frozenset(os.path.realpath(source.path) for source in images.values())
        label_found = find_volumes(labels, ct_layouts.LABEL, exclude=exclude)
        found, where = label_found.labels, labels
        dead.extend(label_found.dead)
    by_case, ambiguous = _merge_labels([in_input, found], images, dead)
    cases, pair_dead = _match(_without(images, ambiguous), by_case, where)
    return cases, dead + pair_dead


def _dicom_labels_by_case(volumes: dict[str, VolumeSource], images: dict[str, VolumeSource]
                          ) -> tuple[dict[str, VolumeSource], dict[str, VolumeSource], list[dict]]:
    """Takes DICOM SEG/RTSTRUCT files out of `volumes` and keys them by the case id of the series they reference.

    Returns:
        (the other volumes, labels by case id, dead letters for labels whose
        series is not among `images` or that share a series with another label).
    """
    by_uid = {source.series_uid: case_id for case_id, source in images.items() if source.is_dicom}
    others, by_case, dead = {}, {}, []
    for key, source in volumes.items():
        if not source.dicom_label:
            others[key] = source
            continue
        case_id = by_uid.get(source.series_uid)
        if case_id is None:
            dead.append(dead_letters.dead_letter(source.path, "pair", "missing_image", f"{source.dicom_label} {source.path} labels "
                                    f"series {source.series_uid}, which is not among the input images"))
        elif case_id in by_case:
            dead.append(dead_letters.dead_letter(source.path, "pair", "duplicate_label", f"{source.path} and {by_case[case_id].path} "
                                    f"both label case {case_id!r}; keep one of them"))
        else:
            by_case[case_id] = source
    return others, by_case, dead


def _match(images: dict[str, VolumeSource], labels: dict[str, VolumeSource], where: str,
           layouts: dict | None = None) -> tuple[list[CaseSource], list[dict]]:
    """Cases for the images with a label map of the same case id; dead letters for the rest."""
    dead: list[dict] = []
    cases = []
    for case_id, source in sorted(images.items()):
        label = labels.get(case_id)
        if label is None:
            dead.append(dead_letters.dead_letter(source.path, "pair", "missing_label", f"no label map for case {case_id!r} in {where}"))
        elif os.path.realpath(label.path) == os.path.realpath(source.path):
            dead.append(dead_letters.dead_letter(source.path, "pair", "label_is_image",
                                    f"{source.path} would be the label map of itself (case {case_id!r}); give the "
                                    "case its own label map"))
        else:
            cases.append(CaseSource(case_id, source, label))
    for case_id in sorted(set(labels) - set(images)):
        dead.append(dead_letters.dead_letter(labels[case_id].path, "pair", "missing_image",
                                f"label map {labels[case_id].path} of case {case_id!r} has no image"))
    return cases, dead


def _manifest_rows(path: str) -> list[tuple[str, str, str]]:
    """(where, absolute image path, absolute label path) per row; paths are relative to the manifest's folder."""
    base = os.path.dirname(os.path.abspath(path))
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        if reader.fieldnames is None or not {"image", "label"} <= set(reader.fieldnames):
            raise ValueError(f"manifest {path} needs a header row with the columns image,label.")
        return [(f"{path}:{line}", os.path.abspath(os.path.join(base, row["image"])),
                 os.path.abspath(os.path.join(base, row["label"]))) for line, row in enumerate(reader, start=2)]


def _match_manifest(path: str, rows, images: dict[str, VolumeSource], dead: list) -> dict[str, VolumeSource]:
    """Label maps by case id from manifest rows; rows naming no input image, or one file twice, are dead letters."""
    by_image_path = {os.path.abspath(source.path): case_id for case_id, source in images.items()}
    by_case = {}
    for where, image_path, label_path in rows:
        case_id = by_image_path.get(image_path)
        if os.path.realpath(image_path) == os.path.realpath(label_path):
            dead.append(dead_letters.dead_letter(where, "pair", "label_is_image",
                                    f"manifest row names {image_path} as both image and label map; give it its own label map"))
        elif case_id is None:
            dead.append(dead_letters.dead_letter(where, "pair", "missing_image",
                                    f"manifest image {image_path} is not among the input images"))
        else:
            by_case[case_id] = VolumeSource(label_path)
    return by_case


def read_volume(source: VolumeSource, pixel_type=sitk.sitkFloat32, *, reference: sitk.Image | None = None,
                spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE,
                classes: tuple[str, ...] = ()) -> sitk.Image:
    """Reads a volume file, DICOM series or DICOM SEG/RTSTRUCT as a SimpleITK image (HU for CT).

    Args:
        reference: the image a DICOM SEG/RTSTRUCT label is rasterised onto.
        spacing_tolerance: see `dicom_series.read_series`.
        classes: segment/ROI names of DICOM labels; name i is class i + 1.

    Raises:
        dead_letters.CaseError: unreadable file, a DICOM series with two different slices at
            one position, or a SEG/RTSTRUCT naming a segment not in `classes`.
    """
    if source.dicom_label:
        if reference is None:
            raise dead_letters.CaseError("read", "unpaired_label", f"{source.path} is a DICOM {source.dicom_label}, which labels an "
                            "image series; give it together with that series")
        return dicom_labels.read_label(source.path, source.dicom_label, reference, classes)
    if source.is_dicom:
        return dicom_series.read_series(source.dicom_files, spacing_tolerance)
    try:
        image = sitk.ReadImage(source.path, pixel_type)
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    if source.path.lower().endswith((".nii", ".nii.gz")):
        _check_nifti_finite(source.path)
    return image


def read_size(source: VolumeSource) -> tuple[tuple[int, int, int], tuple[float, float, float]]:
    """A volume's size and spacing, both (x, y, z), from its header alone: no voxel is read or decompressed.

    Raises:
        dead_letters.CaseError: the header cannot be read.
    """
    import pydicom

    try:
        if source.is_dicom:
            header = pydicom.dcmread(source.dicom_files[0], stop_before_pixels=True)
            row_spacing, column_spacing = (float(v) for v in getattr(header, "PixelSpacing", (1.0, 1.0)))
            frames = int(getattr(header, "NumberOfFrames", 1) or 1)  # multi-frame (enhanced) files hold many slices
            size = (int(header.Columns), int(header.Rows), frames * len(source.dicom_files))
            return size, (column_spacing, row_spacing, float(getattr(header, "SliceThickness", None) or 1.0))
        reader = sitk.ImageFileReader()
        reader.SetFileName(source.path)
        reader.ReadImageInformation()
    except RuntimeError as error:
        raise dead_letters.CaseError("read", "unreadable", f"SimpleITK cannot read {source.path}: {str(error).strip().splitlines()[-1]}") from None
    except Exception as error:  # pydicom raises many kinds for corrupt headers
        raise dead_letters.CaseError("read", "unreadable", f"the header of {source.dicom_files[0]} cannot be read ({error})") from None
    size = tuple(reader.GetSize()) + (1,) * (3 - reader.GetDimension())
    return size[:3], tuple(reader.GetSpacing())[:3]


def _check_nifti_finite(path: str) -> None:
    """Refuses NaN/Inf voxels in a NIfTI file.

    ITK's NIfTI reader silently turns NaN and Inf into 0, so the values it
    returns cannot show them; nibabel reads the stored values as they are.
    """
    stored = np.asanyarray(nibabel.load(path).dataobj)
    if np.issubdtype(stored.dtype, np.floating):
        bad = int(stored.size - np.count_nonzero(np.isfinite(stored)))
        if bad:
            raise dead_letters.CaseError("validate", "non_finite_voxels", f"{bad} voxels of {path} are NaN or infinite")
