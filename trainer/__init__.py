"""The spatially partitioned trainer (Keras 3 on the JAX backend).

Keras reads `KERAS_BACKEND` once, when it is first imported — and importing
TensorFlow imports Keras — so the JAX backend is chosen here, before any
trainer module imports either, and a process that already loaded Keras on
another backend is stopped with the fix. TensorFlow's C++ start-up chatter is
silenced unless the user asked for it.
"""

import os
import sys

if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    raise RuntimeError(
        f"KERAS_BACKEND is set to {os.environ['KERAS_BACKEND']!r}; the fullres trainer runs on the JAX backend, "
        "so unset it or set KERAS_BACKEND=jax."
    )
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow only reads, parses and exports here, never computes a model: its
# oneDNN kernels buy nothing and announce themselves on every start.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
if "keras" in sys.modules:
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(
            f"Keras was imported with the {keras.backend.backend()!r} backend before the fullres trainer; import "
            "`trainer` before TensorFlow or Keras, or set KERAS_BACKEND=jax."
        )
