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
from preprocessing.records import tfrecord_schema
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
    (example,) = ct_input.read_examples(str(tmp_path / "out" / "data-*.tfrecord.gz"))
    windowed = intensity.window_and_scale(volume, (-200, 300))
    # Stored as int16 steps of 1/32767 of the largest value: exactly the quantized window, within half a step of it.
    np.testing.assert_array_equal(example["image"][..., 0], tfrecord_schema.dequantize(*tfrecord_schema.quantize(windowed)))
    assert np.abs(example["image"][..., 0] - windowed).max() <= 0.5 / 32767 * np.abs(windowed).max() * (1 + 1e-6)


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


# A scan that takes minutes to convert: a worker busy with it hears of nothing else until it is done.
LONG_CONVERSION = SLOW_CONVERSION.replace("time.sleep(0.5)", "time.sleep(180)")


@pytest.mark.slow
def test_after_kill_9_no_worker_outlives_the_command_and_a_rerun_removes_its_staging_folder(tmp_path):
    """The issue: the workers of a killed `fullres preprocess` ran on for 2-3 minutes, and its empty staging
    folder survived the rerun. Here the workers, each busy with a case that takes minutes, end within seconds of
    the command (the runner's connection to them breaks); the rerun removes what the command left beside its
    output, when fullres's own marker (or emptiness) proves it fullres's."""
    import signal
    import subprocess
    import sys
    import time

    output = tmp_path / "out"
    (tmp_path / "long.py").write_text(LONG_CONVERSION)
    started = tmp_path / "started"
    run = subprocess.Popen([sys.executable, str(tmp_path / "long.py"), str(output), str(started)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the conversion never started"
        workers = [pid for pid in _descendants(run.pid) if b"sdk_worker_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(workers) >= 2
        run.send_signal(signal.SIGKILL)
        run.wait()
        killed_at = time.monotonic()
        while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() - killed_at < 10:
            time.sleep(0.1)
        survivors = [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
        lifetime = time.monotonic() - killed_at
    finally:
        for pid in _descendants(run.pid) if run.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
    for pid in survivors:  # the old code's workers: not left running for minutes after the test
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"{len(survivors)} worker process(es) still ran {lifetime:.1f} s after the command died"

    staging = [name for name in os.listdir(tmp_path) if name.startswith("out.staging-")]
    assert len(staging) == 1
    (tmp_path / "out.staging-0123abcd").mkdir()  # what a kill before the marker leaves: empty
    (tmp_path / "out.staging-89abcdef").mkdir()  # not provably fullres's: kept
    (tmp_path / "out.staging-89abcdef" / "mine.txt").write_text("a file fullres did not write")
    lines = []
    conversion.run([1, 2], [], _Crash(), str(output), pipeline_args=IN_PROCESS, log=lines.append)
    assert sorted(name for name in os.listdir(tmp_path) if ".staging-" in name) == ["out.staging-89abcdef"]
    assert (tmp_path / "out.staging-89abcdef" / "mine.txt").read_text() == "a file fullres did not write"
    assert sorted(line for line in lines if line.startswith("removed ")) == sorted(
        f"removed {tmp_path / name}, left by an interrupted run" for name in [*staging, "out.staging-0123abcd"])
    assert json.loads((output / "summary.json").read_text())["ok"] == 2


QUICK_CONVERSION = '''
import sys
import apache_beam as beam
from preprocessing.beam import conversion, counting, local_workers

class Quick(beam.DoFn):
    def process(self, item):
        yield counting.accept(b"record %d" % item)

args = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
conversion.run(list(range(4)), [], Quick(), sys.argv[1], pipeline_args=args)
'''


@pytest.mark.slow
def test_beam_workers_notices_about_semi_persistent_directories_are_not_shown(tmp_path):
    """The issue: each local worker's "No semi_persistent_directory found" warning reached the terminal."""
    import subprocess
    import sys

    (tmp_path / "quick.py").write_text(QUICK_CONVERSION)
    result = subprocess.run([sys.executable, str(tmp_path / "quick.py"), str(tmp_path / "out")], capture_output=True,
                            text=True, cwd=os.getcwd(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 4 records" in result.stdout
    assert "semi_persistent_directory" not in result.stderr, result.stderr[-3000:]
