"""Export of a trained model: a Keras file and a TensorFlow SavedModel."""

from __future__ import annotations

import os
import shutil

import keras

from common import file_writes
from trainer.tasks import registry
from trainer.engine import run_files


def export_model(model: keras.Model, output_dir: str, image_shape: tuple[int, ...]) -> dict:
    """Writes `model.keras` and `saved_model/` under `output_dir`.

    The SavedModel's serving signature takes float32 images of the training
    spatial size with any batch size: `serve(image: (None, *image_shape[1:]))`.

    Returns:
        `{"keras": path, "saved_model": path}`.
    """
    keras_path = os.path.join(output_dir, "model.keras")
    saved_model_path = os.path.join(output_dir, "saved_model")
    save_keras(model, keras_path)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda image: model(image, training=False),
        input_signature=[keras.InputSpec(shape=(None, *image_shape[1:]), dtype="float32")],
    )
    partial = file_writes.partial_path(saved_model_path)
    try:
        archive.write_out(partial, verbose=False)
        if os.path.isdir(saved_model_path):  # an earlier export of this run (fullres's own): swapped out, then removed
            previous = file_writes.partial_path(saved_model_path + ".previous")
            os.rename(saved_model_path, previous)
            os.rename(partial, saved_model_path)
            shutil.rmtree(previous)
        else:
            os.rename(partial, saved_model_path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"keras": keras_path, "saved_model": saved_model_path}


def save_keras(model: keras.Model, path: str) -> None:
    """`model.save(path)` whole or not at all: saved as `.fullres-partial.model.keras` beside it, then renamed.

    A save the disk cuts short (a full disk) removes its partial file and raises; Keras itself would leave
    a cut-short `model.keras` that predict and evaluate then fail to read.
    """
    with file_writes.whole(path) as temporary:
        model.save(temporary)


def export_trained(model_dir: str, output_dir: str) -> dict:
    """Exports the model `fullres train` left in `model_dir` (model.keras, train_config.json, model_info.json)."""
    info = run_files.read_model_info(model_dir)
    _, task = registry.restore(model_dir)
    os.makedirs(output_dir, exist_ok=True)
    model = registry.load_weights(task, model_dir)
    return export_model(model, output_dir, (None, *info["image_shape"]))
