"""No patient identifiers in outputs: every PHI field and folder name carries a marker, and every output byte is searched.

The claims, precisely:
- Without `--pseudonymize`, no DICOM patient attribute and nothing above the
  input folder (absolute paths) reaches any output; cases are named by their
  folder or file names relative to the input, which the user chose.
- With `--pseudonymize`, not even those names do: no marker appears in any
  output byte. The mapping back lies beside the output directory, not in it.
"""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from common import identifiers
from preprocessing.beam import ct_pipeline, local_workers
from preprocessing.ct import demo_ct

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG, FOLDER, ROOT = "PHITAGMARKER", "PHIFOLDERMARKER", "PHIROOTMARKER"
BIRTH_DATE = "19230517"
PHI_ATTRIBUTES = ("PatientName", "PatientID", "OtherPatientIDs", "PatientAddress", "InstitutionName",
                  "InstitutionAddress", "InstitutionalDepartmentName", "AccessionNumber", "ReferringPhysicianName",
                  "PerformingPhysicianName", "OperatorsName", "RequestingPhysician", "StudyID", "StudyDescription",
                  "SeriesDescription", "PhysiciansOfRecord", "NameOfPhysiciansReadingStudy")


def _inputs(tmp_path):
    """A PACS-style export: folders named after patients, PHI in every DICOM field, and three bad inputs."""
    root = tmp_path / f"{ROOT}_exports"
    images, labels = root / "images", root / "labels"
    volume, label = demo_ct.synthetic_case(np.random.default_rng(0), (6, 12, 12))
    series = images / f"DOE^{FOLDER}_JOHN"
    for path in demo_ct.write_dicom_series(volume, str(series)):
        dataset = pydicom.dcmread(path)
        for attribute in PHI_ATTRIBUTES:
            setattr(dataset, attribute, f"{TAG} {attribute}"[:16] if attribute in ("PatientID", "AccessionNumber", "StudyID") else f"{TAG}^{attribute}")
        dataset.PatientBirthDate = BIRTH_DATE
        dataset.save_as(path)
    label_image = sitk.GetImageFromArray(label)
    label_image.SetSpacing((1.0, 1.0, 1.0))
    labels.mkdir()
    sitk.WriteImage(label_image, str(labels / f"DOE^{FOLDER}_JOHN.nii.gz"))
    (images / f"{FOLDER}_stray").mkdir()
    (images / f"{FOLDER}_stray" / "readme.dcm").write_bytes(f"not DICOM, from {FOLDER}".encode())  # discovery dead letter
    sitk.WriteImage(sitk.GetImageFromArray(volume), str(images / f"SMITH_{FOLDER}_nolabel.nii.gz"))  # pairing dead letter
    (images / f"ROE_{FOLDER}_corrupt.nii.gz").write_bytes(b"truncated")  # worker dead letter, SimpleITK names the path
    sitk.WriteImage(label_image, str(labels / f"ROE_{FOLDER}_corrupt.nii.gz"))
    return images, labels


def _output_bytes(output) -> dict[str, bytes]:
    """Every file under the output, TFRecords decompressed."""
    contents = {}
    for directory, _, names in os.walk(output):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                data = file.read()
            contents[os.path.relpath(path, output)] = gzip.decompress(data) if name.endswith(".gz") else data
    return contents


def _found(contents: dict[str, bytes], marker: str) -> list[str]:
    return [name for name, data in contents.items() if marker.encode() in data]


@pytest.mark.slow
def test_no_dicom_patient_attribute_and_no_absolute_path_reaches_outputs(tmp_path):
    images, labels = _inputs(tmp_path)
    summary = ct_pipeline.run(str(images), str(tmp_path / "out"), labels=str(labels), pipeline_args=IN_PROCESS,
                              max_failed_fraction=1.0, log=lambda line: None)
    assert summary["ok"] == 1 and summary["failed"] == 3 and summary["pseudonymized"] is False
    contents = _output_bytes(tmp_path / "out")
    assert sorted(contents) == [".fullres-output", "data-00000-of-00001.tfrecord", "dead_letter.jsonl", "summary.json"]
    for marker in (TAG, BIRTH_DATE, ROOT, str(tmp_path)):
        assert _found(contents, marker) == [], marker
    letters = [json.loads(line) for line in contents["dead_letter.jsonl"].decode().splitlines()]
    assert sorted(letter["source"] for letter in letters) == sorted([  # relative to the input folder
        f"ROE_{FOLDER}_corrupt.nii.gz", f"SMITH_{FOLDER}_nolabel.nii.gz", f"{FOLDER}_stray/readme.dcm"])
    corrupt = next(letter for letter in letters if letter["reason"] == "unreadable" and "corrupt" in letter["source"])
    assert f"cannot read ROE_{FOLDER}_corrupt.nii.gz" in corrupt["detail"]  # the worker's detail, made relative
    # The case keeps the name the user gave its folder, relative to the input.
    assert f"DOE^{FOLDER}_JOHN".encode() in contents["data-00000-of-00001.tfrecord"]


@pytest.mark.slow
def test_pseudonymized_outputs_hold_no_marker_at_all(tmp_path):
    images, labels = _inputs(tmp_path)
    output = tmp_path / "out"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "preprocess", "ct", "--input", str(images), "--labels", str(labels),
         "--output", str(output), "--pseudonymize", "--compress", "--max-failed-fraction", "1", "--workers", "1"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr[-2000:]
    contents = _output_bytes(output)
    assert sorted(contents) == [".fullres-output", "data-00000-of-00001.tfrecord.gz", "dead_letter.jsonl", "summary.json"]
    for marker in (TAG, BIRTH_DATE, FOLDER, ROOT, "DOE", "SMITH", "ROE", "JOHN"):
        assert _found(contents, marker) == [], marker
    summary = json.loads(contents["summary.json"])
    assert summary["ok"] == 1 and summary["failed"] == 3 and summary["pseudonymized"] is True

    # The mapping and the key lie beside the output directory, not in it, and map every pseudonym back.
    mapping = json.loads((tmp_path / "out.pseudonyms.json").read_text())
    key = (tmp_path / "out.pseudonym-key").read_bytes().strip()
    by_original = {entry["case_id"]: (pseudonym, entry) for pseudonym, entry in mapping["cases"].items()}
    case_id, entry = by_original[f"DOE^{FOLDER}_JOHN"]
    assert entry == {"case_id": f"DOE^{FOLDER}_JOHN", "image": f"DOE^{FOLDER}_JOHN",
                     "label": f"labels/DOE^{FOLDER}_JOHN.nii.gz"}
    assert case_id == identifiers.pseudonym(key, f"DOE^{FOLDER}_JOHN") and case_id.encode() in contents["data-00000-of-00001.tfrecord.gz"]
    letters = [json.loads(line) for line in contents["dead_letter.jsonl"].decode().splitlines()]
    originals = sorted(mapping["files"][letter["source"]] if letter["source"] in mapping["files"]
                       else mapping["cases"][letter["source"]]["image"] for letter in letters)
    assert originals == sorted([f"ROE_{FOLDER}_corrupt.nii.gz", f"SMITH_{FOLDER}_nolabel.nii.gz", f"{FOLDER}_stray/readme.dcm"])
    assert oct(os.stat(tmp_path / "out.pseudonym-key").st_mode & 0o777) == "0o600"


def test_pseudonyms_are_stable_for_one_key_and_differ_between_keys():
    assert identifiers.pseudonym(b"k" * 32, "DOE^JOHN") == identifiers.pseudonym(b"k" * 32, "DOE^JOHN")
    assert identifiers.pseudonym(b"k" * 32, "DOE^JOHN") != identifiers.pseudonym(b"j" * 32, "DOE^JOHN")
    assert identifiers.pseudonym(b"k" * 32, "DOE^JOHN").startswith("case-")
