"""Training in several processes for real: JAX CPU processes on localhost joined into one global mesh (gloo).

The test process itself has 8 devices (conftest); every multi-process part runs
as subprocesses with 4 devices each, so 2 processes × 4 devices and 1 process ×
8 devices are the same 8-device mesh.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.trainer import multiprocess_parity_worker as worker
from trainer import checkpoints, distributed, local_launcher

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 1e-5  # as in test_parity.py: per-tensor ||a − b|| / ||b||
# Weights and Adam moments after the 20-step run, per tensor. Where the difference comes from, measured with
# benchmarks/multiprocess_drift.py (the parity model, one fixed batch, lr 1e-2, 1,8,1,1,1, 20 steps):
# - 1 process × 8 devices run twice: identical bit for bit (0.0) in every step's gradients and weights;
# - 2 processes × 4 devices against it, SGD: gradients within 2.4e-6 and weights within 1e-6 for steps 1-4 (no
#   gradient element of another sign), then step 5's gradients differ by 1e-2 at once and the weights end
#   1.9e-2 apart. So it is not Adam amplifying rounding, SGD parts too: the runs follow each other to float32
#   rounding of differently ordered sums (gloo) until a rounding-sized difference crosses a point where the
#   gradient jumps (presumably a ReLU or max-pool switching; the element was not pinned down), after which they
#   are two nearby trainings. The same happens without a second process (1 × 8 against 1 × 1 devices: 1.6e-4).
# In this test's smoke run (2 levels, Adam, demo data with flips) the end difference measured 6.5e-4 (previous session);
# 2e-3 leaves a 3x margin. It is not what shows the data was right: the per-step losses are.
WEIGHT_TOLERANCE = 2e-3


def _environment():
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    environment["PYTHONPATH"] = REPOSITORY
    environment["PYTHONUNBUFFERED"] = "1"
    return environment


def _relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_a_process_reads_exactly_its_rows_of_every_global_batch(demo_data):
    """The rows a process reads, and their flips, are those rows of what one process reads."""
    from trainer import ct_input, train

    def batches(rows):
        data = ct_input.ct_dataset(demo_data["train"], 4, shuffle=True, repeat=True, seed=3, skip_examples=4,
                                   drop_remainder=True, rows=rows)
        return [batch for _, batch in zip(range(3), data.as_numpy_iterator())]

    whole = batches(None)
    for rows in ([0, 1], [2, 3], [1, 3]):
        for step_number, (full, share) in enumerate(zip(whole, batches(rows))):
            assert list(share["case_id"]) == list(full["case_id"][rows])
            flipped_full = train.random_flips(full["image"], full["label"], 3, step_number)
            flipped_share = train.random_flips(share["image"], share["label"], 3, step_number, rows)
            np.testing.assert_array_equal(flipped_share[0], flipped_full[0][rows])
            np.testing.assert_array_equal(flipped_share[1], flipped_full[1][rows])


@pytest.mark.slow
def test_one_step_in_two_processes_matches_one_process(tmp_path):
    """2 processes × 4 devices, the depth split crossing the process boundary (1,8,1,1,1) and replicas on
    processes (1,4,1,1,1): the same loss and gradients as 1 process × 8 devices."""
    address = f"localhost:{local_launcher.free_port()}"
    script = os.path.join(REPOSITORY, "tests", "trainer", "multiprocess_parity_worker.py")
    processes = [subprocess.Popen([sys.executable, script, address, "2", str(i), str(tmp_path)], env=_environment(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPOSITORY)
                 for i in range(2)]
    outputs = [p.communicate(timeout=540)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs

    # Each process placed only the rows its devices hold: both need the one example split 8-way across them;
    # with replicas on processes, each holds one replica's example.
    assert "dims (1, 8, 1, 1, 1): rows [0, 1]" in outputs[0] and "dims (1, 8, 1, 1, 1): rows [0, 1]" in outputs[1]
    assert "dims (1, 4, 1, 1, 1): rows [0]" in outputs[0] and "dims (1, 4, 1, 1, 1): rows [1]" in outputs[1]
    # With one replica every device holds both rows, of one 4-voxel depth block (32 / 8): process 1 the last 4.
    blocks = re.search(r"dims \(1, 8, 1, 1, 1\): rows \[0, 1\], blocks (\[.*?\])", outputs[1]).group(1)
    assert blocks == "[(0, 16), (0, 20), (0, 24), (0, 28)]"

    model, state = worker.model_and_state()
    images, labels = worker.batch()
    for dims in worker.LAYOUTS:
        reference_loss, reference_grads, _ = worker.loss_and_grads(model, state, dims, images, labels)
        with np.load(tmp_path / f"{'x'.join(map(str, dims))}.npz") as result:
            assert abs(float(result["loss"]) - reference_loss) / abs(reference_loss) <= TOLERANCE
            grads = [result[f"grad{i:03d}"] for i in range(len(reference_grads))]
        worst = max(_relative(g, r) for g, r in zip(grads, reference_grads))
        assert worst <= TOLERANCE, f"{dims}: largest relative gradient difference {worst:.2e}"


STEPS = 20
CHECKPOINT_EVERY = 4


def _train_arguments(train_pattern, output, devices):
    return ["--train", train_pattern, "--output", str(output), "--preset", "smoke", "--steps", str(STEPS),
            "--checkpoint-every", str(CHECKPOINT_EVERY), "--log-every", "1", "--virtual-devices", str(devices),
            "--input-partition-dims", "1,8,1,1,1"]


def _fullres_train(*arguments):
    return [sys.executable, "-m", "pipelines.cli", "train", *arguments]


def _wait_for(condition, seconds, message, process=None):
    deadline = time.monotonic() + seconds
    while not condition():
        assert process is None or process.poll() is None, f"the run ended first: {message}"
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(demo_data, tmp_path_factory):
    """The reference: the same 20-step run, uninterrupted, in 1 process × 8 devices (this test process's own)."""
    from trainer import config as config_lib, partitioning, train

    output = tmp_path_factory.mktemp("one_process")
    smoke = config_lib.smoke()
    config = config_lib.smoke(train_data=demo_data["train"], output_dir=str(output), steps=STEPS,
                              checkpoint_every=CHECKPOINT_EVERY, log_every=1,
                              partition=partitioning.PartitionConfig((1, 8, 1, 1, 1),
                                                                     smoke.partition.label_partition_dims))
    train.train(config, log=lambda line: None, export_saved_model=False)
    return output


@pytest.fixture(scope="module")
def interrupted(demo_data, tmp_path_factory):
    """One 20-step run in 2 processes × 4 devices (depth split 8-way across them), interrupted twice:

    1. started by the launcher, SIGTERM after the step-4 checkpoint (passed on to both processes);
    2. rerun with the processes started by hand, kill -9 of process 1 after the next checkpoint;
    3. rerun by the launcher to the end.

    Returns what each part showed, for the tests below to judge one acceptance item each.
    """
    run = tmp_path_factory.mktemp("two_processes")
    checkpoint_dir = str(run / "checkpoints")
    launch = _fullres_train(*_train_arguments(demo_data["train"], run, 4), "--local-processes", "2")
    seen = {"run": run, "seconds": {}}

    started = time.monotonic()
    log = open(run.parent / "preempted.log", "w+")
    launcher = subprocess.Popen(launch, env=_environment(), stdout=log, stderr=subprocess.STDOUT, text=True,
                                cwd=REPOSITORY)
    _wait_for(lambda: CHECKPOINT_EVERY in checkpoints.list_steps(checkpoint_dir), 400, "no step-4 checkpoint",
              launcher)
    launcher.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    first_seen = {}  # checkpoint step -> seconds after the signal
    while launcher.poll() is None:
        for step_number in checkpoints.list_steps(checkpoint_dir):
            first_seen.setdefault(step_number, time.monotonic() - signalled)
        assert time.monotonic() - signalled < 120, "the preempted run did not exit within 120 s"
        time.sleep(0.05)
    log.seek(0)
    seen.update(preempted_output=log.read(), preempted_status=launcher.returncode, first_seen=first_seen,
                preempted_checkpoints=checkpoints.list_steps(checkpoint_dir))
    log.close()
    seen["seconds"]["preempted"] = time.monotonic() - started

    stopped = sorted({int(s) for s in re.findall(r"stopped after step (\d+), checkpoint written",
                                                  seen["preempted_output"])})
    assert len(stopped) == 1, seen["preempted_output"][-3000:]  # both processes stopped after the same step
    seen["preempted_at"] = preempted_at = stopped[0]

    started = time.monotonic()
    address = f"localhost:{local_launcher.free_port()}"
    by_hand = [subprocess.Popen(_fullres_train(*_train_arguments(demo_data["train"], run, 4),
                                               "--coordinator-address", address, "--num-processes", "2",
                                               "--process-id", str(i)),
                                env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=REPOSITORY) for i in range(2)]
    seen["next_checkpoint"] = next_checkpoint = (preempted_at // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
    _wait_for(lambda: next_checkpoint in checkpoints.list_steps(checkpoint_dir), 400,
              f"no step-{next_checkpoint} checkpoint after resuming", by_hand[0])
    by_hand[1].kill()
    killed = time.monotonic()
    seen["survivor_output"] = by_hand[0].communicate(timeout=90)[0]
    seen["survivor_seconds"] = time.monotonic() - killed
    seen["survivor_status"] = by_hand[0].returncode
    by_hand[1].wait()
    seen["last_complete"] = max(checkpoints.list_steps(checkpoint_dir))
    seen["seconds"]["killed"] = time.monotonic() - started

    started = time.monotonic()
    seen["finished"] = subprocess.run(launch, env=_environment(), capture_output=True, text=True, cwd=REPOSITORY,
                                      timeout=540)
    seen["seconds"]["finished"] = time.monotonic() - started
    print(f"two-process parts took {seen['seconds']}")
    return seen


@pytest.mark.slow
def test_sigterm_checkpoints_the_current_step_and_exits_75(interrupted):
    """SIGTERM mid-run: both processes finish the same step, its checkpoint is written within 30 s, status 75."""
    assert interrupted["preempted_status"] == distributed.PREEMPTED_EXIT_CODE
    preempted_at = interrupted["preempted_at"]
    assert CHECKPOINT_EVERY < preempted_at < STEPS and max(interrupted["preempted_checkpoints"]) == preempted_at
    seconds = interrupted["first_seen"][preempted_at]
    assert seconds <= 30, f"the preemption checkpoint came {seconds:.0f} s after SIGTERM"
    assert "resume" in interrupted["preempted_output"] and "exit status 75" in interrupted["preempted_output"]


@pytest.mark.slow
def test_kill_9_of_one_process_stops_the_other_within_60_s(interrupted):
    """The rerun resumes from the preemption's step; kill -9 of process 1 ends process 0 with a clear message."""
    output = interrupted["survivor_output"]
    assert f"resuming from checkpoint at step {interrupted['preempted_at']}" in output
    assert interrupted["survivor_seconds"] <= 60
    assert interrupted["survivor_status"] != 0
    assert "another task died" in output, output[-3000:]  # JAX's coordination service names the cause
    assert interrupted["next_checkpoint"] <= interrupted["last_complete"] < STEPS


@pytest.mark.slow
def test_rerun_resumes_and_ends_with_the_uninterrupted_weights(interrupted, uninterrupted):
    """After the preemption and the lost process, the last rerun resumes from the newest complete checkpoint and
    ends where the uninterrupted 1-process × 8-device run ends.

    Loss tolerance: every one of the 20 steps' losses agrees to 1e-5 relative (measured: within 1e-6), which only
    holds if every step saw the same batch, split and augmentation through the preemption, the kill and both
    resumes.

    Weight tolerance: WEIGHT_TOLERANCE, per tensor (weights and Adam moments). See its comment for what was
    measured and why 2 processes end further apart than the step-by-step parity's 1e-5.
    """
    finished, run = interrupted["finished"], interrupted["run"]
    assert finished.returncode == 0, finished.stdout[-3000:]
    last_complete = interrupted["last_complete"]
    assert f"[p0] resuming from checkpoint at step {last_complete}" in finished.stdout
    assert f"[p1] resuming from checkpoint at step {last_complete}" in finished.stdout

    histories = [json.loads((directory / "metrics.json").read_text())["loss_history"]
                 for directory in (run, uninterrupted)]
    assert [s for s, _ in histories[0]] == [s for s, _ in histories[1]] == list(range(1, STEPS + 1))
    for (step_number, ours), (_, theirs) in zip(*histories):
        assert abs(ours - theirs) / abs(theirs) <= TOLERANCE, f"step {step_number}: loss {ours} vs {theirs}"
    ours = checkpoints.load_arrays(str(run / "checkpoints"), STEPS)
    theirs = checkpoints.load_arrays(str(uninterrupted / "checkpoints"), STEPS)
    assert sorted(ours) == sorted(theirs)
    worst = max(_relative(ours[key], theirs[key]) for key in theirs if np.linalg.norm(theirs[key]) > 0)
    print(f"after {STEPS} steps: largest relative difference of a weight or Adam moment {worst:.2e}")
    assert worst <= WEIGHT_TOLERANCE, f"largest relative weight difference {worst:.2e}"
