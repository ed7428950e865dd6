"""`fullres predict` reads scans by the rules `preprocess ct` follows: the header first, geometry never guessed, bytes capped.

The scans are the ones tests/preprocessing/ct/test_volume_header.py writes (real nibabel / SimpleITK files with
the quirks users meet); the sentences are the same ones, because predict calls the same check.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from common import dead_letters
from preprocessing.ct import ct_io
from tests import shared_runs
from tests.preprocessing.ct import test_volume_header as headers
from trainer.predict import scan_grid

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Address space for `fullres predict` on 2 virtual CPU devices, measured here (2026-11-25): under 2 GiB XLA cannot
# start ("cannot allocate memory for thread-local data"); under 3 GiB it runs at 0.95 GB resident, and before the
# byte cap SimpleITK could not allocate the float64 scan ("Failed to allocate memory for image").
LIMIT_FOR_PREDICT = 3 * 2**30
PREPROCESSING = {"spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
                 "shape": None}


def _refusal(path, name, preprocessing=PREPROCESSING, **limits):
    with pytest.raises(dead_letters.CaseError) as error:
        scan_grid.prepare(ct_io.VolumeSource(str(path), name=name), preprocessing, **limits)
    return error.value.reason, error.value.detail


@pytest.mark.parametrize("name, write, reason, detail", [
    ("zero.nii.gz", lambda p: headers._nifti(p, headers._volume(), headers._zero_geometry), "invalid_geometry",
     f"zero.nii.gz has voxel spacing 0 x 0 x 0 mm in its header (NIfTI pixdim[1:4]); {headers.GEOMETRY_FIX}"),
    ("four.nii.gz", lambda p: headers._nifti(p, np.zeros((8, 7, 6, 3), np.int16)), "four_dimensional",
     "four.nii.gz is 4-D, 3 volumes of 8 x 7 x 6 voxels; fullres reads one 3-D volume per file, so save the volume "
     "to use as a file of its own (e.g. nibabel.load(path).slicer[..., INDEX])"),
    ("point.nii.gz", lambda p: headers._nifti(p, np.full((1, 1, 1), 40, np.int16)), "too_small",
     "point.nii.gz is 1 x 1 x 1 voxels; a volume needs at least 2 along each axis (a point or a single slice is not "
     "padded into a scan)"),
])
def test_predict_refuses_what_preprocess_refuses_in_the_same_words(tmp_path, name, write, reason, detail):
    # Before: the zero-pixdim scan and the point were predicted on a 1 mm guess and padding; the 4-D scan failed in
    # DICOMOrient with a message about pixel types.
    assert _refusal(write(tmp_path / name), name) == (reason, detail)


def test_predict_refuses_a_scan_too_thin_for_the_model_grid(tmp_path):
    path = headers._nifti(tmp_path / "thin.nii.gz", np.full((8, 8, 2), 40, np.int16))  # two 2 mm slices
    model_grid = dict(PREPROCESSING, spacing=[1.7, 1.7, 5.0])
    assert _refusal(path, "thin.nii.gz", model_grid) == (
        "too_small", "thin.nii.gz resampled to the model's spacing 1.7,1.7,5 would be 4 x 4 x 1 voxels; a volume "
                     "needs at least 2 along each axis (a point or a single slice is not padded into a scan)")


def test_predict_caps_the_decoded_bytes_of_a_scan_from_its_header(tmp_path):
    path = headers._nifti(tmp_path / "wide.nii.gz", np.zeros((10, 10, 10), np.float64))
    assert _refusal(path, "wide.nii.gz", max_decoded_bytes=10_000) == (
        "too_many_bytes", "wide.nii.gz holds 10 x 10 x 10 float64 voxels, 11.7 KiB once decoded (8 bytes a voxel as "
                          "stored and 4 as float32), more than --max-decoded-bytes 9.8 KiB; raise --max-decoded-bytes "
                          "if this machine has that memory to spare")


@pytest.mark.parametrize("option, value, message", [
    ("--max-decoded-bytes", "lots", "--max-decoded-bytes 'lots' is not a size; write e.g. 16GiB or 32GB."),
    ("--max-decoded-bytes", "0GiB", "--max-decoded-bytes must be positive, e.g. 3GiB, got 0GiB."),
    ("--max-voxels", "0", "--max-voxels must be positive, got 0."),
])
def test_predict_s_size_caps_are_checked_in_one_sentence(tmp_path, option, value, message):
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["predict", "--model", str(tmp_path), "--input", str(tmp_path), "--output",
                                          str(tmp_path / "masks"), option, value])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"fullres: error: {message}"
    assert not (tmp_path / "masks").exists()


@pytest.fixture(scope="module")
def trained_run(segmentation_run, tmp_path_factory):
    """A copy of the session's tiny segmentation run with a recorded preprocessing (as test_predict.py makes it)."""
    config, _, _ = segmentation_run
    return shared_runs.copied_run(config.output_dir, tmp_path_factory.mktemp("run"), preprocessing=PREPROCESSING)


@pytest.mark.slow  # `fullres predict` with the session's trained smoke model, in a fresh process under the limit
def test_fullres_predict_dead_letters_the_float64_scan_and_predicts_the_other_under_a_memory_limit(trained_run,
                                                                                                   tmp_path):
    scans = tmp_path / "scans"
    scans.mkdir()
    headers.zeros_nifti(scans / "f64.nii.gz", headers.FLOAT64_SHAPE, np.float64)
    headers._nifti(scans / "good.nii.gz", np.full((20, 20, 12), 40, np.int16))
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run(
        headers.under_memory_limit(LIMIT_FOR_PREDICT, "predict", "--model", trained_run, "--input", str(scans),
                                   "--output", str(tmp_path / "masks"), "--virtual-devices", "2",
                                   "--input-partition-dims", "1,2,1,1,1",
                                   "--max-failed-fraction", "0.5"),  # 1 of 2 scans fails on purpose
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "masks" / "summary.json").read_text())
    assert [case["case_id"] for case in summary["cases"]] == ["good"]
    [letter] = summary["dead_letters"]
    assert letter["source"].endswith("f64.nii.gz") and letter["reason"] == "too_many_bytes"
    assert letter["detail"] == headers.F64_DETAIL.replace("each worker", "this machine")
    assert f"f64: skipped (too_many_bytes: {letter['detail']})" in run.stdout
