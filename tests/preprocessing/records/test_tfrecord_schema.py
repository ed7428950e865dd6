"""The CT TFRecord schema round-trips every field, and the demo volumes look like CT."""

import numpy as np
import pytest
import tensorflow as tf

from preprocessing.ct import demo_ct
from preprocessing.records import tfrecord_schema
from trainer.data import ct_input


def test_ct_record_round_trip():
    rng = np.random.default_rng(0)
    record = tfrecord_schema.CtRecord(
        case_id="case7",
        source_path="/data/images/case7.nii.gz",
        image=rng.random((5, 6, 7), dtype=np.float32),
        label=rng.integers(0, 4, (5, 6, 7), dtype=np.uint8),
        spacing=(0.8, 0.7, 2.5),
        origin=(-100.0, 20.0, 3.5),
        direction=(0, 1, 0, 1, 0, 0, 0, 0, -1),
        original_shape=(50, 60, 70),
        window=(-160.0, 240.0),
    )
    parsed = tfrecord_schema.parse_ct_example(tf.constant(tfrecord_schema.encode_ct_example(record)))
    # int16 steps of the largest value / 32767: exactly the quantized image, within half a step of the float32 one.
    np.testing.assert_array_equal(parsed["image"].numpy()[..., 0],
                                  tfrecord_schema.dequantize(*tfrecord_schema.quantize(record.image)))
    assert np.abs(parsed["image"].numpy()[..., 0] - record.image).max() <= 0.5 * record.image.max() / 32767 * 1.000001
    np.testing.assert_array_equal(parsed["label"].numpy(), record.label)
    assert parsed["case_id"].numpy() == b"case7"
    assert parsed["source_path"].numpy() == b"/data/images/case7.nii.gz"
    np.testing.assert_allclose(parsed["spacing"].numpy(), record.spacing, rtol=1e-6)
    np.testing.assert_allclose(parsed["origin"].numpy(), record.origin, rtol=1e-6)
    np.testing.assert_allclose(parsed["direction"].numpy(), record.direction)
    np.testing.assert_array_equal(parsed["original_shape"].numpy(), (50, 60, 70))
    np.testing.assert_allclose(parsed["window"].numpy(), (-160.0, 240.0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(image=np.zeros((4, 4)), label=np.zeros((4, 4))), r"image must be 3-D \(D, H, W\), got shape \(4, 4\)"),
        (dict(image=np.zeros((2, 4, 4)), label=np.zeros((2, 4, 5))), r"label shape \(2, 4, 5\) differs from image"),
        (dict(image=np.zeros((2, 4, 4)), label=np.zeros((2, 4, 4)), direction=(1, 0, 0)), r"direction needs 9 values"),
    ],
)
def test_ct_record_refuses_bad_arrays(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfrecord_schema.CtRecord(case_id="c", source_path="p", **kwargs)


def test_demo_case_is_ct_like():
    volume, label = demo_ct.synthetic_case(np.random.default_rng(3), (32, 32, 32))
    assert volume.dtype == np.float32 and label.dtype == np.uint8
    assert set(np.unique(label)) == {0, 1, 2}
    assert volume.min() < -900  # air
    assert abs(np.median(volume[label == 1]) - demo_ct.ORGAN_HU[1]) < 30
    assert abs(np.median(volume[label == 2]) - demo_ct.ORGAN_HU[2]) < 30
    other = demo_ct.synthetic_case(np.random.default_rng(4), (32, 32, 32))[1]
    assert not np.array_equal(label, other)  # random pose


def test_demo_tfrecords_read_back_through_the_trainer_input(tmp_path):
    written = demo_ct.write_demo_tfrecords(str(tmp_path), num_train=3, num_eval=1, shape=(8, 16, 16), seed=5)
    assert ct_input.count_examples(written["train"]) == 3
    examples = list(ct_input.read_examples(written["train"]))
    assert [e["image"].shape for e in examples] == [(8, 16, 16, 1)] * 3 and examples[0]["label"].shape == (8, 16, 16)
    assert all(0.0 <= e["image"].min() and e["image"].max() <= 1.0 for e in examples)
    assert [e["case_id"] for e in examples] == ["demo-train-0000", "demo-train-0001", "demo-train-0002"]


def test_missing_data_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no TFRecord files match '.*nothing-\*.tfrecord'; check the path"):
        ct_input.list_files(str(tmp_path / "nothing-*.tfrecord"))
