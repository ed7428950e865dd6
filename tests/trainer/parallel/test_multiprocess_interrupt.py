"""Ctrl-C in a run of several processes (`fullres train --local-processes 2`) stops it as SIGTERM does: every
process finishes the same step, its checkpoint is written, and the run exits with the resume status 75. It ended
each process with a KeyboardInterrupt's traceback and no checkpoint."""

import os
import re
import signal
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.slow  # two training processes, stopped after their first logged step (about 60 s on the shared machine)
@pytest.mark.integration
def test_ctrl_c_in_a_multi_process_run_checkpoints_the_same_step_and_exits_75(demo_data, tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    environment["PYTHONUNBUFFERED"] = "1"
    run = tmp_path / "run"
    # In a session of its own, as a terminal's foreground job: Ctrl-C signals the launcher and both processes.
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--local-processes", "2", "--preset", "smoke", "--train",
         demo_data["train"], "--output", str(run), "--steps", "100000", "--log-every", "1", "--checkpoint-every",
         "100000", "--virtual-devices", "1", "--batch-size", "2", "--set", "model.base_filters=2",
         "--no-saved-model"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPOSITORY, env=environment,
        start_new_session=True)
    try:
        before = []
        for line in launcher.stdout:  # both processes have run a step
            before.append(line)
            if line.startswith("[p0] step "):
                break
        os.killpg(launcher.pid, signal.SIGINT)
        out = "".join(before) + launcher.communicate(timeout=120)[0]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 75, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert out.count("fullres: Ctrl-C: finishing this step") == 1, out[-3000:]  # said once, by process 0
    stopped = {process: int(step) for process, step in
               re.findall(r"\[p(\d)\] fullres: interrupted \(Ctrl-C\): checkpoint written at step (\d+)", out)}
    assert sorted(stopped) == ["0", "1"] and len(set(stopped.values())) == 1, out[-3000:]
    step = stopped["0"]
    assert os.listdir(run / "checkpoints") == [f"{step:08d}"], out[-3000:]
    assert not (run / "model.keras").exists()
