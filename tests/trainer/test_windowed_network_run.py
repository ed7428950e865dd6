"""A network with 4×4×4 attention windows trains: the receptive-field probe fed it inputs thinner than
its windows tile, and `fullres train` ended in a reshape's traceback even on one device."""

import os
import subprocess
import sys

import pytest

from preprocessing.ct import demo_ct

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # one training process of one step (about 35 s on the shared 2-core machine)
def test_a_network_of_attention_windows_trains_on_one_device(tmp_path):
    # 16 × 48 × 48 voxels: more than the probe measures whole, so it goes axis by axis on thin inputs.
    data = demo_ct.write_demo_tfrecords(str(tmp_path / "data"), num_train=2, num_eval=0, shape=(16, 48, 48), seed=1)
    network = os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py")
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--train", data["train"], "--output", str(tmp_path / "run"),
         "--model", f"{network}:windowed_attention", "--steps", "1", "--batch-size", "1", "--virtual-devices", "1",
         "--no-saved-model"], capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    field = next(line for line in result.stdout.splitlines() if line.startswith("receptive field: "))
    assert field.startswith("receptive field: each output voxel sees all 16 voxels of depth, "), field
    assert os.path.isfile(tmp_path / "run" / "model.keras")
