"""The task object owns what segmentation and detection do differently; nothing else asks which task it is."""

import os
import re

import pytest

from trainer import trained_run

from trainer import presets
from trainer.tasks import registry

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_segmentation_report_names_default_to_background_and_numbered_classes():
    task = registry.make_task(presets.smoke(train_data="/nowhere/train-*.tfrecord"))
    assert task.report_class_names(None) == ["background", "class_1", "class_2"]
    assert task.report_class_names(["bg", "liver", "tumour"]) == ["bg", "liver", "tumour"]
    with pytest.raises(ValueError, match="^2 class names given for a model of 3 classes; give one name per class"):
        task.report_class_names(["bg", "liver"])


def test_a_folder_without_a_trained_model_is_named():
    with pytest.raises(FileNotFoundError, match="has no train_config.json; pass the output directory of `fullres train`"):
        trained_run.open_run("/nowhere")


# Where the config is resolved from a task name (its default preset, its label map, which flags apply): only
# trainer/config.py, which the CLI and the KFP component both call (config.resolve); nowhere else.
CHOOSE_THE_PRESET = {"trainer/config.py"}


def test_no_module_branches_on_the_task_name():
    pattern = re.compile(r"""(task\.name|config\.task|\btask)\s*[!=]=\s*["'](segmentation|detection)["']""")
    found = []
    scanned = 0
    for package in ("trainer", "components", "pipelines"):
        for folder, _, names in sorted(os.walk(os.path.join(REPOSITORY, package))):
            for name in sorted(names):
                relative = os.path.relpath(os.path.join(folder, name), REPOSITORY)
                if name.endswith(".py") and relative not in CHOOSE_THE_PRESET:
                    scanned += 1
                    with open(os.path.join(folder, name)) as file:
                        found += [f"{relative}: {line.strip()}" for line in file if pattern.search(line)]
    assert found == [] and scanned > 40  # every module, subpackages too
