"""Patch mode end to end: a run trained on crops records it, evaluates and predicts a larger scan by the sliding
window, through `fullres predict`, in the scan's own geometry; a whole-volume model slides on request."""

import json

import numpy as np
import pytest
import SimpleITK as sitk

from tests import shared_runs
from tests.trainer.predict import test_predict
from trainer import config as config_lib, train
from trainer import presets
from trainer.engine import sliding_window
from trainer.parallel import partitioning

pytestmark = pytest.mark.slow  # trains a tiny run on crops, then predicts scans window by window


@pytest.fixture(scope="module")
def patch_run(demo_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("patch_run")
    config = presets.smoke(train_data=demo_data["train"], eval_data=demo_data["eval"], output_dir=str(folder / "run"),
                              patch_size=(8, 8, 8), steps=4, partition=partitioning.PartitionConfig((1, 4, 1, 1, 1)))
    lines = []
    results = train.train(config, log=lines.append, export_saved_model=False)
    return config, results, lines


def test_a_patch_trained_run_records_it_and_evaluates_by_the_sliding_window(patch_run):
    config, results, lines = patch_run
    assert results["trained_on"] == "patches" and results["image_shape"] == [8, 8, 8, 1]
    recorded = json.loads(open(f"{config.output_dir}/train_config.json").read())
    assert recorded["patch_size"] == [8, 8, 8]
    assert config_lib.from_dict(recorded).patch_size == (8, 8, 8)
    assert any(line.startswith("patches: random 8x8x8 crops of the 16x16x16 volumes, one in 3 centred on a "
                               "foreground voxel") for line in lines)
    assert sum(line.startswith("receptive field: each output voxel sees ") for line in lines) == 1
    assert results["cases"] == 2 and len(results["dice_per_class"]) == 3  # held-out volumes, window by window


def test_a_patch_trained_run_predicts_a_larger_scan_by_the_sliding_window_in_its_geometry(patch_run, tmp_path):
    from pipelines import cli  # `fullres`

    config, _, _ = patch_run
    run = shared_runs.copied_run(config.output_dir, tmp_path / "copy", preprocessing=test_predict.PREPROCESSING)
    scans = tmp_path / "scans"
    scans.mkdir()
    scan, _ = test_predict._scan(size=(25, 31, 19))  # 15×30×12 on the model's grid: larger than a patch
    sitk.WriteImage(scan, str(scans / "a.nii.gz"))
    output = tmp_path / "masks"
    with pytest.raises(SystemExit) as exited:
        cli.main(["predict", "--model", run, "--input", str(scans), "--output", str(output)])
    assert exited.value.code in (0, None)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["inference"]["method"] == "sliding_window"
    assert summary["inference"]["patch_size"] == [8, 8, 8]
    assert summary["inference"]["described"] == (sliding_window.describe((8, 8, 8))
                                                 + " (the model was trained on patches of that size)")
    (case,) = summary["cases"]
    assert case["model_grid_shape"] == [15, 30, 12] and case["windows"] == 3 * 7 * 2  # half a patch apart
    mask = sitk.ReadImage(str(output / "a.nii.gz"))
    assert mask.GetSize() == scan.GetSize()
    for field in ("GetSpacing", "GetOrigin", "GetDirection"):
        np.testing.assert_allclose(getattr(mask, field)(), getattr(scan, field)(), atol=1e-6, err_msg=field)


def test_a_whole_volume_model_slides_its_training_shape_on_request(segmentation_run, tmp_path):
    from trainer.predict import predict

    config, _, _ = segmentation_run
    run = shared_runs.copied_run(config.output_dir, tmp_path / "copy", preprocessing=test_predict.PREPROCESSING)
    sitk.WriteImage(test_predict._scan(size=(25, 31, 19))[0], str(tmp_path / "a.nii.gz"))
    whole = predict.predict(run, str(tmp_path / "a.nii.gz"), str(tmp_path / "whole"), log=lambda line: None)
    sliding = predict.predict(run, str(tmp_path / "a.nii.gz"), str(tmp_path / "sliding"), sliding_window=True,
                              log=lambda line: None)
    assert whole["inference"]["method"] == "whole" and "windows" not in whole["cases"][0]
    assert sliding["inference"]["method"] == "sliding_window" and sliding["inference"]["patch_size"] == [16, 16, 16]
    assert sliding["cases"][0]["windows"] == 1 * 3 * 1  # 15×30×12: padded to a patch, or half a patch apart
