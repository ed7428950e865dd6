"""Exporting a trained model: model.keras and the SavedModel are written whole or not at all."""

import errno
import os

import keras
import pytest

from trainer import export


def test_model_keras_the_disk_cuts_short_is_removed_and_the_previous_one_kept(tmp_path):
    """The issue: a full disk left a cut-short model.keras (Keras writes straight to the file), which predict then
    failed to read. /dev/full, behind the temporary name, stands for the full disk."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    export.save_keras(model, str(tmp_path / "model.keras"))
    whole = (tmp_path / "model.keras").read_bytes()
    os.symlink("/dev/full", tmp_path / ".fullres-partial.model.keras")
    with pytest.raises(OSError) as error:
        export.save_keras(model, str(tmp_path / "model.keras"))
    assert error.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]
    assert (tmp_path / "model.keras").read_bytes() == whole
