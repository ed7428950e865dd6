"""Random access into TFRecord files: every record, and any part of one, as TensorFlow would read it, and damage named."""

import os

import numpy as np
import pytest
import tensorflow as tf

from preprocessing.records import ct_slabs, tfrecord_files, tfrecord_schema

RECORDS = [bytes([i % 251]) * size for i, size in enumerate((0, 1, 3000, 70000, 5, 2_500_000, 17))]


@pytest.mark.parametrize("name", ["data.tfrecord", "data.tfrecord.gz"])
def test_every_record_and_every_part_of_one_reads_back(tmp_path, name):
    path = str(tmp_path / name)
    tfrecord_files.write_records(path, RECORDS)
    # TensorFlow reads what was written (the framing and its checksums are the format's own) ...
    compression = "GZIP" if name.endswith(".gz") else ""
    assert [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression)] == RECORDS
    records = tfrecord_files.RecordFile(path)
    assert len(records) == len(RECORDS) and records.lengths.tolist() == [len(r) for r in RECORDS]
    for number in reversed(range(len(RECORDS))):  # backwards: a GZIP record is not read from the file's top
        assert records.record(number) == RECORDS[number]
    assert records.read(5, 1_000_000, 10) == RECORDS[5][1_000_000:1_000_010]
    first, second = bytearray(4), bytearray(6)
    records.read_into(3, 69_990, [memoryview(first), memoryview(second)])
    assert bytes(first + second) == RECORDS[3][69_990:]


def test_files_tensorflow_wrote_read_back(tmp_path):
    path = str(tmp_path / "tf.tfrecord.gz")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for record in RECORDS:
            writer.write(record)
    records = tfrecord_files.RecordFile(path)
    assert [records.record(n) for n in range(len(records))] == RECORDS


@pytest.mark.parametrize("name", ["data.tfrecord", "data.tfrecord.gz"])
def test_a_file_cut_short_is_named_with_its_record(tmp_path, name):
    path = str(tmp_path / name)
    tfrecord_files.write_records(path, RECORDS)
    size = os.path.getsize(path)
    with open(path, "r+b") as file:
        file.truncate(size * 2 // 3)
    with pytest.raises(tfrecord_files.RecordFileDamaged) as damaged:
        tfrecord_files.RecordFile(path)
    assert str(damaged.value).startswith(f"{path} is damaged at record 6 (")
    assert str(damaged.value).endswith("copy the data set again from where it was written, or convert the scans again "
                                       "with fullres preprocess.")


def test_a_damaged_length_or_body_is_named(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    tfrecord_files.write_records(path, RECORDS[:3])
    with open(path, "r+b") as file:  # record 2's length: the header's checksum no longer matches
        file.seek(16 + 1 + 4)
        file.write(b"\x07")
    with pytest.raises(tfrecord_files.RecordFileDamaged, match=r"damaged at record 2 \(its length does not match its "
                                                               r"checksum\)"):
        tfrecord_files.RecordFile(path)
    tfrecord_files.write_records(path, RECORDS[:3])
    with open(path, "r+b") as file:  # a byte of record 3's data
        file.seek(16 + 1 + 4 + 16 + 1500)
        file.write(b"\xff")
    records = tfrecord_files.RecordFile(path)
    with pytest.raises(tfrecord_files.RecordFileDamaged, match=r"damaged at record 3 \(its data do not match"):
        records.record(2)


def _ct_record(depth=12, seed=0):
    rng = np.random.default_rng(seed)
    image = (rng.normal(size=(depth, 6, 5)) * 3).astype(np.float32)
    return tfrecord_schema.CtRecord(f"case{seed}", "p", image, rng.integers(0, 4, (depth, 6, 5)).astype(np.uint8))


@pytest.mark.parametrize("name", ["data.tfrecord", "data.tfrecord.gz"])
def test_any_depth_range_of_a_ct_record_reads_as_the_whole_volume_has_it(tmp_path, name):
    record = _ct_record()
    assert tfrecord_schema.slab_depth(12) == 3  # 4 slabs of 3: ranges below cut slabs
    path = str(tmp_path / name)
    tfrecord_files.write_records(path, [tfrecord_schema.encode_ct_example(_ct_record(seed=1)),
                                        tfrecord_schema.encode_ct_example(record)])
    records = tfrecord_files.RecordFile(path)
    layout = ct_slabs.read_layout(records, 1)
    assert layout.case_id == "case0" and layout.shape == (12, 6, 5) and layout.slab_depth == 3
    quantized = tfrecord_schema.dequantize(*tfrecord_schema.quantize(record.image))
    for start, stop in ((0, 12), (3, 9), (1, 11), (4, 5), (11, 12)):
        image = np.empty((stop - start, 6, 5), np.int16)
        label = np.empty((stop - start, 6, 5), np.uint8)
        ct_slabs.read_depths(records, 1, layout, start, stop, image, label)
        np.testing.assert_array_equal(tfrecord_schema.dequantize(image, layout.scale), quantized[start:stop])
        np.testing.assert_array_equal(label, record.label[start:stop])


def test_a_gzip_record_is_inflated_once_for_its_layout_and_its_depths(tmp_path):
    """The layout walk reads a record's fields by many small reads at rising offsets: each GZIP read went back to the
    record's start and inflated up to its offset again (a 128³ record's layout took 1.4 s, 0.22 examples/s)."""
    rng = np.random.default_rng(0)
    record = tfrecord_schema.CtRecord("case0", "p", rng.normal(size=(64, 32, 32)).astype(np.float32),
                                      rng.integers(0, 4, (64, 32, 32)).astype(np.uint8))
    path = str(tmp_path / "data.tfrecord.gz")
    tfrecord_files.write_records(path, [tfrecord_schema.encode_ct_example(record)])
    records = tfrecord_files.RecordFile(path)
    fed = []  # compressed bytes read from the file

    def read(offset, length, read=records._source.read):
        data = read(offset, length)
        fed.append(len(data))
        return data

    records._source.read = read
    layout = ct_slabs.read_layout(records, 0)
    image, label = np.empty((64, 32, 32), np.int16), np.empty((64, 32, 32), np.uint8)
    ct_slabs.read_depths(records, 0, layout, 0, 64, image, label)
    np.testing.assert_array_equal(label, record.label)
    assert sum(fed) <= 2 * os.path.getsize(path) + (1 << 20), (sum(fed), os.path.getsize(path))


def test_a_damaged_slab_is_named_and_the_others_still_read(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    serialized = tfrecord_schema.encode_ct_example(_ct_record())
    tfrecord_files.write_records(path, [serialized])
    records = tfrecord_files.RecordFile(path)
    layout = ct_slabs.read_layout(records, 0)
    with open(path, "r+b") as file:  # one byte inside the third image slab
        file.seek(12 + layout.image_slabs[2].offset + 7)
        file.write(b"\x55")
    image, label = np.empty((3, 6, 5), np.int16), np.empty((3, 6, 5), np.uint8)
    ct_slabs.read_depths(records, 0, layout, 0, 3, image, label)  # slab 1: intact
    with pytest.raises(tfrecord_files.RecordFileDamaged) as damaged:
        ct_slabs.read_depths(records, 0, layout, 6, 9, image, label)
    assert str(damaged.value) == (f"{path}: record 1 (case case0) has a damaged image slab 3 (its bytes do not match "
                                  "their CRC); copy the data set again, or convert the scans again.")


@pytest.mark.parametrize("name", ["data.tfrecord", "data.tfrecord.gz"])
def test_the_first_record_alone_is_read_and_checked(tmp_path, name):
    path = str(tmp_path / name)
    tfrecord_files.write_records(path, [RECORDS[5], RECORDS[2]])
    assert tfrecord_files.first_record(path) == RECORDS[5]
    tfrecord_files.write_records(str(tmp_path / f"empty-{name}"), [])
    assert tfrecord_files.first_record(str(tmp_path / f"empty-{name}")) is None
    whole = open(path, "rb").read()
    cut = tmp_path / f"cut-{name}"
    cut.write_bytes(whole[:len(whole) // 3])  # the first record cut short (GZIP: its compressed stream)
    with pytest.raises(tfrecord_files.RecordFileDamaged):
        tfrecord_files.first_record(str(cut))
    other = tmp_path / f"other-{name}"
    other.write_bytes(b'{"not": "a TFRecord file at all"}' * 10)
    with pytest.raises(tfrecord_files.RecordFileDamaged):
        tfrecord_files.first_record(str(other))
