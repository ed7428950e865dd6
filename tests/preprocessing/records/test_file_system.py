"""A local data set is listed, tested and read without TensorFlow, with the answers TensorFlow's gfile gives."""

import pytest

from preprocessing.records import file_system


@pytest.mark.parametrize("pattern", ["data-*", "data-0000[01]-of-*", "*", ".hidden*", "d?ta-*", "missing-*", "sub",
                                     "sub/*", "data-00000-of-00002"])
def test_local_answers_are_gfiles(tmp_path, pattern):
    import tensorflow as tf

    for name in ("data-00000-of-00002", "data-00001-of-00002", ".hidden-data", "summary.json"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data-00000-of-00001").write_text("y")
    full = str(tmp_path / pattern)
    assert sorted(file_system.glob(full)) == sorted(tf.io.gfile.glob(full))
    assert file_system.exists(full) == tf.io.gfile.exists(full) and file_system.isdir(full) == tf.io.gfile.isdir(full)
    assert sorted(file_system.listdir(str(tmp_path))) == sorted(n.rstrip("/") for n in tf.io.gfile.listdir(str(tmp_path)))
