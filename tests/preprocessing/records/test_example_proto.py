"""Examples written without TensorFlow are the ones TensorFlow writes."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from preprocessing.records import example_proto, tfrecord_schema


def test_serialized_example_equals_tensorflows():
    ours = example_proto.serialize_example({
        "bytes": example_proto.BytesValues([b"a", b"\x00\xff"]),
        "floats": example_proto.FloatValues([1.5, -2.25, 3e-8]),
        "ints": example_proto.IntValues([0, -7, 2**40]),
        "empty": example_proto.BytesValues([]),
    })
    theirs = tf.train.Example(features=tf.train.Features(feature={
        "bytes": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"\x00\xff"])),
        "floats": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5, -2.25, 3e-8])),
        "ints": tf.train.Feature(int64_list=tf.train.Int64List(value=[0, -7, 2**40])),
        "empty": tf.train.Feature(bytes_list=tf.train.BytesList(value=[])),
    }))
    assert tf.train.Example.FromString(ours) == theirs
    parsed = tf.io.parse_single_example(ours, {
        "bytes": tf.io.FixedLenFeature([2], tf.string),
        "floats": tf.io.FixedLenFeature([3], tf.float32),
        "ints": tf.io.FixedLenFeature([3], tf.int64),
    })
    assert list(parsed["bytes"].numpy()) == [b"a", b"\x00\xff"]
    np.testing.assert_array_equal(parsed["floats"].numpy(), np.float32([1.5, -2.25, 3e-8]))
    assert list(parsed["ints"].numpy()) == [0, -7, 2**40]


@pytest.mark.slow
def test_writing_records_does_not_load_tensorflow():
    """Beam workers write records; TensorFlow would cost each of them seconds to import."""
    code = (
        "import sys, numpy as np\n"
        "from preprocessing.beam import ct_pipeline, images_pipeline\n"
        "from preprocessing.records import tfrecord_schema\n"
        "record = tfrecord_schema.CtRecord('c', 'p', np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.uint8))\n"
        "tfrecord_schema.encode_ct_example(record)\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_ct_record_bytes_parse_in_tensorflow():
    record = tfrecord_schema.CtRecord("c", "p", np.arange(24, dtype=np.float32).reshape(2, 3, 4),
                                      np.ones((2, 3, 4), np.uint8), spacing=(0.5, 0.6, 2.0))
    parsed = tf.train.Example.FromString(tfrecord_schema.encode_ct_example(record))
    assert list(parsed.features.feature["image/spacing"].float_list.value) == [0.5, np.float32(0.6), 2.0]
    assert list(parsed.features.feature["image/shape"].int64_list.value) == [2, 3, 4]
