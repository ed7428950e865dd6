"""Every component runs alone through `kfp.local` (SubprocessRunner), fed by the previous one's artifacts.

The chain is preprocess CT → train (partitioned 4-way along depth on the 8
virtual CPU devices the test environment gives every subprocess) → evaluate →
export, plus preprocess images. A component without input artifacts is called
directly; one with inputs runs as the only step of a pipeline whose
`dsl.importer` hands it the earlier artifact (kfp.local takes input artifacts
only inside a pipeline).
"""

import json
import os

import pytest
from kfp import dsl, local

from components import image_name, steps
from pipelines import local_run
from preprocessing.ct import demo_ct
from preprocessing.images import demo_images

COMPONENTS = steps.make_components()


def run_alone(root, component, artifacts: dict, **parameters) -> dict:
    """Runs `component` alone with `artifacts` ({input: (path, artifact class)}); returns {output: (path, metadata)}."""

    @dsl.pipeline(name="alone")
    def alone():
        imported = {name: dsl.importer(artifact_uri=path, artifact_class=kind).output
                    for name, (path, kind) in artifacts.items()}
        component(**imported, **parameters)

    before = set(os.listdir(root))
    alone()
    (run,) = set(os.listdir(root)) - before
    outputs = local_run.task_outputs(os.path.join(root, run))
    (task,) = [t for t in outputs if not t.startswith("importer")]
    with open(os.path.join(root, run, task, "executor_output.json")) as file:
        executor_output = json.load(file)
    metadata = {name: entry["artifacts"][0].get("metadata", {})
                for name, entry in executor_output.get("artifacts", {}).items()}
    return {name: (path, metadata.get(name, {})) for name, path in outputs[task].items()}


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline_root")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    return root


@pytest.fixture(scope="module")
def ct_cases(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ct")
    return {split: demo_ct.write_demo_cases(str(directory / split), count, (16, 32, 32), seed=seed, formats=("nifti",))
            ["nifti"] for split, count, seed in (("train", 4, 0), ("eval", 2, 1))}


@pytest.fixture(scope="module")
def ct_datasets(runner, ct_cases):
    datasets = {}
    for split, root in ct_cases.items():
        task = COMPONENTS.preprocess_ct(input_uri=os.path.join(root, "images"), labels_uri=os.path.join(root, "labels"),
                                        spacing="2.0,2.0,2.0", window="-200,300", shape="16,16,16")
        datasets[split] = task.outputs["dataset"]
    return datasets


@pytest.fixture(scope="module")
def trained(runner, ct_datasets):
    return run_alone(runner, COMPONENTS.train, {"train_data": (ct_datasets["train"].path, dsl.Dataset)},
                     task="segmentation", preset="smoke", steps=3, batch_size=2, input_partition_dims="1,4,1,1,1")


@pytest.mark.slow
@pytest.mark.integration
def test_preprocess_ct_writes_records_and_describes_them(ct_datasets):
    dataset = ct_datasets["train"]
    with open(os.path.join(dataset.path, "summary.json")) as file:
        summary = json.load(file)
    assert summary["ok"] == 4 and summary["failed"] == 0
    assert dataset.metadata["records"] == 4
    assert any(name.startswith("data-") for name in os.listdir(dataset.path))


@pytest.mark.slow
@pytest.mark.integration
def test_train_writes_the_model_and_metrics(trained):
    model_dir = trained["model"][0]
    for name in ("model.keras", "train_config.json", "model_info.json", "history.jsonl"):
        assert os.path.exists(os.path.join(model_dir, name)), name
    assert not os.path.exists(os.path.join(model_dir, "saved_model"))  # export is its own step
    with open(os.path.join(model_dir, "train_config.json")) as file:
        assert json.load(file)["partition"]["input_partition_dims"] == [1, 4, 1, 1, 1]
    _, metrics = trained["metrics"]
    assert metrics["steps"] == 3 and metrics["final_loss"] > 0
    assert trained["model"][1]["input_partition_dims"] == [1, 4, 1, 1, 1]  # the layout trained with, in the metadata


def test_train_component_accepts_auto_partitioning():
    from components import runtime

    config = runtime.train_config(task="segmentation", preset="smoke", train_data="data/data-*", output_dir="model",
                                  steps=0, batch_size=0, learning_rate=0.0, input_partition_dims="auto", precision="",
                                  overrides={})
    assert config.partition.is_auto  # resolved by training once the devices are known


def test_train_component_builds_the_users_network_from_its_text():
    """`model_code` (the file's text, as `fullres pipeline run --model` passes it) becomes a file of the step's own."""
    from components import runtime

    code = "import keras\n\ndef build(num_classes, in_channels):\n    return None\n"
    source = runtime.model_source(code, "build")
    file, _, function = source.rpartition(":")
    assert function == "build" and open(file).read() == code
    config = runtime.train_config(task="segmentation", preset="smoke", train_data="data/data-*", output_dir="model",
                                  steps=0, batch_size=0, learning_rate=0.0, input_partition_dims="", precision="",
                                  overrides={"model.num_classes": 4}, model_source=source)
    assert (config.model.file, config.model.function, config.model.num_classes) == (file, "build", 4)
    assert runtime.model_source("", "") is None  # the task's own model
    with pytest.raises(ValueError, match=r"^model_code \(the text of your network's Python file\) and "
                                         r"model_function .* go together; pass both"):
        runtime.model_source(code, "")


@pytest.mark.slow
@pytest.mark.integration
def test_evaluate_scores_and_reports(runner, trained, ct_datasets):
    outputs = run_alone(runner, COMPONENTS.evaluate, {"model": (trained["model"][0], dsl.Model),
                                                      "eval_data": (ct_datasets["eval"].path, dsl.Dataset)},
                        class_names="background,liver,kidney", report_examples=1)
    (metrics_path, metrics), (report_path, _) = outputs["metrics"], outputs["report"]
    with open(metrics_path) as file:
        scores = json.load(file)
    assert scores["cases"] == 2 and len(scores["dice_per_class"]) == 3
    assert scores["class_names"] == ["background", "liver", "kidney"]
    assert scores["split"] == {"input_partition_dims": [1, 4, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                               "devices_present": 8, "why": "the training split", "replicas": 2}  # the step's devices
    assert "dice/liver" in metrics
    with open(report_path) as file:
        page = file.read()
    assert page.startswith("<!DOCTYPE html>") and page.count("<img") == 6  # 3 views × (true, predicted)


@pytest.mark.slow
@pytest.mark.integration
def test_export_writes_a_saved_model_that_serves(runner, trained):
    import numpy as np
    import tensorflow as tf

    outputs = run_alone(runner, COMPONENTS.export, {"model": (trained["model"][0], dsl.Model)})
    exported, metadata = outputs["exported"]
    assert metadata["framework"] == "tensorflow"
    loaded = tf.saved_model.load(os.path.join(exported, "saved_model"))
    logits = loaded.serve(tf.zeros((1, 16, 16, 16, 1)))
    assert np.asarray(logits).shape == (1, 16, 16, 16, 3)


@pytest.mark.slow
@pytest.mark.integration
def test_preprocess_images_converts_coco(runner, tmp_path):
    written = demo_images.write_demo_coco(str(tmp_path), num_images=5, size=(64, 64), seed=2)
    task = COMPONENTS.preprocess_images(annotations_uri=written["annotations"], images_uri=written["images"])
    dataset = task.outputs["dataset"]
    assert dataset.metadata["records"] == 5
    with open(os.path.join(dataset.path, "label_map.json")) as file:
        assert json.load(file) == {"circle": 1, "square": 2, "triangle": 3}


@pytest.mark.slow
@pytest.mark.integration
def test_worker_replicas_counts_hosts_beyond_the_chief(runner):
    assert COMPONENTS.worker_replicas(replica_count=4).output == 3


@dsl.component(base_image=image_name.DEFAULT_IMAGE, install_kfp_package=False)
def resolved_overrides(overrides: dict) -> str:
    """The types `runtime.train_config` ends up with for `overrides`, as KFP delivered them to the step."""
    from components import runtime

    config = runtime.train_config(task="segmentation", preset="smoke", train_data="unused-*", output_dir="unused",
                                  steps=0, batch_size=0, learning_rate=0.0, input_partition_dims="", precision="",
                                  overrides=overrides)
    values = (config.model.num_classes, config.steps, config.partition.input_partition_dims[1], config.learning_rate)
    return " ".join(f"{type(v).__name__}:{v}" for v in values)


@pytest.mark.slow
@pytest.mark.integration
def test_integer_train_overrides_stay_integers_through_kfp(runner):
    # KFP hands a dict parameter over as a protobuf Struct: every number a double. Keras refuses 2.0 classes.
    task = resolved_overrides(overrides={"model": {"num_classes": 2}, "steps": 7,
                                         "partition": {"input_partition_dims": [1, 2, 1, 1, 1]}, "learning_rate": 1})
    assert task.output == "int:2 int:7 int:2 float:1.0"


def test_fractional_value_for_an_integer_setting_is_refused():
    from trainer import config_resolution

    with pytest.raises(ValueError, match=r"^train override model.num_classes must be a whole number, got 2.5; "
                                         r"write it like 2\.$"):
        config_resolution.resolve("segmentation", "smoke", overrides={"model": {"num_classes": 2.5}})


@pytest.mark.slow
@pytest.mark.integration
def test_predict_writes_masks_in_each_scans_geometry(runner, trained, ct_cases):
    import SimpleITK as sitk

    images = os.path.join(ct_cases["eval"], "images")
    outputs = run_alone(runner, COMPONENTS.predict, {"model": (trained["model"][0], dsl.Model)}, input_uri=images)
    masks, metadata = outputs["masks"]
    assert metadata["cases"] == 2 and metadata["failed"] == 0
    assert metadata["input_partition_dims"] == [1, 4, 1, 1, 1]  # the training's split
    with open(os.path.join(masks, "summary.json")) as file:
        summary = json.load(file)
    for case in summary["cases"]:
        mask, scan = sitk.ReadImage(case["outputs"][0]), sitk.ReadImage(os.path.join(images, case["source"]))
        assert case["outputs"][0].startswith(masks) and mask.GetSize() == scan.GetSize()
        assert mask.GetSpacing() == pytest.approx(scan.GetSpacing()) and mask.GetOrigin() == pytest.approx(scan.GetOrigin())
