"""`fullres demo-data`: reruns replace only what an earlier run wrote (the refusals: tests/common/test_every_command_keeps_user_files.py)."""

import json
import os

from typer.testing import CliRunner

from common import output_guard


def _demo_data(*arguments):
    from pipelines import cli

    return CliRunner().invoke(cli.app, ["demo-data", *arguments])


def test_a_smaller_rerun_removes_the_cases_it_no_longer_writes_and_lists_every_file(tmp_path):
    output = tmp_path / "demo"
    assert _demo_data("ct", "--output", str(output), "--cases", "2", "--shape", "3,8,8").exit_code == 0
    assert (output / "dicom" / "images" / "case001" / "IM00002.dcm").exists()
    result = _demo_data("ct", "--output", str(output), "--cases", "1", "--shape", "2,8,8")
    assert result.exit_code == 0, result.output
    files = sorted(os.path.relpath(os.path.join(d, n), output) for d, _, names in os.walk(output) for n in names)
    assert files == sorted([output_guard.MARKER, "dicom/images/case000/IM00000.dcm", "dicom/images/case000/IM00001.dcm",
                            "dicom/labels/case000.nii.gz", "nifti/images/case000.nii.gz", "nifti/labels/case000.nii.gz"])
    assert not (output / "dicom" / "images" / "case001").exists()  # its folder went with its slices
    marker = json.loads((output / output_guard.MARKER).read_text())
    assert marker["kind"] == "demo-data-ct" and sorted(marker["files"]) == [f for f in files if f != output_guard.MARKER]


def test_a_file_added_to_earlier_demo_data_stops_the_rerun(tmp_path):
    output = tmp_path / "shapes"
    assert _demo_data("images", "--output", str(output), "--images", "1", "--size", "32").exit_code == 0
    (output / "images" / "mine.png").write_bytes(b"mine")
    result = _demo_data("images", "--output", str(output), "--images", "1", "--size", "32")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"fullres: error: --output {output} holds files fullres did not write "
                                     "(images/mine.png); fullres never deletes or overwrites them, so pass a new or "
                                     "empty directory as --output, or move those files away.")
    assert (output / "images" / "mine.png").read_bytes() == b"mine"


def test_demo_data_of_the_other_kind_is_not_replaced(tmp_path):
    output = tmp_path / "demo"
    assert _demo_data("images", "--output", str(output), "--images", "1", "--size", "32").exit_code == 0
    result = _demo_data("ct", "--output", str(output), "--cases", "1", "--shape", "2,8,8")
    assert result.exit_code == 2 and "(annotations.json, images/shapes_00000.png)" in result.stderr
