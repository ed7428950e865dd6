"""Files by path: local ones through the operating system, `gs://` (any `scheme://`) through TensorFlow's gfile.

A data set read from this machine's disk needs no TensorFlow: a training step's
process that imports it only to list, test and read its data set's files pays
4.6 CPU-s for it (2-core machine, 2026-11-26). The answers are the same either
way; a pattern matches names that start with a dot too, as gfile's does.
"""

from __future__ import annotations

import glob as _glob
import os


def is_local(path: str) -> bool:
    """True for a path on this machine's file system (not gs:// or another scheme TensorFlow opens)."""
    return "://" not in path


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def exists(path: str) -> bool:
    return os.path.exists(path) if is_local(path) else _gfile().exists(path)


def isdir(path: str) -> bool:
    return os.path.isdir(path) if is_local(path) else _gfile().isdir(path)


def glob(pattern: str) -> list[str]:
    """The paths `pattern` matches (`*`, `?`, `[...]` within one path component), in no particular order."""
    return _glob.glob(pattern, include_hidden=True) if is_local(pattern) else _gfile().glob(pattern)


def listdir(folder: str) -> list[str]:
    """The names in `folder` (a sub-folder's may end in "/" on gs://)."""
    return os.listdir(folder) if is_local(folder) else _gfile().listdir(folder)


def open_text(path: str):
    """`path` opened for reading text."""
    return open(path, encoding="utf-8") if is_local(path) else _gfile().GFile(path)
