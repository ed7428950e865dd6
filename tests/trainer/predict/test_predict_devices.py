"""`fullres predict` chooses its split from the devices present (`parallel.device_split`): a run trained split 4-way
predicts on one device with no option, and its masks are those of the training split."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

from tests import shared_runs
from tests.trainer.predict.test_predict import PREPROCESSING, REPOSITORY, _scan
from trainer.predict import predict


@pytest.mark.slow  # predicts with the session's trained smoke model here (4 devices) and in a 1-device process
def test_a_4_way_trained_run_predicts_on_one_device_with_the_training_split_s_masks(segmentation_run, tmp_path):
    config, _, _ = segmentation_run
    assert config.partition.input_partition_dims == (1, 4, 1, 1, 1)
    run = shared_runs.copied_run(config.output_dir, tmp_path, preprocessing=PREPROCESSING)
    scans = tmp_path / "scans"
    scans.mkdir()
    for name, size in (("a.nii.gz", (25, 31, 19)), ("b.nii.gz", (40, 22, 30))):
        sitk.WriteImage(_scan(size=size, radius=11.0)[0], str(scans / name))

    lines = []
    split = predict.predict(run, str(scans), str(tmp_path / "split"), log=lines.append)  # the 8 test devices
    assert split["split"] == {"input_partition_dims": [1, 4, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                              "devices_present": 8, "why": "the training split"}

    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    one = subprocess.run([sys.executable, "-m", "pipelines.cli", "predict", "--model", run, "--input", str(scans),
                          "--output", str(tmp_path / "one"), "--virtual-devices", "1"],
                         capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert one.returncode == 0 and "Traceback" not in one.stderr, one.stdout[-3000:] + one.stderr[-3000:]
    why = "the training split 1,4,1,1,1 needs 4 devices and 1 is present, so the same axes in fewer parts"
    assert f"each split 1,1,1,1,1 over 1 cpu device(s) ({why})" in one.stdout
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["split"] == {"input_partition_dims": [1, 1, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                                "devices_present": 1, "why": why}
    assert summary["ok"] == 2 and all(case["input_partition_dims"] == [1, 1, 1, 1, 1] for case in summary["cases"])
    # Padded as the training split pads (depth to a multiple of 8: 2 per pooling level and part): what the model sees.
    padded = {case["case_id"]: case["padded_shape"] for case in split["cases"]}
    assert {case["case_id"]: case["padded_shape"] for case in summary["cases"]} == padded
    assert all(shape[0] % 8 == 0 for shape in padded.values())
    for name in ("a.nii.gz", "b.nii.gz"):
        on_one = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "one" / name)))
        on_four = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "split" / name)))
        assert len(np.unique(on_four)) > 1  # the model predicts something; the comparison is not of empty masks
        # The parity tolerance for class ids (tests/trainer/parallel/test_parity.py, test_predict.py): equal.
        assert np.array_equal(on_one, on_four), name
