"""`fullres predict` reads scans by the rules `preprocess ct` follows: the header first, geometry never guessed, bytes capped.

The scans are the ones tests/preprocessing/ct/test_volume_header.py writes (real nibabel / SimpleITK files with
the quirks users meet); the sentences are the same ones, because predict calls the same check.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from common import dead_letters
from preprocessing.ct import ct_io
from tests.preprocessing.ct import test_volume_header as headers
from trainer.predict import predict

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PREPROCESSING = {"spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
                 "shape": None}


def _refusal(path, name, preprocessing=PREPROCESSING, **limits):
    with pytest.raises(dead_letters.CaseError) as error:
        predict.prepare(ct_io.VolumeSource(str(path), name=name), preprocessing, **limits)
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


PREPARE_UNDER_A_MEMORY_LIMIT = """
import json, resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from common import dead_letters
from preprocessing.ct import ct_io
from trainer.predict import predict
preprocessing = json.loads(sys.argv[3])
try:
    predict.prepare(ct_io.VolumeSource(sys.argv[1], name="f64.nii.gz"), preprocessing)
    print(json.dumps(["prepared", ""]))
except dead_letters.CaseError as error:
    print(json.dumps([error.reason, error.detail]))
"""


@pytest.mark.slow  # a fresh process importing JAX under the limit
def test_predict_refuses_the_float64_scan_before_decoding_it_under_a_memory_limit(tmp_path):
    path = headers.zeros_nifti(tmp_path / "f64.nii.gz", headers.FLOAT64_SHAPE, np.float64)
    # Before (2026-11-25, this machine): SimpleITK's reader ended in std::bad_alloc under 2 GiB of address space.
    run = subprocess.run([sys.executable, "-c", PREPARE_UNDER_A_MEMORY_LIMIT, path, str(2 * 2**30),
                          json.dumps(PREPROCESSING)], capture_output=True, text=True, timeout=300, cwd=REPOSITORY)
    assert run.returncode == 0, run.stderr[-2000:]
    reason, detail = json.loads(run.stdout.splitlines()[-1])
    assert (reason, detail) == ("too_many_bytes", headers.F64_DETAIL.replace("each worker", "this machine"))


def test_predict_s_max_decoded_bytes_takes_a_size_and_says_so_in_one_sentence(tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["predict", "--model", str(tmp_path), "--input", str(tmp_path), "--output",
                                          str(tmp_path / "masks"), "--max-decoded-bytes", "lots"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "fullres: error: --max-decoded-bytes 'lots' is not a size; write e.g. 16GiB or 32GB."
