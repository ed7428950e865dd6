"""A data set's label_map.json has one rule: every writer's map passes the one reader, `dataset_files.read_label_map`."""

import json
import os

from preprocessing.beam import images_pipeline, local_workers
from preprocessing.images import demo_images
from preprocessing.records import dataset_files

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def test_the_ct_pipeline_s_label_map_passes_the_reader(tmp_path):
    # The CT pipeline hands this map to the conversion, which writes it as JSON beside the records.
    label_map = dataset_files.ct_label_map(("liver", "kidney"))
    (tmp_path / dataset_files.LABEL_MAP).write_text(json.dumps(label_map))
    assert dataset_files.read_label_map(str(tmp_path / "data-*.tfrecord")) == {"background": 0, "liver": 1,
                                                                                 "kidney": 2}


def test_the_images_pipeline_s_label_map_passes_the_reader(tmp_path):
    written = demo_images.write_demo_coco(str(tmp_path / "demo"), num_images=2, size=(64, 64), seed=1)
    output = tmp_path / "records"
    images_pipeline.run(written["annotations"], written["images"], str(output), pipeline_args=IN_PROCESS,
                        log=lambda line: None)
    label_map = dataset_files.read_label_map(str(output / "data-*.tfrecord"))
    assert label_map and sorted(label_map.values()) == list(range(1, len(label_map) + 1))


def test_the_demo_records_label_map_passes_the_reader(tmp_path):
    patterns = demo_images.write_demo_tfrecords(str(tmp_path), num_train=1, num_eval=1, size=(64, 64))
    for split in ("train", "eval"):
        label_map = dataset_files.read_label_map(patterns[split])
        assert dataset_files.class_names(label_map, len(label_map)) == patterns["class_names"]
        assert os.path.dirname(dataset_files.label_map_path(patterns[split])) == str(tmp_path / split)


def test_segmentation_class_names_fall_back_to_numbered_classes():
    assert dataset_files.segmentation_class_names(3) == ["background", "class_1", "class_2"]
