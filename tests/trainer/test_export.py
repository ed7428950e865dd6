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
    export.save_model(model, str(tmp_path / "model.keras"))
    whole = (tmp_path / "model.keras").read_bytes()
    os.symlink("/dev/full", tmp_path / ".fullres-partial.model.keras")
    with pytest.raises(OSError) as error:
        export.save_model(model, str(tmp_path / "model.keras"))
    assert error.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]
    assert (tmp_path / "model.keras").read_bytes() == whole


@pytest.mark.slow
def test_the_default_stem_reloads_and_serves_like_the_trained_model(tmp_path):
    """The space-to-depth stem and the unfolded logits survive model.keras and the SavedModel, voxel for voxel."""
    import numpy as np
    import tensorflow as tf

    from trainer.models import unet

    keras.utils.set_random_seed(0)
    model = unet.build_unet(unet.UNetConfig(num_levels=2, base_filters=8))  # the default stem, small widths
    image = np.random.default_rng(0).normal(size=(1, 8, 12, 16, 1)).astype(np.float32)
    expected = np.asarray(model(image, training=False))
    paths = export.export_model(model, str(tmp_path), image.shape)
    reloaded = keras.saving.load_model(paths["keras"])
    assert reloaded.get_layer("space_to_depth").spatial_dims == 3
    np.testing.assert_allclose(np.asarray(reloaded(image, training=False)), expected, rtol=1e-5, atol=1e-5)
    archive = tf.saved_model.load(paths["saved_model"])  # kept: its functions read the archive's variables
    served = archive.serve(tf.constant(image)).numpy()
    assert served.shape == (1, 8, 12, 16, 3)
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-4)
