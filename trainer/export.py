"""Export of a trained model: a Keras file and a TensorFlow SavedModel."""

from __future__ import annotations

import os

import keras


def export_model(model: keras.Model, output_dir: str, image_shape: tuple[int, ...]) -> dict:
    """Writes `model.keras` and `saved_model/` under `output_dir`.

    The SavedModel's serving signature takes float32 images of the training
    spatial size with any batch size: `serve(image: (None, *image_shape[1:]))`.

    Returns:
        `{"keras": path, "saved_model": path}`.
    """
    keras_path = os.path.join(output_dir, "model.keras")
    saved_model_path = os.path.join(output_dir, "saved_model")
    model.save(keras_path)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda image: model(image, training=False),
        input_signature=[keras.InputSpec(shape=(None, *image_shape[1:]), dtype="float32")],
    )
    archive.write_out(saved_model_path, verbose=False)
    return {"keras": keras_path, "saved_model": saved_model_path}
