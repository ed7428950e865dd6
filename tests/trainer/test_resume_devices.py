"""A resume may change the device count where the run's partition allows it: the log says so and the
run's record keeps it; a device count the partition cannot use is refused in a sentence before anything is written."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests import files

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(arguments: list[str]) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}  # --virtual-devices sets it
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "train", *arguments], capture_output=True, text=True,
                          cwd=REPOSITORY, env=environment, timeout=600)


@pytest.mark.slow  # two resumes of a copy of the session's 4-way run (8 devices): on 2 (refused) and on 4 devices
def test_a_resume_on_fewer_devices_goes_on_where_the_split_fits_and_is_refused_where_not(segmentation_run, tmp_path):
    config, _, _ = segmentation_run
    run = tmp_path / "run"
    shutil.copytree(config.output_dir, run)
    common = ["--train", config.train_data, "--output", str(run), "--steps", "42", "--no-saved-model"]

    before = files.snapshot(run)
    refused = train([*common, "--virtual-devices", "2"])
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"fullres: error: --output {run} holds a run of global batch 2 split 1,4,1,1,1 (4 devices per replica, "
            "trained on 8 devices), which does not divide over the 2 devices present (not whole replicas of 4 "
            "devices); resume it on 8 or 4 devices") in refused.stderr  # what fits, not another split or batch
    assert files.snapshot(run) == before

    resumed = train([*common, "--virtual-devices", "4"])
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert ("resuming with 42 steps in all (was 40; the learning-rate schedule is stretched to the new end), "
            "4 devices (was 8; the partition is the run's)") in resumed.stdout.splitlines()
    assert "mesh {'replica': 1, 'depth': 4} on 4 cpu device(s)" in resumed.stdout
    history = json.loads((run / "run_record.json").read_text())["history"]
    assert [(line["step"], line["devices"]) for line in history] == [(0, 8), (40, 4)]
    assert json.loads((run / "metrics.json").read_text())["resumed_from_step"] == 40
