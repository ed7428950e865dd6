"""A user's network that breaks the contract is told what it does: a network returning a dict was told
it "returns 1 outputs"; one built for 3-channel inputs against 1-channel data was told to change its input size.
Through `fullres train`, refused before anything is written."""

import pytest
from typer.testing import CliRunner

from pipelines import cli
from tests.files import snapshot

NETWORKS = '''
import keras

def dict_logits(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, in_channels))
    return keras.Model(inputs, {"logits": keras.layers.Conv3D(num_classes, 1)(inputs)})

def rgb(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, 3))
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 1)(inputs))
'''


@pytest.mark.parametrize("function, sentence", [
    ("dict_logits", "the network returns a dict (keys 'logits'); fullres trains one output, the logits (B, ..., "
                    "num_classes): return that tensor alone."),
    ("rgb", "the network takes 3-channel inputs (its keras.Input declares 3 channels) but the data have 1 channel "
            "(model.in_channels=1); build its input with the in_channels its function is given (keras.Input((..., "
            "in_channels))), or train on 3-channel data."),
])
def test_a_network_breaking_the_contract_is_told_what_it_does(demo_data, tmp_path, function, sentence):
    file = tmp_path / "nets.py"
    file.write_text(NETWORKS)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", "--train", demo_data["train"], "--output", str(tmp_path / "run"),
                                          "--model", f"{file}:{function}", "--steps", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output + result.stderr
    assert result.stderr.strip() == f"fullres: error: --model {file}:{function}: {sentence}"
    assert snapshot(tmp_path) == before
