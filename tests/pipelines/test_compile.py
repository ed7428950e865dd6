"""The committed pipeline YAML is what `fullres pipeline compile` writes today, byte for byte."""

import os
import re
import subprocess
import sys

import yaml

from pipelines import definitions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_committed_yaml_matches_a_fresh_compile(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "pipeline", "compile", "--output-dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    for name, file_name in definitions.COMPILED_FILES.items():
        with open(os.path.join(ROOT, file_name)) as file:
            committed = file.read()
        with open(tmp_path / file_name) as file:
            fresh = file.read()
        assert fresh == committed, f"{file_name} is stale: run `fullres pipeline compile` and commit it ({name})"


def test_compiling_is_deterministic(tmp_path):
    first = definitions.compile_pipeline(definitions.CT_PIPELINE, str(tmp_path / "a.yaml"))
    second = definitions.compile_pipeline(definitions.CT_PIPELINE, str(tmp_path / "b.yaml"))
    assert open(first).read() == open(second).read()


def test_the_image_is_a_compile_option(tmp_path):
    path = definitions.compile_pipeline(definitions.DETECTION_PIPELINE, str(tmp_path / "d.yaml"), image="example/fullres:gpu")
    spec = yaml.safe_load(open(path))
    images = {executor["container"]["image"] for executor in spec["deploymentSpec"]["executors"].values()
              if "container" in executor and "image" in executor["container"]}
    assert "example/fullres:gpu" in images and definitions.image_name.DEFAULT_IMAGE not in images


def test_the_pipeline_has_every_step_and_the_accelerator_parameters():
    spec = yaml.safe_load(open(os.path.join(ROOT, "pipeline.yaml")))
    assert spec["pipelineInfo"]["name"] == "ct-segmentation"
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    for name in ("accelerator_type", "accelerator_count", "machine_type", "tpu_topology", "replica_count",
                 "input_partition_dims", "beam_args"):
        assert name in parameters
    components = spec["components"]
    for step in ("comp-preprocess-ct", "comp-train", "comp-evaluate", "comp-export"):
        assert any(c.startswith(step) for c in components), step
    # The accelerator branches run the train component as a Vertex custom job, its machine from the parameters.
    # So does the optional predict step (one host, the same machine), when predict_input_uri is given.
    custom_jobs = [c for c in components.values()
                   if "worker_pool_specs" in c.get("inputDefinitions", {}).get("parameters", {})]
    assert sorted(c["executorLabel"].rsplit("-", 1)[0] for c in custom_jobs) == ["exec-predict"] * 3 + ["exec-train"] * 3
    assert parameters["predict_input_uri"]["defaultValue"] == ""
    assert any(c.startswith("comp-predict") for c in components)
    text = open(os.path.join(ROOT, "pipeline.yaml")).read()
    assert "tpu_topology: '{{$.inputs.parameters[''pipelinechannel--tpu_topology'']}}'" in text
    assert "accelerator_type: '{{$.inputs.parameters[''pipelinechannel--accelerator_type'']}}'" in text


def test_parameters_are_listed_with_types_and_defaults():
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "pipeline", "parameters", "--pipeline", "detection"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}
    assert rows["train_annotations_uri"] == ["String", "(required)"]
    assert rows["accelerator_type"] == ["String", '"CPU"']
    assert rows["replica_count"] == ["Integer", "1"]


def test_every_custom_job_is_scheduled_by_the_pipeline_parameters():
    """strategy (STANDARD / SPOT / FLEX_START), max_wait_duration and restart_job_on_worker_restart reach the
    Vertex custom job of every accelerator branch, in both pipelines."""
    for file_name in definitions.COMPILED_FILES.values():
        spec = yaml.safe_load(open(os.path.join(ROOT, file_name)))
        parameters = spec["root"]["inputDefinitions"]["parameters"]
        assert parameters["strategy"]["defaultValue"] == "STANDARD"
        assert parameters["max_wait_duration"]["defaultValue"] == "86400s"
        assert parameters["restart_job_on_worker_restart"]["defaultValue"] is False
        job_tasks = [task for component in spec["components"].values()
                     for task in component.get("dag", {}).get("tasks", {}).values()
                     if "worker_pool_specs" in task.get("inputs", {}).get("parameters", {})]
        names = sorted(task["taskInfo"]["name"].split(" ")[0] for task in job_tasks)
        predicts = 0 if file_name == "detection-pipeline.yaml" else 3  # segmentation predicts, detection does not
        assert names == ["predict"] * predicts + ["train"] * 3, file_name
        for task in job_tasks:
            for name in ("strategy", "max_wait_duration", "restart_job_on_worker_restart"):
                assert task["inputs"]["parameters"][name] == {"componentInputParameter": f"pipelinechannel--{name}"}


def test_pseudonymize_reaches_preprocess_evaluate_and_predict():
    """One pipeline parameter names cases by keyed hashes everywhere: the records (both splits), the report of every
    training branch, and predict's masks and summary."""
    spec = yaml.safe_load(open(os.path.join(ROOT, "pipeline.yaml")))
    assert spec["root"]["inputDefinitions"]["parameters"]["pseudonymize"]["defaultValue"] is False
    dags = {"root": spec["root"], **spec["components"]}
    reached = sorted(re.sub(r"-\d+$", "", task["componentRef"]["name"].removeprefix("comp-"))
                     for dag in dags.values() for task in dag.get("dag", {}).get("tasks", {}).values()
                     if task.get("inputs", {}).get("parameters", {}).get("pseudonymize", {}).get("componentInputParameter")
                     in ("pseudonymize", "pipelinechannel--pseudonymize"))
    assert reached == ["evaluate"] * 4 + ["predict"] * 4 + ["preprocess-ct"] * 2
