"""`fullres preprocess ct` and `fullres preprocess images` pass over what operating systems and archives leave beside
the data (`._*`, `.DS_Store`, `Thumbs.db`, `desktop.ini`, `__MACOSX/`, hidden folders), by the rule the video readers
follow (`common.hidden_files`), and count them in the log and `summary.json`'s `hidden_files_ignored`."""

import json

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from pipelines import cli
from tests import hostile_inputs

BEAM = ("--workers", "1", "--direct_running_mode=in_memory")
APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        "  # the start of every `._` file macOS writes


def _leave_desktop_litter(folder) -> None:
    """What Finder, Explorer and macOS's zip leave in a folder: 4 hidden entries (AppleDouble copies of `data` in
    __MACOSX/ count with their folder)."""
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (folder / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
    (folder / "desktop.ini").write_text("[.ShellClassInfo]\n")
    (folder / "__MACOSX").mkdir()


def test_preprocess_ct_passes_over_hidden_files_and_folders_and_counts_them(tmp_path):
    """Before: a notebook's `.ipynb_checkpoints/good-checkpoint.nii.gz` was converted as a second case, and nothing
    said how many hidden files were passed over."""
    scans = tmp_path / "scans"
    scans.mkdir()
    volume = hostile_inputs.ct_volume(shape=(6, 12, 10))
    hostile_inputs.write_volume(volume, str(scans / "good.nii.gz"), True)
    (scans / "._good.nii.gz").write_bytes(APPLE_DOUBLE)
    _leave_desktop_litter(scans)
    (scans / "__MACOSX" / "._good.nii.gz").write_bytes(APPLE_DOUBLE)
    (scans / ".ipynb_checkpoints").mkdir()
    hostile_inputs.write_volume(volume, str(scans / ".ipynb_checkpoints" / "good-checkpoint.nii.gz"), True)
    result = CliRunner().invoke(cli.app, ["preprocess", "ct", "--input", str(scans), "--output", str(tmp_path / "out"),
                                          *BEAM])
    assert result.exit_code == 0, result.output
    assert ("1 cases (unlabelled layout) to convert, 0 rejected before reading; 6 hidden files (._*, .DS_Store, "
            "Thumbs.db, __MACOSX/) ignored") in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["failed"] == 0 and summary["hidden_files_ignored"] == 6


def test_preprocess_images_passes_over_hidden_files_beside_voc_annotations_and_counts_them(tmp_path):
    """Before: macOS's `._a.xml` beside `a.xml` was read as a VOC file and failed the conversion
    (`unreadable_annotation`, 1 of 2 inputs)."""
    images, xml = tmp_path / "JPEGImages", tmp_path / "Annotations"
    images.mkdir(), xml.mkdir()
    Image.fromarray(np.zeros((50, 80, 3), np.uint8)).save(images / "a.jpg")
    (xml / "a.xml").write_text(
        "<annotation><filename>a.jpg</filename><size><width>80</width><height>50</height></size>"
        "<object><name>dog</name><bndbox><xmin>8</xmin><ymin>5</ymin><xmax>40</xmax><ymax>25</ymax></bndbox></object>"
        "</annotation>")
    (xml / "._a.xml").write_bytes(APPLE_DOUBLE)
    _leave_desktop_litter(xml)
    result = CliRunner().invoke(cli.app, ["preprocess", "images", "--annotations", str(xml), "--images", str(images),
                                          "--output", str(tmp_path / "out"), *BEAM])
    assert result.exit_code == 0, result.output
    assert ("1 images to convert, 0 annotations rejected; 5 hidden files (._*, .DS_Store, Thumbs.db, __MACOSX/) "
            "ignored") in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["failed"] == 0 and summary["hidden_files_ignored"] == 5
