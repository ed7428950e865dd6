"""`fullres preprocess ct` on a folder a careless copy left behind, in one command run.

Beside one good scan: every format cut short (NIfTI, .nii.gz, NRRD raw and gzip, MHA, MHD), a DICOM series with
a slice cut short, a named pipe called `pipe.nii.gz` (reading it blocks for ever) and `up -> ..`, a link out of
the folder to a tree holding another scan. Before: the cut NIfTI files were converted with their missing part as
0 HU, the pipe hung the run, the link read the whole parent tree.
"""

import json
import os
import subprocess
import sys

import pytest

from tests import hostile_inputs

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # one preprocess command (about 15 s)
def test_cut_short_files_a_pipe_and_a_link_out_leave_the_good_scan_converted(tmp_path):
    volume = hostile_inputs.ct_volume()
    scans = tmp_path / "data" / "scans"
    hostile_inputs.write_cut_short(scans, volume)
    hostile_inputs.write_series(volume, scans / "series_cut", cut_slice=3)
    hostile_inputs.write_volume(volume, str(scans / "good.nii.gz"), True)
    hostile_inputs.write_volume(volume, str(tmp_path / "data" / "outside.nii.gz"), True)  # reachable only via up/
    hostile_inputs.add_fifo_and_link_up(scans)
    output = tmp_path / "out"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(  # a hang is a failure, not a stuck suite
        [sys.executable, "-m", "pipelines.cli", "preprocess", "ct", "--input", str(scans), "--output", str(output),
         "--workers", "1", "--max-failed-fraction", "1"], capture_output=True, text=True, cwd=REPOSITORY,
        env=environment, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] == 1  # the good scan, published
    letters = {letter["source"]: (letter["reason"], letter["detail"])
               for letter in map(json.loads, (output / "dead_letter.jsonl").read_text().splitlines())}
    cut_names = {os.path.basename(path) for path in hostile_inputs.write_cut_short(tmp_path / "names", volume).values()}
    assert {source: reason for source, (reason, _) in letters.items()} == {
        **{name: "cut_short" for name in cut_names}, "series_cut": "cut_short", "pipe.nii.gz": "not_a_file"}
    assert letters["nifti_gz.nii.gz"][1].startswith("nifti_gz.nii.gz decompresses to ")
    assert letters["pipe.nii.gz"][1] == ("pipe.nii.gz is a named pipe (FIFO), not a file; fullres reads only regular "
                                         "files (reading this one could block for ever), so it was skipped")
    assert summary["layout_notes"] == ["1 link(s) lead outside the input and were not followed (up); pass "
                                       "--follow-links to read what they point to"]
    assert "1 link(s) lead outside the input and were not followed" in result.stdout
    assert "outside" not in (output / "dead_letter.jsonl").read_text()  # nothing from above --input was read
