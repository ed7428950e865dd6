"""A cut-short volume is a dead letter in every format; a named pipe is never opened.

ITK's NIfTI reader fills a cut-short `.nii` or `.nii.gz` with zeros without a word (the regression: a scan cut at
60% was converted with its last 40% as 0 HU). Each format is written whole and read back through the reader
preprocess and predict use (`ct_io.read_volume`, `dicom_series.read_series`), then cut and read again: one rule,
one reason (`cut_short`), one sentence naming the file and the fix. The command runs are in
tests/preprocessing/beam/test_ct_pipeline.py and tests/trainer/predict/test_predict_inputs.py.
"""

import gzip
import os
import re
import threading

import numpy as np
import pytest
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import ct_io, dicom_series, volume_bytes
from tests import hostile_inputs


@pytest.mark.parametrize("name", hostile_inputs.CUT_SHORT)
def test_each_format_cut_short_is_refused_by_the_reader(tmp_path, name):
    suffix, compressed, data_suffix, fraction = hostile_inputs.CUT_SHORT[name]
    volume = hostile_inputs.ct_volume()
    path = str(tmp_path / (name + suffix))
    hostile_inputs.write_volume(volume, path, compressed)
    whole = sitk.GetArrayFromImage(ct_io.read_volume(ct_io.VolumeSource(path)))
    np.testing.assert_array_equal(whole, np.round(volume))  # whole: read as written
    hostile_inputs.cut(path[:-len(suffix)] + data_suffix if data_suffix else path, fraction)
    with pytest.raises(dead_letters.CaseError) as refused:
        ct_io.read_volume(ct_io.VolumeSource(path))
    assert refused.value.reason == "cut_short" and refused.value.stage == "read"
    named = path if not data_suffix else f"{path} (its data file {name}{data_suffix})"
    assert re.fullmatch(
        rf"{re.escape(named)} (holds [0-9,]+ of the [0-9,]+ (data|compressed) bytes its header (promises|records)|"
        rf"decompresses to [0-9,]+ of the [0-9,]+ bytes its header promises before its compressed stream breaks off)"
        r": the file was cut short \(a copy or download that stopped\), so copy it again from its source",
        refused.value.detail), refused.value.detail


def test_a_dicom_slice_cut_short_is_refused_by_the_series_reader(tmp_path):
    paths = hostile_inputs.write_series(hostile_inputs.ct_volume(), tmp_path / "series", cut_slice=3)
    with pytest.raises(dead_letters.CaseError) as refused:
        dicom_series.read_series(tuple(paths))
    assert refused.value.reason == "cut_short"
    assert re.fullmatch(rf"{re.escape(paths[3])} holds [0-9,]+ of the 960 pixel data bytes its header promises: the "
                        r"file was cut short \(a copy or download that stopped\), so copy it again from its source",
                        refused.value.detail), refused.value.detail


def test_a_gzip_of_several_members_is_whole(tmp_path):
    """bgzip writes a .nii.gz as many gzip members; the last one's length is not the file's, so the stream is
    counted instead of read from gzip's trailer, and found whole."""
    path = tmp_path / "plain.nii"
    hostile_inputs.write_volume(hostile_inputs.ct_volume(), str(path), False)
    data = path.read_bytes()
    members = b"".join(gzip.compress(data[start:start + 4096]) for start in range(0, len(data), 4096))
    (tmp_path / "members.nii.gz").write_bytes(members)
    volume_bytes.check_complete(str(tmp_path / "members.nii.gz"))
    (tmp_path / "short.nii.gz").write_bytes(members[:len(members) * 2 // 3])
    with pytest.raises(dead_letters.CaseError, match="cut_short"):
        volume_bytes.check_complete(str(tmp_path / "short.nii.gz"))


def test_a_named_pipe_is_refused_without_being_opened(tmp_path):
    pipe = tmp_path / "scan.nii.gz"
    os.mkfifo(pipe)
    outcome = {}

    def read():
        try:
            ct_io.read_volume(ct_io.VolumeSource(str(pipe)))
        except Exception as error:  # noqa: BLE001  (whatever the reader raised is judged below)
            outcome["error"] = error

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    blocked = reader.is_alive()
    if blocked:  # opening a FIFO with no writer blocks: free the reader before failing
        with open(pipe, "wb"):
            pass
        reader.join(10)
    assert not blocked, "reading the named pipe blocked"
    refused = outcome["error"]
    assert isinstance(refused, dead_letters.CaseError) and refused.reason == "not_a_file"
    assert refused.detail == (f"{pipe} is a named pipe (FIFO), not a file; fullres reads only regular files (reading "
                              "this one could block for ever), so it was skipped")
