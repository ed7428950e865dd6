"""`fullres predict` on a folder a careless copy left behind, in one command run.

Beside one good scan: every format cut short (NIfTI, .nii.gz, NRRD raw and gzip, MHA, MHD) and a DICOM series
with a slice cut short, a named pipe called `pipe.nii.gz`, `up -> ..` (a link out of the folder to a tree with a
patient-named scan), and a DICOM series with a missing slice whose PatientName has one part ("JANEDOE7731").
Before: the cut NIfTI files were predicted on zeros, the pipe hung predict, the link predicted the parent tree,
the missing slice was interpolated without a note, and highdicom printed the patient's name on the terminal.
"""

import json
import os
import subprocess
import sys

import pytest

from tests import hostile_inputs, shared_runs
from tests.trainer.predict.test_predict_checks import CT_TRAINED, PREPROCESSING

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NAME = "JANEDOE7731"


@pytest.mark.slow  # one predict command in a fresh process (about 30 s)
def test_predict_sets_aside_what_it_cannot_read_whole_and_says_what_it_interpolated(segmentation_run, tmp_path):
    config, _, _ = segmentation_run
    model = shared_runs.copied_run(config.output_dir, tmp_path / "model", preprocessing=PREPROCESSING,
                                   data_modality=CT_TRAINED)
    volume = hostile_inputs.ct_volume()
    scans = tmp_path / "data" / "scans"
    cut = hostile_inputs.write_cut_short(scans, volume)
    hostile_inputs.write_series(volume, scans / "series_cut", cut_slice=3)
    hostile_inputs.write_series(volume, scans / "gappy", patient_name=NAME, missing=(4,))
    hostile_inputs.write_volume(volume, str(scans / "good.nii.gz"), True)
    hostile_inputs.write_volume(volume, str(tmp_path / "data" / f"{NAME}_outside.nii.gz"), True)
    hostile_inputs.add_fifo_and_link_up(scans)
    output = tmp_path / "masks"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(  # a hang is a failure, not a stuck suite
        [sys.executable, "-m", "pipelines.cli", "predict", "--model", model, "--input", str(scans), "--output",
         str(output), "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1", "--max-failed-fraction", "1"],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert NAME not in result.stdout + result.stderr  # neither highdicom's warning nor the scan above --input
    summary = json.loads((output / "summary.json").read_text())
    assert sorted(case["case_id"] for case in summary["cases"]) == ["gappy", "good"]
    assert {(letter["source"], letter["reason"]) for letter in summary["dead_letters"]} == {
        *((os.path.basename(path), "cut_short") for path in cut.values()), ("series_cut", "cut_short"),
        ("pipe.nii.gz", "not_a_file")}
    assert summary["notes"] == ["1 link(s) lead outside the input and were not followed (up); pass "
                                "--follow-links to read what they point to"]
    # The missing slice: 11 files, interpolated onto 12 slices, noted in the summary and on the terminal.
    (gappy,) = [case for case in summary["cases"] if case["case_id"] == "gappy"]
    (note,) = gappy["notes"]
    assert note == {"reason": "slices_resampled", "detail": "slice gaps of gappy range from 2.5 to 5 mm, beyond the "
                    "5% tolerance; slices were interpolated onto a 2.5 mm grid"}
    assert gappy["shape"][0] == 12 and any(path.endswith("gappy.seg.dcm") for path in gappy["outputs"])
    (line,) = [line for line in result.stdout.splitlines() if "] gappy: " in line]
    assert line.endswith(f"; note: slices_resampled: {note['detail']}")
    assert [case["notes"] for case in summary["cases"] if case["case_id"] == "good"] == [[]]
