"""Ctrl-C stops a run as SIGTERM does (issue #51): the step ends, its checkpoint is written, the run exits with the
resume status 75, and a rerun resumes. It printed a KeyboardInterrupt's traceback, exited 130 and wrote no
checkpoint; a second Ctrl-C printed JAX's exit-time traceback."""

import os
import signal
import subprocess
import sys
import time

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # one training process, stopped after its first logged step (about 30 s on the shared machine)
def test_ctrl_c_checkpoints_the_step_and_exits_with_the_resume_status(demo_data, tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = tmp_path / "run"
    # In a session of its own, as a terminal's foreground job: Ctrl-C signals its whole process group.
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--preset", "smoke", "--train", demo_data["train"], "--output",
         str(run), "--steps", "100000", "--log-every", "1", "--checkpoint-every", "100000", "--virtual-devices", "1",
         "--batch-size", "1", "--set", "model.base_filters=2", "--no-saved-model"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY, env=environment,
        start_new_session=True)
    try:
        for line in process.stdout:  # the first step has run
            if line.startswith("step "):
                break
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.05)  # a second press while the step finishes and its checkpoint is written (CI's run exited
        os.killpg(process.pid, signal.SIGINT)  # within 0.3 s of the first, before a later press could be said)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:  # Ctrl-C again, and again, until it exits
            time.sleep(0.3)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "fullres: Ctrl-C: finishing this step, then writing its checkpoint and exiting with status 75" in err
    assert "fullres: already stopping after this step's checkpoint" in err  # the second Ctrl-C, said
    stopped = next(line for line in out.splitlines() if line.startswith("fullres: interrupted (Ctrl-C)"))
    step = int(stopped.split("checkpoint written at step ")[1].split(";")[0])
    assert stopped.endswith("rerun the same command to resume (exit status 75)")
    assert step >= 1 and os.path.isdir(run / "checkpoints" / f"{step:08d}")
    assert not (run / "model.keras").exists()
