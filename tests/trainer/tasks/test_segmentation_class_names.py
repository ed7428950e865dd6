"""A segmentation run's class names come from its training data's label_map.json: they reach
model_info.json, and from there predict's summary and the DICOM SEG's segment labels (which said class_1, class_2)."""

import json

import pytest

from preprocessing.ct import demo_ct
from preprocessing.records import dataset_files
from trainer import presets, trained_run
from trainer.engine import run_files
from trainer.predict import predict
from trainer.tasks import registry


def test_the_label_map_names_the_classes_in_model_info(tmp_path):
    data = demo_ct.write_demo_tfrecords(str(tmp_path / "data"), num_train=1, num_eval=0, shape=(8, 8, 8))
    config = presets.smoke(train_data=data["train"])
    assert registry.make_task(config).class_names is None  # no label map: predict then says class_1, class_2
    dataset_files.write_label_map(str(tmp_path / "data"), {"background": 0, "liver": 1, "spleen": 2})
    task = registry.make_task(config)
    assert task.class_names == ["background", "liver", "spleen"]
    run = tmp_path / "run"
    run.mkdir()
    run_files.save_description(str(run), config, task, (8, 8, 8, 1))
    info = json.loads((run / "model_info.json").read_text())
    assert info["class_names"] == ["background", "liver", "spleen"]
    assert predict._class_names(info, 3)[1:] == ["liver", "spleen"]  # the DICOM SEG's segment labels
    assert trained_run.open_run(str(run)).task.report_class_names(None) == ["background", "liver", "spleen"]


def test_a_label_map_that_skips_an_id_names_it_by_number(tmp_path):
    data = demo_ct.write_demo_tfrecords(str(tmp_path / "data"), num_train=1, num_eval=0, shape=(8, 8, 8))
    dataset_files.write_label_map(str(tmp_path / "data"), {"background": 0, "kidney": 2})
    task = registry.make_task(presets.smoke(train_data=data["train"]))
    assert task.class_names == ["background", "class_1", "kidney"]


def test_names_given_to_a_run_name_its_classes_where_its_data_name_none(tmp_path):
    """The pipelines' `class_names` reach the run (its model_info.json said null, and predict class_1, class_2);
    where the data's label map names the classes, other names are refused, not silently put in their place."""
    data = demo_ct.write_demo_tfrecords(str(tmp_path / "data"), num_train=1, num_eval=0, shape=(8, 8, 8))
    config = presets.smoke(train_data=data["train"])
    task = registry.make_task(config, ["background", "liver", "kidney"])
    assert task.class_names == ["background", "liver", "kidney"]
    run = tmp_path / "run"
    run.mkdir()
    run_files.save_description(str(run), config, task, (8, 8, 8, 1))
    assert json.loads((run / "model_info.json").read_text())["class_names"] == ["background", "liver", "kidney"]
    with pytest.raises(ValueError, match=r"^2 class names given for a model of 3 classes; give one name per class"):
        registry.make_task(config, ["background", "liver"])
    dataset_files.write_label_map(str(tmp_path / "data"), {"background": 0, "liver": 1, "spleen": 2})
    assert registry.make_task(config, ["background", "liver", "spleen"]).class_names == ["background", "liver",
                                                                                          "spleen"]
    with pytest.raises(ValueError) as refused:
        registry.make_task(config, ["background", "liver", "kidney"])
    assert str(refused.value) == (f"class_names background,liver,kidney are not the names the label_map.json beside "
                                  f"{data['train']} gives its classes (background,liver,spleen); leave class_names "
                                  "out, or give those.")
