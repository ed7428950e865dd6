"""No two files `fullres predict` writes share a name: a clash between scans, or between a scan
and another's probability maps, is refused before anything is written."""

import json

import pytest
import SimpleITK as sitk

from common import output_guard
from trainer import config as config_lib
from trainer import presets
from trainer.predict import outputs, predict
from tests.trainer.predict.test_predict import PREPROCESSING, _scan


def _run(tmp_path) -> str:
    """A run folder as far as predict reads it before loading weights (these are not weights: never loaded)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text(json.dumps(config_lib.to_dict(presets.smoke())))
    (run / "model_info.json").write_text(json.dumps({"task": "segmentation", "image_shape": [16, 16, 16, 1],
                                                     "class_names": None, "preprocessing": PREPROCESSING}))
    (run / "model.keras").write_bytes(b"not read")
    return str(run)


def test_a_scan_named_like_another_s_probability_map_is_refused_before_anything_is_written(tmp_path):
    scans = tmp_path / "scans"
    scans.mkdir()
    for name in ("x.nii.gz", "x_probability_background.nii.gz"):
        sitk.WriteImage(_scan()[0], str(scans / name))
    output = tmp_path / "masks"
    with pytest.raises(output_guard.OutputRefused) as refused:
        predict.predict(_run(tmp_path), str(scans), str(output), probabilities=True, log=lambda line: None)
    assert str(refused.value) == (
        "scans 'x' and 'x_probability_background' would both write x_probability_background.nii.gz (a mask or "
        "probability map of each), so one would overwrite the other; rename one of the scans (or its folder), or "
        "predict them into separate --output folders, or leave out --probabilities.")
    assert not output.exists()


def test_two_scans_written_under_one_name_are_refused_and_distinct_names_pass():
    """`a.nii.gz` and `a.nrrd` named apart by their case ids, but both written `a.nii.gz` (--output-format nifti)."""
    outputs.check_distinct({"a": {"a.nii.gz", ".fullres-partial.a.nii.gz"}, "b": {"b.nii.gz"}}, probabilities=False)
    with pytest.raises(output_guard.OutputRefused, match=r"^scans 'a' and 'a.nrrd' would both write a.nii.gz .*; "
                                                         r"rename one of the scans \(or its folder\), or predict them "
                                                         r"into separate --output folders\.$"):
        outputs.check_distinct({"a": {"a.nii.gz"}, "a.nrrd": {"a.nii.gz"}}, probabilities=False)
