"""What `fullres predict` writes beside the masks, whole or not at all: images, `summary.json`, the names it may write.

Every file goes through `file_writes.whole` (written as `.fullres-partial.NAME`,
renamed when complete), so a killed or disk-full run leaves no cut-short mask
that a reader would take for a real one.
"""

import errno
import json
import os
import shutil

import numpy as np
import SimpleITK as sitk

from common import file_writes, output_guard
from trainer.predict import scan_grid

SUMMARY = "summary.json"  # what predict writes beside the masks (its own; not a data set's summary.json)


def write_summary(output_dir: str, summary: dict) -> str:
    """Writes predict's `summary.json` into `output_dir` (the masks' folder); returns its path."""
    path = os.path.join(output_dir, SUMMARY)
    file_writes.write_whole(path, json.dumps(summary, indent=2).encode())
    return path


def write_summary_and_dead_letters(output_dir: str, summary: dict) -> str:
    """`summary.json`, and `dead_letter.jsonl` with a line per `summary["dead_letters"]` entry (scans or videos
    alike); returns the summary's path."""
    path = write_summary(output_dir, summary)
    file_writes.write_whole(os.path.join(output_dir, "dead_letter.jsonl"),
                            "".join(json.dumps(letter) + "\n" for letter in summary["dead_letters"]).encode())
    return path


def too_many_failed(done: int, failed: int, max_failed_fraction: float, output_dir: str, noun: str) -> str | None:
    """The sentence when `failed` of `done + failed` inputs (`noun`: "inputs", "videos") pass
    --max-failed-fraction; None when they do not."""
    total = done + failed
    if not total or failed / total <= max_failed_fraction:
        return None
    return (f"{failed} of {total} {noun} failed ({failed / total:.0%}), more than --max-failed-fraction "
            f"{max_failed_fraction:g}; see {os.path.join(output_dir, 'dead_letter.jsonl')}.")


def write_image(image: sitk.Image, path: str) -> None:
    """Writes a mask or probability map whole or not at all (compressed; the format from `path`'s ending).

    Written as `.fullres-partial.NAME`, read back and compared, then renamed: ITK's NIfTI writer reports no
    error when the disk fills up, and its reader reads the cut-short file it leaves without one either (the
    missing voxels come back as zeros); its other writers leave a 0-byte file.

    Raises:
        OSError: ENOSPC when the disk is full (the partial file removed); RuntimeError for other ITK failures.
    """
    try:
        with file_writes.whole(path) as temporary:
            sitk.WriteImage(image, temporary, useCompression=True)
            written = sitk.ReadImage(temporary)  # held: an array view does not keep its image alive
            if not np.array_equal(sitk.GetArrayViewFromImage(written), sitk.GetArrayViewFromImage(image)):
                raise RuntimeError(f"{temporary} reads back other voxels than were written (cut short)")
    except RuntimeError as error:
        if _disk_too_full(path, image):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path) from error
        raise


def _disk_too_full(path: str, image: sitk.Image) -> bool:
    """Whether the disk of `path` lacks room for `image` uncompressed (what ITK's failed write left unsaid)."""
    needed = image.GetNumberOfPixels() * image.GetNumberOfComponentsPerPixel() * image.GetSizeOfPixelComponent()
    try:
        return shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < needed
    except OSError:
        return False


def read_summary(output_dir: str) -> dict:
    """Predict's `summary.json` in `output_dir`: model, input, counts, class names, and per case its `outputs`.

    Raises:
        FileNotFoundError: `output_dir` holds no summary (not an output of `fullres predict`, or an unfinished one).
    """
    path = os.path.join(output_dir, SUMMARY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{output_dir} has no {SUMMARY}; pass the output directory of a finished "
                                "`fullres predict`.")
    with open(path) as file:
        return json.load(file)


def planned_outputs(case_id, source, format_name, probabilities, dicom_seg, names) -> set[str]:
    """The file names `predict` (`_predict_case`) may write for a case."""
    suffix = scan_grid.FORMATS[scan_grid.output_format(source, format_name)]
    planned = {case_id + suffix}
    if probabilities:
        planned |= {f"{case_id}_probability_{name}{suffix}" for name in names}
    if source.is_dicom and dicom_seg is not False:
        planned.add(case_id + ".seg.dcm")
    # The names they have while written (`write_image`): one a killed run left is fullres's, not the user's.
    return planned | {file_writes.PARTIAL_PREFIX + name for name in planned}


def check_distinct(planned: dict[str, set[str]], probabilities: bool) -> None:
    """Refuses, before anything is written, two cases that would write one file (`planned`: case id -> its
    `planned_outputs`): scan `x_probability_background`'s mask is scan `x`'s probability map of background, and
    `a.nii.gz` and `a.nrrd` are both `a.nii.gz` under `--output-format nifti`.

    Raises:
        output_guard.OutputRefused: the sentence names both cases, the file and the fix.
    """
    owner: dict[str, str] = {}
    for case_id, names in planned.items():
        for name in sorted(names):
            if name.startswith(file_writes.PARTIAL_PREFIX):
                continue
            other = owner.setdefault(name, case_id)
            if other != case_id:
                fix = "rename one of the scans (or its folder), or predict them into separate --output folders"
                if probabilities and "_probability_" in name:
                    fix += ", or leave out --probabilities"
                raise output_guard.OutputRefused(
                    f"scans {other!r} and {case_id!r} would both write {name} (a mask or probability map of each), "
                    f"so one would overwrite the other; {fix}.")
