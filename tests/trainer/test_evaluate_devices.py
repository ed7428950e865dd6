"""Evaluation chooses its split from the devices present, as `fullres predict` does (`parallel.device_split`): a run
is not tied to the device count it trained on. The pipelines' evaluate step runs on a node of its own (a CPU node
while training ran on a TPU slice), so each evaluation here runs in a process of its own device count, as that step
does it (scores, then the metrics JSON).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.trainer.parallel.test_parity import TOLERANCE

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the pipelines' evaluate step does (`components.steps.evaluate`): score, then write the metrics JSON.
STEP = """
import sys, types
from components import runtime
from trainer import evaluate
model, pattern, out = sys.argv[1:4]
scores = evaluate.evaluate_trained(model, pattern, report_path=out + "/report.html", report_examples=1)
runtime.write_metrics(types.SimpleNamespace(path=out + "/metrics.json", log_metric=lambda name, value: None), scores,
                      ("dice_mean", "mAP", "mAP@0.5"))
"""


def evaluate_step(run: str, pattern: str, output, devices: int) -> tuple[dict, str]:
    """The evaluate step on `devices` virtual CPU devices: (its metrics JSON, its log)."""
    output.mkdir()
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    environment.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
                       PYTHONPATH=REPOSITORY)
    done = subprocess.run([sys.executable, "-c", STEP, run, pattern, str(output)], capture_output=True, text=True,
                          cwd=REPOSITORY, env=environment, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((output / "metrics.json").read_text()), done.stdout + done.stderr


def log_line(log: str) -> str:
    return next(line for line in log.splitlines() if "evaluating each case split" in line)


@pytest.mark.slow  # evaluates the session's 4-way run in this process (8 devices), in a 1- and a 2-device process
def test_a_4_way_trained_run_evaluates_on_1_and_2_devices_with_the_training_split_s_scores(segmentation_run, tmp_path):
    from trainer import evaluate

    config, _, _ = segmentation_run
    assert config.partition.input_partition_dims == (1, 4, 1, 1, 1)
    lines = []
    here = evaluate.evaluate_trained(config.output_dir, config.eval_data, log=lines.append)  # the 8 test devices
    assert here["split"] == {"input_partition_dims": [1, 4, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                             "devices_present": 8, "why": "the training split", "replicas": 2}
    assert ("evaluating each case split 1,4,1,1,1 over 4 cpu device(s), 2 replica(s) of 8 device(s) present "
            "(the training split)") in lines

    scores, log = evaluate_step(config.output_dir, config.eval_data, tmp_path / "one", devices=1)
    why = "the training split 1,4,1,1,1 needs 4 devices and 1 is present, so the same axes in fewer parts"
    assert scores["split"] == {"input_partition_dims": [1, 1, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                               "devices_present": 1, "why": why, "replicas": 1}
    assert log_line(log).endswith(f"evaluating each case split 1,1,1,1,1 over 1 cpu device(s), 1 replica(s) of 1 "
                                  f"device(s) present ({why})")
    assert scores["cases"] == here["cases"] == 2
    assert here["dice_mean"] > 0.0  # the model predicts something; the comparison is not of empty masks
    # The parity tolerance (tests/trainer/parallel/test_parity.py): a split changes no class id, so no Dice either.
    np.testing.assert_allclose(np.array(scores["dice_per_class"], float), np.array(here["dice_per_class"], float),
                               rtol=TOLERANCE, atol=0)

    two, log = evaluate_step(config.output_dir, config.eval_data, tmp_path / "two", devices=2)
    why = "the training split 1,4,1,1,1 needs 4 devices and 2 are present, so the same axes in fewer parts"
    assert two["split"] == {"input_partition_dims": [1, 2, 1, 1, 1], "trained_with": [1, 4, 1, 1, 1],
                            "devices_present": 2, "why": why, "replicas": 1}
    np.testing.assert_allclose(np.array(two["dice_per_class"], float), np.array(here["dice_per_class"], float),
                               rtol=TOLERANCE, atol=0)


@pytest.mark.slow  # evaluates the session's detection run in a 2-device process (its own run evaluated on 8)
def test_an_unsplit_detection_run_evaluates_on_2_devices_over_2_replicas_with_the_same_scores(detection_run, tmp_path):
    config, trained = detection_run  # `trained`: train.train's results, its evaluation at the end on the 8 devices
    assert config.partition.input_partition_dims == (1, 1, 1, 1) and config.batch_size == 8
    scores, log = evaluate_step(config.output_dir, config.eval_data, tmp_path / "two", devices=2)
    assert scores["split"] == {"input_partition_dims": [1, 1, 1, 1], "trained_with": [1, 1, 1, 1],
                               "devices_present": 2, "why": "the training split", "replicas": 2}  # 8 = 2 × 4 rows
    assert log_line(log).endswith("evaluating each case split 1,1,1,1 over 1 cpu device(s), 2 replica(s) of 2 "
                                  "device(s) present (the training split)")
    assert scores["images"] == trained["images"] == 32
    # 8 steps leave every AP at 0 (so these agree trivially); the detections under them are compared below.
    assert {key: scores[key] for key in ("mAP", "mAP@0.5", "per_class_AP")} == {
        key: trained[key] for key in ("mAP", "mAP@0.5", "per_class_AP")}


@pytest.mark.slow  # the detection run's first 8 held-out images, forward on 8 replicas and on 2
def test_detections_on_2_replicas_equal_those_on_8(detection_run):
    import jax

    from trainer import trained_run

    config, _ = detection_run
    found = {}
    for devices in (8, 2):
        loaded = trained_run.load(config.output_dir, jax.devices()[:devices])
        assert loaded.distribution.num_replicas == devices
        detections = loaded.run.task.predict(loaded.model, loaded.state, loaded.distribution, config.eval_data)
        found[devices] = [next(detections)[2] for _ in range(config.batch_size)]
    assert sum(len(image["scores"]) for image in found[8]) > 0  # the comparison is not of empty lists
    for on_eight, on_two in zip(found[8], found[2]):
        assert len(on_two["scores"]) == len(on_eight["scores"])
        np.testing.assert_allclose(on_two["scores"], on_eight["scores"], rtol=TOLERANCE)
        np.testing.assert_allclose(on_two["boxes"], on_eight["boxes"], rtol=TOLERANCE, atol=TOLERANCE)
        np.testing.assert_array_equal(on_two["classes"], on_eight["classes"])
