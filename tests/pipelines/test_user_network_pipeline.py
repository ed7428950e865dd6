"""The ct-segmentation pipeline trains a user's network through kfp.local: `fullres pipeline run --local --model
FILE.py:FUNCTION` passes the file's text (the steps run where its path does not exist), the train step builds it,
and evaluate, export and predict rebuild it from the run's copy; each scan split over 2 virtual devices.

One case per split, one training step: the wiring is what is checked, in the fewest steps a whole run allows.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from preprocessing.ct import demo_ct

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.integration]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_ct_pipeline_trains_evaluates_exports_and_predicts_a_users_network(tmp_path):
    network = tmp_path / "nets" / "my_net.py"
    network.parent.mkdir()
    shutil.copy(os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py"), network)
    cases = {split: demo_ct.write_demo_cases(str(tmp_path / split), 1, (16, 32, 32), seed=seed,
                                             formats=("nifti",))["nifti"]
             for split, seed in (("train", 3), ("eval", 4))}
    parameters = {
        "train_input_uri": f"{cases['train']}/images", "train_labels_uri": f"{cases['train']}/labels",
        "eval_input_uri": f"{cases['eval']}/images", "eval_labels_uri": f"{cases['eval']}/labels",
        "predict_input_uri": f"{cases['eval']}/images", "preset": "smoke", "steps": "1", "batch_size": "1",
        "input_partition_dims": "1,2,1,1,1", "spacing": "2.0,2.0,2.0", "window": "-200,300", "shape": "16,16,16",
    }
    environment = {k: v for k, v in os.environ.items() if k != "FULLRES_VERBOSE"}
    environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # every step's process: 2 CPU devices
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline-root",
         str(tmp_path / "root"), "--model", f"{network}:residual_groupnorm",
         *[f"--param={key}={value}" for key, value in parameters.items()]],
        capture_output=True, text=True, cwd=str(tmp_path), env=environment, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = dict(re.findall(r"^([a-z0-9-]+/[a-z_]+): (/\S+)$", result.stdout, re.MULTILINE))  # task/output: path
    model = outputs["train/model"]
    assert json.load(open(os.path.join(model, "train_config.json")))["model"]["function"] == "residual_groupnorm"
    assert open(os.path.join(model, "model_source.py")).read() == network.read_text()  # the run's own copy
    assert os.path.isfile(os.path.join(outputs["export/exported"], "saved_model", "saved_model.pb"))
    assert json.load(open(outputs["evaluate/metrics"]))["cases"] == 1
    predicted = json.load(open(os.path.join(outputs["predict/masks"], "summary.json")))
    assert predicted["ok"] == 1 and predicted["input_partition_dims"] == [1, 2, 1, 1, 1]
