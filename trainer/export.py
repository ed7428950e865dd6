"""A trained model written out: the Keras file (`save_model`, whole or not at all) and a TensorFlow SavedModel."""

from __future__ import annotations

import contextlib
import os
import shutil

import keras

from common import file_writes
from trainer import trained_run


def save_model(model, path: str) -> None:
    """`model.save(path)` whole or not at all: saved as `.fullres-partial.NAME` beside it, then renamed.

    A save the disk cuts short (a full disk) removes its partial file and raises; Keras itself would leave
    a cut-short `model.keras` that predict and evaluate then fail to read.
    """
    with file_writes.whole(path) as temporary, _without_tensorflow_unless_imported():
        model.save(temporary)


@contextlib.contextmanager
def _without_tensorflow_unless_imported():
    """Keras's serializer asks whether TensorFlow is installed (to recognize its `TensorShape`), which imports it:
    4.6 CPU-s at the end of every training process. Where this process never imported TensorFlow, no object can
    be TensorFlow's, so for the save Keras's answer is no."""
    import sys

    from keras.src.utils import module_utils

    lazy = module_utils.tensorflow
    unseen = "tensorflow" not in sys.modules and lazy.module is None and lazy._available is None
    if unseen:
        lazy._available = False
    try:
        yield
    finally:
        if unseen:
            lazy._available = None


def export_model(model: keras.Model, output_dir: str, image_shape: tuple[int, ...]) -> dict:
    """Writes `model.keras` and `saved_model/` under `output_dir`.

    The SavedModel's serving signature takes float32 images of the training
    spatial size with any batch size: `serve(image: (None, *image_shape[1:]))`.

    Returns:
        `{"keras": path, "saved_model": path}`.
    """
    keras_path = os.path.join(output_dir, "model.keras")
    saved_model_path = os.path.join(output_dir, "saved_model")
    save_model(model, keras_path)
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


def export_trained(model_dir: str, output_dir: str) -> dict:
    """Exports the model `fullres train` left in `model_dir` (loaded through `trained_run`, a user's network too)."""
    run = trained_run.open_run(model_dir)
    os.makedirs(output_dir, exist_ok=True)
    return export_model(trained_run.load_model(run), output_dir, (None, *run.info["image_shape"]))
