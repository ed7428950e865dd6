"""A whole `ct-segmentation` pipeline run with `pseudonymize=true` on a PACS-style export writes no patient name.

The export names the patient in its folder, its label file and its DICOM tags (PatientName, PatientID,
PatientBirthDate). `fullres pipeline run --local` runs every step (preprocess train and eval, train, evaluate
with its HTML report, export, predict) through kfp.local; then every byte under the pipeline root and every line
the run printed are searched. The mappings back to the patients and their keys, which preprocess and predict
write beside their artifacts, are the only files allowed to hold the names.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from preprocessing.ct import demo_ct

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATIENT = "DOE_JANE_PID-7731"
MARKERS = (PATIENT, "DOE", "JANE", "7731", "19230517")


def _export(root, seed: int):
    """A patient-named DICOM series and its label map, as a PACS export lays them out."""
    import pydicom
    import SimpleITK as sitk

    images, labels = root / "images", root / "labels"
    volume, label = demo_ct.synthetic_case(np.random.default_rng(seed), (16, 32, 32))
    for path in demo_ct.write_dicom_series(volume, str(images / PATIENT), spacing=(1.0, 1.0, 1.0)):
        dataset = pydicom.dcmread(path)
        dataset.PatientName, dataset.PatientID, dataset.PatientBirthDate = "DOE^JANE", "PID-7731", "19230517"
        dataset.save_as(path)
    labels.mkdir()
    sitk.WriteImage(sitk.GetImageFromArray(label), str(labels / f"{PATIENT}.nii.gz"))
    return images, labels


def test_a_pseudonymized_pipeline_run_writes_no_patient_name_anywhere(tmp_path):
    train_images, train_labels = _export(tmp_path / "train", 5)
    eval_images, eval_labels = _export(tmp_path / "eval", 6)
    root = tmp_path / "pipeline-root"
    parameters = {
        "train_input_uri": train_images, "train_labels_uri": train_labels, "eval_input_uri": eval_images,
        "eval_labels_uri": eval_labels, "predict_input_uri": eval_images, "pseudonymize": "true",
        "preset": "smoke", "steps": "1", "batch_size": "1", "input_partition_dims": "1,1,1,1,1",
        "spacing": "2.0,2.0,2.0", "window": "-200,300", "shape": "16,16,16",
        "class_names": ",".join(demo_ct.CLASS_NAMES),
    }
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "FULLRES_VERBOSE")}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline-root", str(root),
         *[f"--param={key}={value}" for key, value in parameters.items()]],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "predict/masks: " in result.stdout and "evaluate/report: " in result.stdout  # every step ran
    for marker in MARKERS:
        assert marker not in result.stdout and marker not in result.stderr, marker
    outputs = dict(re.findall(r"^([a-z0-9-]+/[a-z_]+): (/\S+)$", result.stdout, re.MULTILINE))  # task/output: path
    with open(os.path.join(outputs["predict/masks"], "summary.json")) as file:
        assert json.load(file)["cases"][0]["case_id"].startswith("case-")  # predict's own key: its own pseudonym
    with open(outputs["evaluate/report"]) as file:
        report = file.read()
    pseudonyms = set()
    for key, path in outputs.items():
        if key.startswith("preprocess-ct") and key.endswith("/dataset"):
            with open(path + ".pseudonyms.json") as file:
                pseudonyms |= set(json.load(file)["cases"])
    assert len(pseudonyms) == 2 and any(f"<h3>{case_id}</h3>" in report for case_id in pseudonyms)  # a pseudonym
    searched, beside = set(), []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith((".pseudonyms.json", ".pseudonym-key")):
                beside.append(name)
                continue
            with open(os.path.join(directory, name), "rb") as file:
                data = file.read()
            searched.add(name)
            for marker in MARKERS:
                assert marker.encode() not in data, (marker, os.path.join(directory, name))
    # Among what was read: the records and their summary, the model, the SavedModel, the report, the masks.
    assert {"model.keras", "saved_model.pb", "summary.json", "dead_letter.jsonl", "model_info.json"} <= searched
    assert any(n.endswith(".tfrecord") for n in searched) and any(n.endswith(".nii.gz") for n in searched)
    assert "report" in searched or any(n.endswith(".html") for n in searched)
    # preprocess (train and eval) and predict each keep their own mapping and key beside their output.
    assert sorted(beside) == sorted(["dataset.pseudonym-key", "dataset.pseudonyms.json"] * 2
                                    + ["masks.pseudonym-key", "masks.pseudonyms.json"])
