"""The shared conversion run: atomic output on failure, compression, progress."""

import json
import os
import re

import apache_beam as beam
import numpy as np
import pytest
import SimpleITK as sitk

from common import dead_letters
from preprocessing.beam import conversion, counting, ct_pipeline, local_workers
from preprocessing.ct import ct_transforms, demo_ct, intensity
from trainer.data import ct_input

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


class _Crash(beam.DoFn):
    def process(self, item):
        if item == 3:
            raise RuntimeError("worker crashed")
        yield counting.accept(b"record")


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
    np.testing.assert_allclose(batch["image"][0, ..., 0], intensity.window_and_scale(volume, (-200, 300)), atol=1e-6)


def test_progress_lines_are_counted_and_hidden():
    lines = []
    with counting.progress(total=3, log=lines.append, every_seconds=0.0):
        counting.accept(b"x")
        counting.reject(dead_letters.dead_letter("a.png", "read", "unreadable", "bad"))
        counting.accept(b"y")
    assert lines[-1] == "  2 records written, 1 dead letters so far (3 inputs)"


def test_summary_counts_match_the_dead_letter_file(tmp_path):
    class Mixed(beam.DoFn):
        def process(self, item):
            if item % 3 == 0:
                yield counting.reject(dead_letters.dead_letter(str(item), "convert", "multiple_of_three", "test"))
            else:
                yield counting.accept(b"%d" % item)

    summary = conversion.run(list(range(9)), [dead_letters.dead_letter("x", "discover", "early", "test")], Mixed(),
                             str(tmp_path / "out"), pipeline_args=IN_PROCESS, max_failed_fraction=1.0,
                             log=lambda line: None)
    assert summary["ok"] == 6 and summary["failed"] == 4
    assert summary["reasons"] == {"early": 1, "multiple_of_three": 3}
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary


SLOW_CONVERSION = '''
import sys, time
import apache_beam as beam
from preprocessing.beam import conversion, counting, local_workers

class Slow(beam.DoFn):
    def __init__(self, started):
        self.started = started

    def process(self, item):
        open(self.started, "a").close()  # "the workers are converting now"
        time.sleep(0.5)
        yield counting.accept(b"record %d" % item)

args = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
try:
    conversion.run(list(range(400)), [], Slow(sys.argv[2]), sys.argv[1], pipeline_args=args)
except conversion.PreprocessingFailed as error:
    print(f"fullres: error: {error}", file=sys.stderr)
    sys.exit(2)
'''


def _descendants(pid: int) -> list[int]:
    children = [int(p) for task in os.listdir(f"/proc/{pid}/task")
                for p in open(f"/proc/{pid}/task/{task}/children").read().split()]
    return children + [grandchild for child in children for grandchild in _descendants(child)]


@pytest.mark.slow
def test_a_killed_worker_fails_the_run_within_a_minute_and_keeps_the_previous_output(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    output = tmp_path / "out"
    conversion.run([1, 2], [], _Crash(), str(output), pipeline_args=IN_PROCESS, log=lambda line: None)
    before = {name: (output / name).read_bytes() for name in os.listdir(output)}
    (tmp_path / "slow.py").write_text(SLOW_CONVERSION)
    started = tmp_path / "started"
    run = subprocess.Popen([sys.executable, str(tmp_path / "slow.py"), str(output), str(started)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the conversion never started"
        # The worker's Python process, as the out-of-memory killer would pick it (not the shell that started it).
        workers = [pid for pid in _descendants(run.pid) if b"sdk_worker_main" in open(f"/proc/{pid}/cmdline", "rb").read()
                   and open(f"/proc/{pid}/comm").read().startswith("python")]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = run.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0 and elapsed < 60
    sentence = [line for line in stderr.splitlines() if line.startswith("fullres: error:")]
    # The exit status reads 137 when a shell stood between Beam and the worker, -9 when Beam started it directly.
    sentence = [re.sub(r"return code (137|-9):", "return code 137:", line) for line in sentence]
    assert sentence == [
        "fullres: error: a Beam worker died (RuntimeError: Worker subprocess exited with return code 137: killed, as "
        f"the out-of-memory killer does), so the run stopped and {output} was left as it was; give each worker more "
        "memory (fewer --workers, or a lower --max-voxels) and rerun."
    ]
    assert "Traceback" not in stderr
    assert {name: (output / name).read_bytes() for name in os.listdir(output)} == before
    assert sorted(os.listdir(tmp_path)) == ["out", "slow.py", "started"]  # no staging directory left behind
    assert not any(b"sdk_worker_main" in open(f"/proc/{pid}/cmdline", "rb").read()
                   for pid in workers[1:] if os.path.exists(f"/proc/{pid}"))  # no worker left running
