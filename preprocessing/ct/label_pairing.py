"""Pairing CT images with their label maps: by layout names, DICOM references, a labels folder or a manifest CSV.

Every image that needs a label map and has none, every label map without an
image, and every case with two label maps is a dead letter naming its files.
"""

from __future__ import annotations

import csv
import dataclasses
import os

from common import dead_letters
from preprocessing.ct import ct_io, ct_layouts, dicom_series, volume_discovery


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
        hidden: hidden files and folders left out (`common.hidden_files`), input and labels together.
    """

    cases: list[ct_io.CaseSource]
    dead: list[dict]
    layout: str
    notes: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    hidden: int = 0


def pair(input_path: str, labels: str | None = None,
         spacing_tolerance: float = dicom_series.DEFAULT_SPACING_TOLERANCE, follow_links: bool = False) -> Pairing:
    """Finds the cases under `input_path` and pairs each with its label map.

    Label maps come from the names under `input_path` (the layouts of
    `ct_layouts`), from DICOM SEG/RTSTRUCT files (the case of the series they
    reference), from a `labels` folder (same case ids), or from a manifest CSV
    (`image,label` rows). A file is never paired with itself, and a label map
    is never a case. Once any case has a label map, a case without one is a
    dead letter. Links that lead outside `input_path` (or `labels`) are followed only with `follow_links`
    (`volume_discovery`).

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
        found = volume_discovery.find_volumes(input_path, exclude=label_files, spacing_tolerance=spacing_tolerance,
                                             follow_links=follow_links)
        dead = list(found.dead)
        by_manifest = _match_manifest(labels, rows, found.images, dead)
        by_case, ambiguous = _merge_labels([found.labels, by_manifest], found.images, dead)
        cases, pair_dead = _match(_without(found.images, ambiguous), by_case, f"manifest {labels}")
        return Pairing(cases, dead + pair_dead, "manifest", found.notes, roots, found.hidden)
    if labels is not None and not os.path.exists(labels):
        raise FileNotFoundError(f"--labels {labels!r} does not exist; pass a folder of label maps or a manifest CSV.")
    if labels is None or os.path.realpath(labels) == input_real:
        found = volume_discovery.find_volumes(input_path, spacing_tolerance=spacing_tolerance, follow_links=follow_links)
        if labels is not None and found.images and not found.labels:
            raise ValueError(
                f"--labels {labels} is the --input folder, and no file name there says which files are label maps; "
                "put the label maps in a folder of their own with the images' file names, name them like "
                "CASE_label.nii.gz beside CASE_image.nii.gz (or _seg/_mask beside _img/_ct), or pass a manifest CSV "
                "with image,label rows as --labels.")
        if not found.labels:
            return Pairing([ct_io.CaseSource(case_id, source) for case_id, source in sorted(found.images.items())],
                           list(found.dead), "unlabelled", found.notes, roots, found.hidden)
        dead = list(found.dead)
        by_case, ambiguous = _merge_labels([found.labels], found.images, dead)
        cases, pair_dead = _match(_without(found.images, ambiguous), by_case, input_path, found.layouts)
        return Pairing(cases, dead + pair_dead, _layout_name(cases, found.layouts, "same_names"), found.notes, roots,
                       found.hidden)
    labels_real = os.path.realpath(labels)
    # One location may hold the other (labels/ inside the input, or the input inside the labels' folder):
    # each side leaves the other's files out, so no file is both an image and a label map.
    input_inside_labels = volume_discovery.excluded(input_real, frozenset({labels_real}))
    found = volume_discovery.find_volumes(input_path, exclude=frozenset() if input_inside_labels else frozenset({labels_real}),
                         spacing_tolerance=spacing_tolerance, follow_links=follow_links)
    label_found = volume_discovery.find_volumes(labels, ct_layouts.LABEL, exclude=frozenset({input_real}),
                               spacing_tolerance=spacing_tolerance, follow_links=follow_links)
    dead = found.dead + label_found.dead
    # Label maps named as such beside the images count too; two for one case are refused.
    by_case, ambiguous = _merge_labels([label_found.labels, found.labels], found.images, dead)
    layouts = {**label_found.layouts, **found.layouts}
    cases, pair_dead = _match(_without(found.images, ambiguous), by_case, labels, layouts)
    return Pairing(cases, dead + pair_dead, _layout_name(cases, layouts, "same_names"),
                   found.notes + label_found.notes, roots, found.hidden + label_found.hidden)


def _merge_labels(sources: list[dict[str, ct_io.VolumeSource]], images: dict[str, ct_io.VolumeSource], dead: list
                  ) -> tuple[dict[str, ct_io.VolumeSource], set[str]]:
    """Label maps by case id from several places; a case with two is a dead letter naming both files.

    Returns:
        (label maps by case id, the case ids that had more than one).
    """
    by_case: dict[str, ct_io.VolumeSource] = {}
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


def _without(images: dict[str, ct_io.VolumeSource], case_ids: set[str]) -> dict[str, ct_io.VolumeSource]:
    return {case_id: source for case_id, source in images.items() if case_id not in case_ids}


def _layout_name(cases: list[ct_io.CaseSource], layouts: dict, default: str) -> str:
    names = {layouts.get((ct_layouts.IMAGE, c.case_id)) or layouts.get((ct_layouts.LABEL, c.case_id)) or default
             for c in cases}
    return "+".join(sorted(names)) or default


def pair_with_labels(images: dict[str, ct_io.VolumeSource], labels: str | None) -> tuple[list[ct_io.CaseSource], list[dict]]:
    """Pairs images (as `volume_discovery.discover` returns them) with label maps from a directory or a manifest CSV.

    DICOM SEG/RTSTRUCT files among `images` label the case of their series.

    Returns:
        (cases, dead letters): an image without a label is a dead letter when
        labels were asked for; a label without an image is reported too.
    """
    images, in_input, dead = _dicom_labels_by_case(images, images)
    if labels is None:
        return [ct_io.CaseSource(case_id, source, in_input.get(case_id)) for case_id, source in sorted(images.items())], dead
    if os.path.isfile(labels) and labels.lower().endswith(".csv"):
        found = _match_manifest(labels, _manifest_rows(labels), images, dead)
        where = f"manifest {labels}"
    else:
        exclude = frozenset(os.path.realpath(source.path) for source in images.values())
        label_found = volume_discovery.find_volumes(labels, ct_layouts.LABEL, exclude=exclude)
        found, where = label_found.labels, labels
        dead.extend(label_found.dead)
    by_case, ambiguous = _merge_labels([in_input, found], images, dead)
    cases, pair_dead = _match(_without(images, ambiguous), by_case, where)
    return cases, dead + pair_dead


def _dicom_labels_by_case(volumes: dict[str, ct_io.VolumeSource], images: dict[str, ct_io.VolumeSource]
                          ) -> tuple[dict[str, ct_io.VolumeSource], dict[str, ct_io.VolumeSource], list[dict]]:
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


def _match(images: dict[str, ct_io.VolumeSource], labels: dict[str, ct_io.VolumeSource], where: str,
           layouts: dict | None = None) -> tuple[list[ct_io.CaseSource], list[dict]]:
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
            cases.append(ct_io.CaseSource(case_id, source, label))
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


def _match_manifest(path: str, rows, images: dict[str, ct_io.VolumeSource], dead: list) -> dict[str, ct_io.VolumeSource]:
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
            by_case[case_id] = ct_io.VolumeSource(label_path)
    return by_case
