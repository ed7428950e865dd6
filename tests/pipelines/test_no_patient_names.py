"""One whole `ct-segmentation` pipeline run through kfp.local, checked for two things users rely on:

1. With `pseudonymize=true` on a PACS-style export, it writes no patient name. The export names the patient in
   its folder, its label file and its DICOM tags (PatientName, PatientID, PatientBirthDate). `fullres pipeline
   run --local` runs every step (preprocess train and eval, train, evaluate with its HTML report, export,
   predict); then every byte under the pipeline root and every line the run printed are searched. The mappings
   back to the patients and their keys, which preprocess and predict write beside their artifacts, are the only
   files allowed to hold the names.
2. It trains a user's network: `--model FILE.py:FUNCTION` passes the file's text (the steps run where its path
   does not exist), the train step builds it, and evaluate, export and predict rebuild it from the run's copy;
   each scan split over 2 virtual devices.

One run for both (they were two runs, 250 and 200 test-seconds in CI): one case per split, one training step,
the fewest a whole run allows.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from preprocessing.ct import demo_ct

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.integration]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Markers no timestamp, path or compressed byte can spell by chance: "7731" alone matched a run directory's
# microseconds (08-51-06-377317) and failed CI once.
PATIENT = "QZDOE_QZJANE_PID-QZ7731"
MARKERS = (PATIENT, "QZDOE", "QZJANE", "QZ7731", "19230517")


def _export(root, seed: int):
    """A patient-named DICOM series and its label map, as a PACS export lays them out."""
    import pydicom
    import SimpleITK as sitk

    images, labels = root / "images", root / "labels"
    volume, label = demo_ct.synthetic_case(np.random.default_rng(seed), (16, 32, 32))
    for path in demo_ct.write_dicom_series(volume, str(images / PATIENT), spacing=(1.0, 1.0, 1.0)):
        dataset = pydicom.dcmread(path)
        dataset.PatientName, dataset.PatientID, dataset.PatientBirthDate = "QZDOE^QZJANE", "PID-QZ7731", "19230517"
        dataset.save_as(path)
    labels.mkdir()
    sitk.WriteImage(sitk.GetImageFromArray(label), str(labels / f"{PATIENT}.nii.gz"))
    return images, labels


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """The run: its completed process, its outputs by `task/output`, its pipeline root and the user's network."""
    folder = tmp_path_factory.mktemp("pseudonymized_user_network")
    network = folder / "nets" / "my_net.py"
    network.parent.mkdir()
    shutil.copy(os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py"), network)
    train_images, train_labels = _export(folder / "train", 5)
    eval_images, eval_labels = _export(folder / "eval", 6)
    root = folder / "pipeline-root"
    parameters = {
        "train_input_uri": train_images, "train_labels_uri": train_labels, "eval_input_uri": eval_images,
        "eval_labels_uri": eval_labels, "predict_input_uri": eval_images, "pseudonymize": "true",
        "preset": "smoke", "steps": "1", "batch_size": "1", "input_partition_dims": "1,2,1,1,1",
        "spacing": "2.0,2.0,2.0", "window": "-200,300", "shape": "16,16,16",
        "class_names": ",".join(demo_ct.CLASS_NAMES),
    }
    environment = {k: v for k, v in os.environ.items() if k != "FULLRES_VERBOSE"}
    environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # every step's process: 2 CPU devices
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline-root", str(root),
         "--model", f"{network}:residual_groupnorm", *[f"--param={key}={value}" for key, value in parameters.items()]],
        capture_output=True, text=True, cwd=str(folder), env=environment, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = dict(re.findall(r"^([a-z0-9-]+/[a-z_]+): (/\S+)$", result.stdout, re.MULTILINE))  # task/output: path
    return result, outputs, root, network


def test_a_pseudonymized_pipeline_run_writes_no_patient_name_anywhere(pipeline_run):
    result, outputs, root, _ = pipeline_run
    assert "predict/masks" in outputs and "evaluate/report" in outputs  # every step ran
    for marker in MARKERS:
        assert marker not in result.stdout and marker not in result.stderr, marker
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


def test_the_ct_pipeline_trains_evaluates_exports_and_predicts_a_users_network(pipeline_run):
    _, outputs, _, network = pipeline_run
    model = outputs["train/model"]
    assert json.load(open(os.path.join(model, "train_config.json")))["model"]["function"] == "residual_groupnorm"
    assert open(os.path.join(model, "model_source.py")).read() == network.read_text()  # the run's own copy
    assert os.path.isfile(os.path.join(outputs["export/exported"], "saved_model", "saved_model.pb"))
    assert json.load(open(outputs["evaluate/metrics"]))["cases"] == 1
    predicted = json.load(open(os.path.join(outputs["predict/masks"], "summary.json")))
    assert predicted["ok"] == 1 and predicted["input_partition_dims"] == [1, 2, 1, 1, 1]
