"""`fullres predict` checks each scan against what the model was trained on, fails the run when too many scans fail,
and names no patient: relative paths, and pseudonyms on request.

The model is the session's tiny segmentation run (trained on synthetic CT records), with model_info.json saying
what `fullres train` records from `fullres preprocess ct`'s summary.json: how its scans were prepared, and that
they were CT (`data_modality`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from preprocessing.ct import demo_ct
from tests import files, shared_runs
from trainer import presets
from trainer.predict import predict, scan_check
from trainer.tasks import registry

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PREPROCESSING = {"spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "auto",
                 "shape": [32, 32, 32]}
CT_TRAINED = {"modalities": {"CT": 6}, "intensity_range": [-1024, 1200]}
PATIENT, ROOT = "QZDOE_QZJANE_PID-QZ7731", "PHIROOTMARKER"  # no timestamp spells these by chance


def _ct(shape=(12, 18, 16)) -> np.ndarray:
    """HU: air around a soft-tissue body, as a CT holds."""
    volume, _ = demo_ct.synthetic_case(np.random.default_rng(0), shape)
    return volume


def _mr(shape=(12, 18, 16)) -> np.ndarray:
    """MR-like: a dark (0) background around a body of 200..900, no unit, nothing like air at -1000 HU."""
    volume = np.zeros(shape, np.float32)
    grid = np.indices(shape).astype(np.float32)
    inside = sum(((g - c) / (n / 2.5)) ** 2 for g, c, n in zip(grid, np.array(shape) / 2, shape)) <= 1
    volume[inside] = np.random.default_rng(1).uniform(200, 900, int(inside.sum()))
    return volume


def _volume_file(volume, path):
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing((1.1, 1.1, 2.5))
    sitk.WriteImage(image, str(path))


def _series(volume, directory, modality="CT", patient=None):
    """A DICOM series; MR stored as it comes (no HU rescale), and with a patient's name in its tags when given."""
    paths = demo_ct.write_dicom_series(volume if modality == "CT" else volume - 1024, str(directory),
                                       spacing=(1.1, 1.1, 2.5))
    for path in paths:
        dataset = pydicom.dcmread(path)
        dataset.Modality = modality
        if patient:
            dataset.PatientName, dataset.PatientID, dataset.PatientBirthDate = "QZDOE^QZJANE", "PID-QZ7731", "19230517"
            dataset.InstitutionName = "St. Jane's Hospital"
        dataset.save_as(path)
    return paths


# ---------------------------------------------------------------------------------------------------------------
# The check itself: fast, on generated volumes.

def test_a_scan_of_another_modality_is_named_with_what_the_model_was_trained_on():
    found = scan_check.mismatches(_mr(), "MR", CT_TRAINED)
    assert found == [("modality_mismatch", "the scan is MR (its DICOM Modality tag) but the model was trained on 6 CT "
                                           "scans, so its mask is likely wrong; predict it with a model trained on MR "
                                           "scans")]
    from_values = scan_check.mismatches(_mr(), None, CT_TRAINED)  # a NIfTI: no tag, told by its values
    assert from_values[0][1].startswith("the scan is MR (its values do not look like Hounsfield units) but the model "
                                        "was trained on 6 CT scans")
    assert scan_check.mismatches(_ct(), None, CT_TRAINED) == [] and scan_check.mismatches(_ct(), "CT", CT_TRAINED) == []
    assert scan_check.mismatches(_mr(), "MR", {"modalities": {"MR": 4, "CT": 2}, "intensity_range": [0, 900]}) == []
    assert scan_check.mismatches(_mr(), "MR", None) == []  # a model that records nothing is not checked


def test_a_ct_scan_outside_the_training_hu_range_is_named():
    """Tagged CT, but stored without its rescale intercept (0..4000 instead of -1024..3000): the range says so."""
    raw = _ct() + 1024 + 2000
    ((reason, sentence),) = scan_check.mismatches(raw, "CT", CT_TRAINED)
    assert reason == "intensity_mismatch"
    assert sentence.startswith("the scan's values lie mostly in ") and (
        "but the model's CT training scans' in -1024..1200 HU (" in sentence)
    assert sentence.endswith("overlap), so its mask is likely wrong; check the scan's rescale slope and intercept")


def test_training_copies_what_its_scans_were_into_the_model(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"preprocessing": PREPROCESSING, "data_modality": CT_TRAINED}))
    config = presets.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path / "run"))
    assert registry.make_task(config).data_modality() == CT_TRAINED


# ---------------------------------------------------------------------------------------------------------------
# predict with the session's CT model.

@pytest.fixture(scope="module")
def ct_model(segmentation_run, tmp_path_factory):
    """A copy of the session's tiny segmentation run, its model_info.json as training writes it from CT data."""
    config, _, _ = segmentation_run
    return shared_runs.copied_run(config.output_dir, tmp_path_factory.mktemp("ct-model"),
                                  preprocessing=PREPROCESSING, data_modality=CT_TRAINED)


def _scans(tmp_path):
    """A CT NIfTI, an MR brain as a NIfTI and as an MR DICOM series, under a folder above that names no one."""
    scans = tmp_path / f"{ROOT}_exports" / "scans"
    scans.mkdir(parents=True)
    _volume_file(_ct(), scans / "abdomen.nii.gz")
    _volume_file(_mr(), scans / "brain.nii.gz")
    _series(_mr(), scans / "brain_series", modality="MR")
    return scans


@pytest.mark.slow  # predicts three scans with the session's model (about 15 s)
def test_a_ct_model_on_mr_scans_warns_per_case_and_on_the_terminal(ct_model, tmp_path):
    lines = []
    summary = predict.predict(ct_model, str(_scans(tmp_path)), str(tmp_path / "masks"), input_partition_dims=(1, 2, 1, 1, 1),
                              log=lines.append)
    by_case = {case["case_id"]: case for case in summary["cases"]}
    assert summary["ok"] == 3 and summary["failed"] == 0 and by_case["abdomen"]["problems"] == []
    expected = {"brain": "its values do not look like Hounsfield units", "brain_series": "its DICOM Modality tag"}
    for case_id, basis in expected.items():
        warning = (f"warning: the scan is MR ({basis}) but the model was trained on 6 CT scans, so its mask is likely "
                   "wrong; predict it with a model trained on MR scans (--strict sets such scans aside as dead letters)")
        assert by_case[case_id]["problems"][:1] == [warning], case_id
        assert any(line.startswith("[") and f"] {case_id}: " in line and line.endswith(warning) for line in lines)
    # Relative to --input: no absolute path, nothing above the input folder.
    written = (tmp_path / "masks" / "summary.json").read_text()
    assert ROOT not in written and by_case["brain_series"]["source"] == "brain_series"
    assert summary["input"] == "scans"


@pytest.mark.slow  # the CLI in a fresh process (about 25 s)
def test_strict_makes_a_mismatch_a_dead_letter_and_too_many_fail_the_run(ct_model, tmp_path):
    scans, output = _scans(tmp_path), tmp_path / "masks"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "predict", "--model", ct_model, "--input", str(scans), "--output",
         str(output), "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1", "--strict"],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr.strip() == (f"fullres: error: 2 of 3 inputs failed (67%), more than --max-failed-fraction 0.1; "
                                     f"see {output / 'dead_letter.jsonl'}.")
    letters = [json.loads(line) for line in (output / "dead_letter.jsonl").read_text().splitlines()]
    assert {(letter["source"], letter["reason"]) for letter in letters} == {
        ("brain.nii.gz", "modality_mismatch"), ("brain_series", "modality_mismatch")}
    assert all(letter["detail"].startswith("the scan is MR (") for letter in letters)
    summary = json.loads((output / "summary.json").read_text())  # written before the run failed, the CT scan predicted
    assert summary["ok"] == 1 and summary["cases"][0]["case_id"] == "abdomen"
    assert "brain_series: skipped (modality_mismatch: the scan is MR (its DICOM Modality tag)" in result.stdout


@pytest.mark.slow  # predicts one scan with the session's model
def test_predict_fails_the_run_when_too_many_scans_fail_and_names_them_relative_to_the_input(ct_model, tmp_path):
    """7 of 10 scans failed and predict exited 0: now more than --max-failed-fraction (0.1, as preprocess's) is an
    error, raised after the summary and dead letters are written; they name scans relative to --input."""
    scans = tmp_path / f"{ROOT}_exports" / "scans"
    scans.mkdir(parents=True)
    _volume_file(_ct(), scans / "good.nii.gz")
    for name in ("broken.nii.gz", "truncated.nrrd"):
        (scans / name).write_bytes(b"not a volume")
    output = tmp_path / "masks"
    with pytest.raises(predict.TooManyFailed) as failed:
        predict.predict(ct_model, str(scans), str(output), input_partition_dims=(1, 2, 1, 1, 1), log=lambda line: None)
    assert str(failed.value) == (f"2 of 3 inputs failed (67%), more than --max-failed-fraction 0.1; see "
                                 f"{output / 'dead_letter.jsonl'}.")
    letters = [json.loads(line) for line in (output / "dead_letter.jsonl").read_text().splitlines()]
    assert sorted(letter["source"] for letter in letters) == ["broken.nii.gz", "truncated.nrrd"]
    for name in ("dead_letter.jsonl", "summary.json"):
        assert ROOT not in (output / name).read_text(), name  # nothing above --input, no absolute input path
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["input"] == "scans" and summary["cases"][0]["source"] == "good.nii.gz"


def test_strict_needs_a_model_that_records_what_it_was_trained_on(tmp_path):
    """A run trained before data_modality was recorded cannot be checked: --strict says so before any work."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(b"weights")
    (run / "model_info.json").write_text(json.dumps({"task": "segmentation", "preprocessing": PREPROCESSING}))
    _volume_file(_ct(), tmp_path / "a.nii.gz")
    with pytest.raises(predict.ModelRefused) as refused:
        predict.predict(str(run), str(tmp_path / "a.nii.gz"), str(tmp_path / "masks"), strict=True,
                        log=lambda line: None)
    assert str(refused.value) == (
        f"--strict checks each scan against the modality the model was trained on, but {run}/model_info.json does "
        "not record it; retrain the model with this fullres on data from `fullres preprocess ct`, or leave --strict "
        "out.")
    assert not (tmp_path / "masks").exists()


# ---------------------------------------------------------------------------------------------------------------
# No patient names: a patient-named folder, patient tags, and every byte predict writes searched.

@pytest.mark.slow  # predicts two scans with the session's model
def test_pseudonymized_predict_writes_no_patient_name_anywhere(ct_model, tmp_path):
    scans = tmp_path / f"{ROOT}_exports" / "scans"
    _series(_ct(), scans / PATIENT, patient=True)
    (scans / f"QZROE_{PATIENT}_corrupt.nii.gz").write_bytes(b"truncated")  # a dead letter that names its file
    output = tmp_path / "masks"
    lines = []
    summary = predict.predict(ct_model, str(scans), str(output), input_partition_dims=(1, 2, 1, 1, 1),
                              pseudonymize=True, max_failed_fraction=1.0, log=lines.append)
    assert summary["ok"] == 1 and summary["failed"] == 1 and summary["pseudonymized"] is True
    contents = files.snapshot(output)
    assert sorted(name.split(".")[0] for name in contents) == sorted(
        ["", "dead_letter", "summary", summary["cases"][0]["case_id"]])  # the marker, no DICOM SEG
    for marker in (PATIENT, "QZDOE", "QZJANE", "QZ7731", "QZROE", "19230517", ROOT, str(scans)):
        assert [name for name, data in contents.items() if marker.encode() in data] == [], marker
        assert [line for line in lines if marker in line] == [], marker
    # The mapping back lies beside the output, and names what each pseudonym stands for.
    mapping = json.loads((tmp_path / "masks.pseudonyms.json").read_text())
    assert mapping["cases"][summary["cases"][0]["case_id"]]["case_id"] == PATIENT
