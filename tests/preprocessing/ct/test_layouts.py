"""Pairing images with label maps in the layouts people download, and never guessing."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

from preprocessing.beam import ct_pipeline, local_workers
from preprocessing.ct import ct_transforms, label_pairing
from preprocessing.records import tfrecord_schema
from trainer.data import ct_input

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
CONFIG = ct_transforms.CtPreprocessConfig(modality="ct")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _case(seed: int):
    """A small CT-like volume and a label map whose single blob position depends on `seed`."""
    rng = np.random.default_rng(seed)
    volume = rng.normal(40, 20, (6, 8, 10)).astype(np.float32)
    volume[:, :2] = -1000.0  # air, so it reads as CT
    label = np.zeros((6, 8, 10), np.uint8)
    z, y, x = seed % 4, 2 + seed % 3, seed % 7
    label[z:z + 2, y:y + 3, x:x + 2] = 1 + seed % 2
    return volume, label


def _write(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = sitk.GetImageFromArray(array)
    image.SetSpacing((1.0, 1.0, 2.0))
    sitk.WriteImage(image, str(path))


def _write_case(image_path, label_path, seed):
    volume, label = _case(seed)
    if image_path:
        _write(image_path, volume)
    if label_path:
        _write(label_path, label)
    return label


def _pairs(pairing):
    return {case.case_id: (os.path.basename(case.image.path), os.path.basename(case.label.path) if case.label else None)
            for case in pairing.cases}


@pytest.fixture()
def nnunet(tmp_path):
    """nnU-Net raw data: channel suffixes, a two-channel case, test images, dataset.json, macOS '._' debris."""
    root = tmp_path / "Dataset004_Hippocampus"
    truth = {}
    for seed, case_id in enumerate(("hippocampus_001", "hippocampus_017")):
        truth[case_id] = _write_case(root / "imagesTr" / f"{case_id}_0000.nii.gz", root / "labelsTr" / f"{case_id}.nii.gz",
                                     seed)
    _write(root / "imagesTr" / "hippocampus_017_0001.nii.gz", _case(9)[0])  # a second channel
    _write(root / "imagesTs" / "hippocampus_200_0000.nii.gz", _case(5)[0])
    (root / "imagesTr" / "._hippocampus_001_0000.nii.gz").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (root / "dataset.json").write_text(json.dumps({"channel_names": {"0": "MRI"}, "file_ending": ".nii.gz"}))
    return root, truth


def test_nnunet_dataset_folder_pairs_without_labels_option(nnunet):
    root, _ = nnunet
    pairing = label_pairing.pair(str(root))
    assert _pairs(pairing) == {"hippocampus_001": ("hippocampus_001_0000.nii.gz", "hippocampus_001.nii.gz"),
                               "hippocampus_017": ("hippocampus_017_0000.nii.gz", "hippocampus_017.nii.gz")}
    assert pairing.layout == "nnunet" and pairing.dead == []
    notes = " ".join(pairing.notes)
    assert "hippocampus_017_0001.nii.gz" in notes and "one channel" in notes  # channel 0 used, the others reported
    assert "imagesTs" in notes and "hippocampus_200_0000.nii.gz" in notes


def test_nnunet_images_and_labels_folders_given_separately(nnunet):
    root, _ = nnunet
    pairing = label_pairing.pair(str(root / "imagesTr"), str(root / "labelsTr"))
    assert sorted(_pairs(pairing)) == ["hippocampus_001", "hippocampus_017"] and pairing.layout == "nnunet"
    assert pairing.dead == []


def test_msd_without_channel_suffix(tmp_path):
    for seed, case_id in enumerate(("liver_0", "liver_12")):
        _write_case(tmp_path / "Task03_Liver" / "imagesTr" / f"{case_id}.nii.gz",
                    tmp_path / "Task03_Liver" / "labelsTr" / f"{case_id}.nii.gz", seed)
    pairing = label_pairing.pair(str(tmp_path / "Task03_Liver"))
    assert _pairs(pairing) == {"liver_0": ("liver_0.nii.gz", "liver_0.nii.gz"),
                               "liver_12": ("liver_12.nii.gz", "liver_12.nii.gz")}
    assert pairing.layout == "msd"
    assert all("imagesTr" in c.image.path and "labelsTr" in c.label.path for c in pairing.cases)


@pytest.fixture()
def kits(tmp_path):
    """KiTS23: case folders with imaging + segmentation, and per-annotator instances/ files."""
    root = tmp_path / "kits23" / "dataset"
    truth = {}
    for seed, case_id in enumerate(("case_00000", "case_00001")):
        truth[case_id] = _write_case(root / case_id / "imaging.nii.gz", root / case_id / "segmentation.nii.gz", seed)
        _write(root / case_id / "instances" / "kidney_instance-1_annotation-1.nii.gz", _case(seed)[1])
    return root, truth


def test_kits_case_folders(kits):
    root, _ = kits
    for labels in (None, str(root)):  # --labels may name the input folder: the names say which is which
        pairing = label_pairing.pair(str(root), labels)
        assert _pairs(pairing) == {"case_00000": ("imaging.nii.gz", "segmentation.nii.gz"),
                                   "case_00001": ("imaging.nii.gz", "segmentation.nii.gz")}
        assert all(os.path.dirname(c.image.path) == os.path.dirname(c.label.path) for c in pairing.cases)
        assert pairing.layout == "kits" and pairing.dead == []
        assert "kidney_instance-1_annotation-1.nii.gz" in " ".join(pairing.notes)


@pytest.fixture()
def side_by_side(tmp_path):
    """Images and label maps in one folder, three suffix conventions, mixed case and formats."""
    root = tmp_path / "lung"
    truth = {
        "lung1": _write_case(root / "lung1_image.nrrd", root / "lung1_label.nrrd", 0),
        "LUNG2": _write_case(root / "LUNG2_IMG.nii.gz", root / "LUNG2_SEG.nii.gz", 1),
        "lung3": _write_case(root / "lung3_ct.mha", root / "lung3-Mask.mha", 2),
    }
    return root, truth


def test_side_by_side_suffixes(side_by_side):
    root, _ = side_by_side
    for labels in (None, str(root)):
        pairing = label_pairing.pair(str(root), labels)
        assert _pairs(pairing) == {"lung1": ("lung1_image.nrrd", "lung1_label.nrrd"),
                                   "LUNG2": ("LUNG2_IMG.nii.gz", "LUNG2_SEG.nii.gz"),
                                   "lung3": ("lung3_ct.mha", "lung3-Mask.mha")}
        assert pairing.layout == "side_by_side" and pairing.dead == []


def test_side_by_side_images_with_labels_in_their_own_folder(tmp_path):
    _write_case(tmp_path / "images" / "p7_ct.nii.gz", tmp_path / "labels" / "p7_seg.nii.gz", 0)
    pairing = label_pairing.pair(str(tmp_path / "images"), str(tmp_path / "labels"))
    assert _pairs(pairing) == {"p7": ("p7_ct.nii.gz", "p7_seg.nii.gz")}


@pytest.mark.parametrize("layout", ["nnunet", "kits", "side_by_side"])
def test_each_layout_converts_with_the_right_label_in_each_record(layout, request, tmp_path):
    root, truth = request.getfixturevalue(layout)
    summary = ct_pipeline.run(str(root), str(tmp_path / "out"), config=CONFIG, pipeline_args=IN_PROCESS,
                              log=lambda line: None)
    assert summary["layout"] == layout and summary["ok"] == len(truth) and summary["failed"] == 0
    records = {example["case_id"]: example["label"]
               for example in ct_input.read_examples(str(tmp_path / "out" / "data-*.tfrecord"))}
    assert sorted(records) == sorted(truth)
    for case_id, label in truth.items():
        np.testing.assert_array_equal(records[case_id], label, err_msg=case_id)


def test_same_folder_without_names_that_say_which_is_refused(tmp_path):
    for name in ("lung1", "lung1b"):
        _write(tmp_path / f"{name}.nrrd", _case(0)[0])
    with pytest.raises(ValueError) as error:
        label_pairing.pair(str(tmp_path), str(tmp_path))
    message = str(error.value)
    assert message.startswith(f"--labels {tmp_path} is the --input folder, and no file name there says which files "
                              "are label maps;")
    assert "CASE_label.nii.gz beside CASE_image.nii.gz" in message and "manifest CSV" in message


def test_a_file_is_never_its_own_label_and_manifest_labels_are_not_cases(tmp_path):
    volume, label = _case(0)
    _write(tmp_path / "scan.nrrd", volume)
    _write(tmp_path / "truth.nrrd", label)
    _write(tmp_path / "other.nrrd", volume)
    (tmp_path / "manifest.csv").write_text("image,label\nscan.nrrd,truth.nrrd\nother.nrrd,other.nrrd\n")
    pairing = label_pairing.pair(str(tmp_path), str(tmp_path / "manifest.csv"))
    assert _pairs(pairing) == {"scan": ("scan.nrrd", "truth.nrrd")}  # truth.nrrd is a label map, not a case
    reasons = {(os.path.basename(d["source"]), d["reason"]) for d in pairing.dead}
    assert reasons == {("manifest.csv:3", "label_is_image"), ("other.nrrd", "missing_label")}
    letter = next(d for d in pairing.dead if d["reason"] == "label_is_image")
    assert "other.nrrd as both image and label map" in letter["detail"]


def test_labels_folder_above_the_images_does_not_pair_images_with_themselves(tmp_path):
    _write_case(tmp_path / "images" / "a.nii.gz", tmp_path / "labels" / "a.nii.gz", 0)
    pairing = label_pairing.pair(str(tmp_path / "images"), str(tmp_path))
    assert [(c.case_id, c.image.path, c.label.path) for c in pairing.cases] == [
        ("a", str(tmp_path / "images" / "a.nii.gz"), str(tmp_path / "labels" / "a.nii.gz"))]


def test_two_label_maps_for_one_case_name_both_files(tmp_path):
    _write_case(tmp_path / "lung1_image.nrrd", tmp_path / "lung1_label.nrrd", 0)
    _write(tmp_path / "lung1_seg.nrrd", _case(1)[1])
    pairing = label_pairing.pair(str(tmp_path))
    letter = next(d for d in pairing.dead if d["reason"] == "duplicate_case_id")
    assert {os.path.basename(letter["source"]), os.path.basename(letter["detail"].split(" is also used by ")[1].split(";")[0])} \
        == {"lung1_label.nrrd", "lung1_seg.nrrd"}


@pytest.mark.slow
def test_cli_pairs_image_and_label_side_by_side_as_a_user_would(side_by_side, tmp_path):
    """The issue's case: `lung1_image.nrrd` and `lung1_label.nrrd` with --labels naming the same folder."""
    root, truth = side_by_side
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "preprocess", "ct", "--input", str(root), "--labels", str(root),
         "--output", str(tmp_path / "out"), "--workers", "1"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 cases (side_by_side layout)" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 3 and summary["layout"] == "side_by_side"
    assert summary["normalization"] == {"ct_window": 3, "zscore": 0}
    for example in ct_input.read_examples(str(tmp_path / "out" / "data-*.tfrecord")):
        np.testing.assert_array_equal(example["label"], truth[example["case_id"]])  # the label map, not the CT cast
        assert example["image"].min() >= 0 and example["image"].max() <= 1
    # No --spacing: each case keeps its own (1, 1, 2) mm instead of being resampled to 1 mm.
    import tensorflow as tf

    for serialized in tf.data.TFRecordDataset(str(tmp_path / "out" / "data-00000-of-00001.tfrecord")):
        parsed = tfrecord_schema.parse_ct_example(serialized)
        np.testing.assert_allclose(parsed["spacing"].numpy(), (1.0, 1.0, 2.0))
        assert tuple(parsed["image"].shape[:3]) == (6, 8, 10) and parsed["normalization"].numpy() == b"ct_window"
