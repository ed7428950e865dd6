"""Preprocessing: CT volumes and annotated images to sharded TFRecords.

Importing TensorFlow imports Keras, which fixes its backend for the process;
the trainer needs JAX, so choose it here too in case preprocessing is imported
first in a process that also trains.
"""

import atexit
import gc
import os

atexit.register(gc.freeze)  # the process ends without a last walk over every object: trainer/__init__.py, "Exit"

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow only reads, parses and exports here, never computes a model: its
# oneDNN kernels buy nothing and announce themselves on every start.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
