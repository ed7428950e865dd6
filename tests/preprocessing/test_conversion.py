"""The shared conversion run: atomic output on failure, compression, progress."""

import json
import os

import apache_beam as beam
import numpy as np
import pytest
import SimpleITK as sitk

from preprocessing import conversion, ct_pipeline, ct_transforms, demo_ct
from trainer import ct_input

IN_PROCESS = [f"--runner={conversion.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


class _Crash(beam.DoFn):
    def process(self, item):
        if item == 3:
            raise RuntimeError("worker crashed")
        yield conversion.accept(b"record")


def test_failed_pipeline_leaves_previous_output_untouched(tmp_path):
    output = tmp_path / "out"
    conversion.run([1, 2], [], _Crash(), str(output), pipeline_args=IN_PROCESS, log=lambda line: None)
    before = {name: (output / name).read_bytes() for name in os.listdir(output)}
    with pytest.raises(Exception, match="worker crashed"):
        conversion.run([1, 2, 3, 4], [], _Crash(), str(output), pipeline_args=IN_PROCESS, log=lambda line: None)
    assert {name: (output / name).read_bytes() for name in os.listdir(output)} == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the failed run's staging directory is gone too


def test_compressed_shards_read_back_through_the_trainer(tmp_path):
    volume, label = demo_ct.synthetic_case(np.random.default_rng(0), (8, 16, 16))
    image = sitk.GetImageFromArray(volume)
    sitk.WriteImage(image, str(tmp_path / "case1.nii.gz"))
    config = ct_transforms.CtPreprocessConfig(spacing=None, window=(-200, 300))
    summary = ct_pipeline.run(str(tmp_path / "case1.nii.gz"), str(tmp_path / "out"), config=config, compress=True,
                              num_shards=1, pipeline_args=IN_PROCESS, log=lambda line: None)
    assert summary["shards"] == ["data-00000-of-00001.tfrecord.gz"]
    batch = next(ct_input.ct_dataset(str(tmp_path / "out" / "data-*.tfrecord.gz"), 1).as_numpy_iterator())
    np.testing.assert_allclose(batch["image"][0, ..., 0], ct_transforms.window_and_scale(volume, (-200, 300)), atol=1e-6)


def test_progress_lines_are_counted_and_hidden():
    lines = []
    with conversion._progress(total=3, log=lines.append, every_seconds=0.0):
        conversion.accept(b"x")
        conversion.reject(conversion.dead_letter("a.png", "read", "unreadable", "bad"))
        conversion.accept(b"y")
    assert lines[-1] == "  2 records written, 1 dead letters so far (3 inputs)"


def test_summary_counts_match_the_dead_letter_file(tmp_path):
    class Mixed(beam.DoFn):
        def process(self, item):
            if item % 3 == 0:
                yield conversion.reject(conversion.dead_letter(str(item), "convert", "multiple_of_three", "test"))
            else:
                yield conversion.accept(b"%d" % item)

    summary = conversion.run(list(range(9)), [conversion.dead_letter("x", "discover", "early", "test")], Mixed(),
                             str(tmp_path / "out"), pipeline_args=IN_PROCESS, max_failed_fraction=1.0,
                             log=lambda line: None)
    assert summary["ok"] == 6 and summary["failed"] == 4
    assert summary["reasons"] == {"early": 1, "multiple_of_three": 3}
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
