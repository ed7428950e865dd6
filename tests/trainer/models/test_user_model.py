"""A user's network from FILE.py:FUNCTION: imported under a name of its own, checked once, refused in one sentence,
its downsampling measured; the run folder keeps a copy of its file, which the run is read back from."""

import json
import os
import sys

import pytest

from trainer import config as config_lib

from trainer import config_resolution

from trainer import presets
from trainer.engine import run_files
from trainer.models import user_model

NETWORKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "user_networks.py")
TINY = '''
import keras

def build(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, in_channels))
    x = keras.layers.Conv3D(4, 3, strides={stride}, padding="same")(inputs)
    x = keras.layers.UpSampling3D({stride})(x)
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 1)(x))
'''


def _write(folder, name, text):
    path = folder / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, function, message", [
    (None, "build", "nets/none.py does not exist; pass the path of the Python file that defines build"),
    ("def build(:\n", "build", "importing {file} failed (line 1) with SyntaxError"),
    ("import not_a_package_anywhere\n", "build", "importing {file} failed (line 1) with ModuleNotFoundError"),
    ("def other(num_classes, in_channels):\n    pass\n", "build",
     "{file} defines no function build (it defines other); name the function that returns the network"),
    ("def build(classes):\n    pass\n", "build", "build(num_classes=3, in_channels=1) raised TypeError"),
    ("import keras\ndef build(num_classes, in_channels):\n    return keras.layers.Dense(3)\n", "build",
     "returned a Dense, not a keras.Model"),
    ("import keras\ndef build(num_classes, in_channels):\n    i = keras.Input((None, None, in_channels))\n"
     "    return keras.Model(i, keras.layers.Conv2D(num_classes, 1)(i))\n", "build",
     "the network takes inputs of shape (None, None, None, 1), but a 3D model takes channels-last (B, D, H, W, C)"),
    ("import keras\ndef build(num_classes, in_channels):\n    i = keras.Input((None, None, None, in_channels))\n"
     "    return keras.Model(i, [keras.layers.Conv3D(num_classes, 1)(i), i])\n", "build",
     "the network returns a list of 2 outputs; fullres trains one output"),
    ("import keras\ndef build(num_classes, in_channels):\n    i = keras.Input((None, None, None, in_channels))\n"
     "    return keras.Model(i, keras.layers.Conv3D(2, 1)(i))\n", "build",
     "turns a (1, 256, 256, 256, 1) input into (1, 256, 256, 256, 2); fullres segments with logits of num_classes=3 "
     "channels at the input's resolution, (1, 256, 256, 256, 3)"),
])
def test_a_network_that_breaks_the_contract_is_refused_in_one_sentence(tmp_path, text, function, message):
    file = "nets/none.py" if text is None else _write(tmp_path, "net.py", text)
    with pytest.raises(user_model.UserModelError) as refused:
        user_model.build(user_model.UserModelConfig(file, function))
    sentence = str(refused.value)
    assert sentence.startswith(f"--model {file}:{function}") and message.format(file=file) in sentence
    assert "\n" not in sentence and "Traceback" not in sentence


def test_the_file_is_imported_under_a_name_of_its_own(tmp_path):
    """A user's `json.py` is theirs alone: it neither shadows nor is shadowed by the module of that name."""
    file = _write(tmp_path, "json.py", TINY.format(stride=2))
    model = user_model.build(user_model.UserModelConfig(file, "build"))
    assert model.output_shape == (None, None, None, None, 3)
    assert sys.modules["json"].__file__ != file and callable(sys.modules["json"].dumps)
    assert [name for name, module in sys.modules.items() if getattr(module, "__file__", None) == file] == [
        f"fullres_user_model_{user_model._digest(file)[:16]}"]


def test_importing_the_users_file_writes_nothing_beside_it(tmp_path, monkeypatch):
    """Where bytecode may be written (most machines), Python's loader would leave `__pycache__/` in the user's folder."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    file = _write(tmp_path, "net_pyc.py", TINY.format(stride=2))
    assert user_model.build(user_model.UserModelConfig(file, "build")).output_shape == (None, None, None, None, 3)
    assert sorted(os.listdir(tmp_path)) == ["net_pyc.py"]


@pytest.mark.parametrize("stride, levels", [(2, (1, 1, 1)), (4, (2, 2, 2))])
def test_downsampling_is_measured_from_the_traced_network(tmp_path, stride, levels):
    file = _write(tmp_path, f"net{stride}.py", TINY.format(stride=stride))
    assert user_model.UserModelConfig(file, "build").downsampling_levels == levels


def test_a_users_network_resolves_keeping_the_presets_sizes_and_refuses_unet_settings():
    config = config_resolution.resolve("segmentation", "smoke", overrides={"model.num_classes": 4},
                                model_source=f"{NETWORKS}:residual_groupnorm")
    assert config.model == user_model.UserModelConfig(NETWORKS, "residual_groupnorm", 3, 4, 1)
    assert config_lib.from_dict(config_lib.to_dict(config)) == config
    with pytest.raises(ValueError, match=r"unknown train override model.num_levels with --model .*; valid ones"):
        config_resolution.resolve("segmentation", overrides={"model.num_levels": 3}, model_source=f"{NETWORKS}:x")
    with pytest.raises(ValueError, match=r"fullres trains a network of your own for segmentation only; detection "
                                         r"needs anchors, per-level box and class heads and their targets"):
        config_resolution.resolve("detection", model_source=f"{NETWORKS}:residual_groupnorm")
    with pytest.raises(ValueError, match=r"--model 'nets/net:build' is not FILE.py:FUNCTION"):
        config_resolution.resolve("segmentation", model_source="nets/net:build")


def test_the_run_keeps_a_copy_of_the_file_and_reads_the_network_back_from_it(tmp_path):
    source = _write(tmp_path, "net.py", TINY.format(stride=2))
    config = presets.smoke(model=user_model.UserModelConfig(source, "build"))
    run = tmp_path / "run"
    run.mkdir()
    run_files.write_train_config(str(run), config)
    os.remove(source)  # the original moved away: the run still names its network
    written = json.loads((run / "train_config.json").read_text())
    assert written["model"]["file"] == "model_source.py" and (run / "model_source.py").read_text() == TINY.format(
        stride=2)
    read = run_files.read_train_config(str(run))
    assert read.model.file == str(run / "model_source.py") and read.model.function == "build"
    assert user_model.build(read.model).output_shape == (None, None, None, None, 3)
    run_files.write_train_config(str(run), read)  # resumed from its own copy: the copy stays as it is
    assert (run / "model_source.py").read_text() == TINY.format(stride=2)


def test_a_network_that_fails_only_when_run_on_the_probe_is_refused_in_one_sentence(tmp_path):
    """Keras's symbolic call passes it, the traced forward pass fails (a stride-3 'same' transposed convolution
    gives 258 voxels of 256): it was a TypeError traceback from Concatenate out of `fullres train` and `plan`."""
    file = _write(tmp_path, "net3.py", '''
import keras

def build(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, in_channels))
    x = keras.layers.Conv3D(4, 3, padding="same")(inputs)
    down = keras.layers.Conv3D(4, 3, strides=3, padding="same")(x)
    up = keras.layers.Conv3DTranspose(4, 5, strides=3, padding="same")(down)
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 1)(keras.layers.Concatenate()([x, up])))
''')
    with pytest.raises(user_model.UserModelError) as refused:
        user_model.measure(user_model.UserModelConfig(file, "build"))
    sentence = str(refused.value)
    assert sentence.startswith(f"--model {file}:build: the network fails on a (1, 256, 256, 256, 1) input, the one "
                               "fullres traces it with to count its downsamplings (TypeError: ")
    assert "(1, 256, 256, 256, 4), (1, 258, 258, 258, 4)" in sentence and "\n" not in sentence
    assert "\x1b" not in sentence and sentence.endswith("or declare its input's size in keras.Input.")
