"""`fullres predict`'s model side: the run records its preprocessing, and older runs are refused in one sentence."""

import json

import pytest

from preprocessing import ct_transforms
from trainer import config as config_lib, predict, tasks


def _run_dir(tmp_path, info: dict | None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(b"weights")
    if info is not None:
        (run / "model_info.json").write_text(json.dumps(info))
    return str(run)


def test_segmentation_task_records_the_preprocessing_of_its_training_data(tmp_path):
    recorded = ct_transforms.preprocessing_record(
        ct_transforms.CtPreprocessConfig(spacing=(0.8, 0.8, 2.5), window=(-160, 240), modality="ct"))
    (tmp_path / "summary.json").write_text(json.dumps({"preprocessing": recorded}))
    config = config_lib.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path / "run"))
    task = tasks.make_task(config)
    assert task.preprocessing() == {"spacing": [0.8, 0.8, 2.5], "orientation": "LPS", "window": [-160, 240],
                                    "modality": "ct", "shape": None}
    (tmp_path / "summary.json").write_text(json.dumps({"label_values": {"0": 1}}))  # a conversion from before
    assert task.preprocessing() is None


def test_a_run_with_its_preprocessing_is_accepted(tmp_path):
    recorded = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 2.0)))
    run = _run_dir(tmp_path, {"task": "segmentation", "image_shape": [16, 16, 16, 1], "preprocessing": recorded})
    assert predict.read_model_info(run)["preprocessing"]["spacing"] == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("info, words", [
    ({"task": "segmentation", "image_shape": [16, 16, 16, 1], "class_names": None},
     "does not record the preprocessing the model was trained with (missing: spacing, orientation, window, modality)"),
    ({"task": "segmentation", "preprocessing": {"spacing": None, "orientation": "LPS"}},
     "(missing: window, modality)"),
    ({"task": "detection", "preprocessing": None}, "is a detection model"),
    (None, "is not a fullres run"),
])
def test_a_run_predict_cannot_use_is_refused_in_one_sentence(tmp_path, info, words):
    run = _run_dir(tmp_path, info)
    with pytest.raises(predict.ModelRefused) as refused:
        predict.read_model_info(run)
    message = str(refused.value)
    assert words in message and run in message
    assert message.count(". ") == 0 and message.endswith(".")
