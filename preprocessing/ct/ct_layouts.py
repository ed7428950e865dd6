"""Which volume file is an image and which a label map, and whose case it is, from the names alone.

The data set layouts people download say in their names which file is which:

| layout         | images                              | label maps                        | case id      |
| -------------- | ----------------------------------- | --------------------------------- | ------------ |
| `nnunet`       | `imagesTr/la_003_0000.nii.gz`       | `labelsTr/la_003.nii.gz`          | `la_003`     |
| `msd`          | `imagesTr/la_003.nii.gz`            | `labelsTr/la_003.nii.gz`          | `la_003`     |
| `kits`         | `case_00000/imaging.nii.gz`         | `case_00000/segmentation.nii.gz`  | `case_00000` |
| `side_by_side` | `lung1_image.nrrd` (`_img`, `_ct`)  | `lung1_label.nrrd` (`_seg`, `_mask`) | `lung1`   |

Names are compared case-insensitively; the side-by-side suffix may follow `_`,
`-` or `.` (3D Slicer's `case.seg.nrrd`). nnU-Net's channel suffix (`_0000`,
`_0001`, ...) is recognised when every image of an `imagesTr`/`imagesTs` folder
carries one and every case has channel `_0000`; fullres trains on one channel,
so channel `_0000` is used and the others are reported, not converted. Files a
layout names but does not use are reported, never converted: `imagesTs` beside
`imagesTr` (test images have no label maps), and the other volumes inside a KiTS
case folder (KiTS23's `instances/` annotations). A name that says nothing
(`case7.nii.gz`) takes its role from where it was found: an image under
`--input`, a label map under `--labels`.

Pure functions of paths: nothing here opens a file.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re

IMAGE, LABEL = "image", "label"
IMAGE_SUFFIXES = ("image", "img", "ct")
LABEL_SUFFIXES = ("label", "seg", "mask")
_SIDE_BY_SIDE = re.compile(rf"^(?P<case>.+?)[_.-](?P<role>{'|'.join(IMAGE_SUFFIXES + LABEL_SUFFIXES)})$", re.IGNORECASE)
_CHANNEL = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")
_MSD_IMAGE_FOLDERS = ("imagestr", "imagests")
_MSD_LABEL_FOLDERS = ("labelstr", "labelsts")


@dataclasses.dataclass(frozen=True)
class Named:
    """One volume file as its name describes it.

    Attributes:
        path: the file's absolute path.
        case_id: the case it belongs to.
        role: `IMAGE`, `LABEL`, or "" when the name does not say.
        layout: `nnunet`, `msd`, `kits`, `side_by_side`, or "" when no layout names it.
        channel: the nnU-Net channel number, if the name carries one.
    """

    path: str
    case_id: str
    role: str = ""
    layout: str = ""
    channel: int | None = None


@dataclasses.dataclass(frozen=True)
class Classified:
    """The volume files under one root, sorted by role.

    Attributes:
        images: files that are images (by name, or found under `--input` with a neutral name).
        labels: files that are label maps (by name, or found under `--labels` with a neutral name).
        ignored: (path, why) for files a layout names but does not convert.
        notes: one sentence per kind of file left out, for the log and the summary.
    """

    images: tuple[Named, ...]
    labels: tuple[Named, ...]
    ignored: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


def name_file(path: str, stem: str) -> Named:
    """What the name of one volume file says: `path` is absolute, `stem` its name without the volume suffix."""
    folder = os.path.basename(os.path.dirname(path))
    lower = stem.lower()
    if folder.lower() in _MSD_IMAGE_FOLDERS:
        return Named(path, stem, IMAGE, "msd")
    if folder.lower() in _MSD_LABEL_FOLDERS:
        return Named(path, stem, LABEL, "msd")
    if lower == "imaging":
        return Named(path, folder, IMAGE, "kits")
    if lower == "segmentation":
        return Named(path, folder, LABEL, "kits")
    match = _SIDE_BY_SIDE.match(stem)
    if match:
        role = IMAGE if match["role"].lower() in IMAGE_SUFFIXES else LABEL
        return Named(path, match["case"], role, "side_by_side")
    return Named(path, stem)


def classify(files: list[tuple[str, str]], neutral_role: str) -> Classified:
    """Sorts the volume files found under one root into images and label maps.

    Args:
        files: (absolute path, stem) of every volume file found.
        neutral_role: the role of files whose names say nothing: `IMAGE` under
            `--input`, `LABEL` under `--labels`.

    Returns:
        The files by role; under `--labels`, files named as images are ignored.
    """
    named = _strip_channels([name_file(path, stem) for path, stem in files])
    ignored: list[tuple[str, str]] = []
    notes: list[str] = []
    kits_folders = {os.path.dirname(n.path) for n in named if n.layout == "kits" and n.role == IMAGE}
    msd_parents = {os.path.dirname(os.path.dirname(n.path)) for n in named
                   if os.path.basename(os.path.dirname(n.path)).lower() == "imagestr"}
    images, labels = [], []
    for item in named:
        folder = os.path.dirname(item.path)
        if os.path.basename(folder).lower() == "imagests" and os.path.dirname(folder) in msd_parents:
            ignored.append((item.path, "test images beside imagesTr have no label maps; pass --input .../imagesTs to convert them"))
        elif item.channel not in (None, 0):
            ignored.append((item.path, "nnU-Net channels other than _0000; fullres trains on one channel"))
        elif not item.layout and _inside(folder, kits_folders):
            ignored.append((item.path, "inside a KiTS case folder, which holds one imaging and one segmentation file"))
        elif (item.role or neutral_role) == IMAGE:
            if neutral_role == LABEL:
                ignored.append((item.path, "named as an image but found under --labels"))
            else:
                images.append(dataclasses.replace(item, role=IMAGE))
        else:
            labels.append(dataclasses.replace(item, role=LABEL))
    reasons = collections.defaultdict(list)
    for path, why in ignored:
        reasons[why].append(path)
    for why, paths in reasons.items():
        notes.append(f"{len(paths)} file(s) not converted ({why}), e.g. {paths[0]}")
    return Classified(tuple(images), tuple(labels), tuple(ignored), tuple(notes))


def _inside(folder: str, parents: set[str]) -> bool:
    """True if `folder` is one of `parents` or lies below one."""
    return any(folder == parent or folder.startswith(parent + os.sep) for parent in parents)


def _strip_channels(named: list[Named]) -> list[Named]:
    """Recognises nnU-Net's `_0000` channel suffix, folder by folder (see the module docstring)."""
    by_folder = collections.defaultdict(list)
    for index, item in enumerate(named):
        if item.layout == "msd" and item.role == IMAGE:
            by_folder[os.path.dirname(item.path)].append(index)
    result = list(named)
    for indices in by_folder.values():
        matches = [_CHANNEL.match(named[i].case_id) for i in indices]
        if not all(matches):
            continue
        channels = collections.defaultdict(set)
        for match in matches:
            channels[match["case"]].add(int(match["channel"]))
        if not all(0 in found for found in channels.values()):
            continue
        for i, match in zip(indices, matches):
            result[i] = dataclasses.replace(named[i], case_id=match["case"], layout="nnunet", channel=int(match["channel"]))
    return result
