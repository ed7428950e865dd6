"""Ctrl-C stops a run as SIGTERM does: the step ends, its checkpoint is written, the run exits with the
resume status 75, and a rerun resumes. It printed a KeyboardInterrupt's traceback, exited 130 and wrote no
checkpoint; a second Ctrl-C printed JAX's exit-time traceback."""

import os
import signal
import subprocess
import sys
import time
import types

import pytest

from trainer.parallel import distributed

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _endless_run(demo_data, run, stderr) -> subprocess.Popen:
    """The smoke network training for ever, each step logged, no checkpoint but Ctrl-C's: in a session of its own,
    as a terminal's foreground job (Ctrl-C signals its whole process group). `stderr`: PIPE, or STDOUT."""
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    environment["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--preset", "smoke", "--train", demo_data["train"], "--output",
         str(run), "--steps", "100000", "--log-every", "1", "--checkpoint-every", "100000", "--virtual-devices", "1",
         "--batch-size", "1", "--set", "model.base_filters=2", "--no-saved-model"],
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPOSITORY, env=environment, start_new_session=True)


def test_a_later_ctrl_c_is_said_and_the_same_press_passed_on_is_not(monkeypatch, capsys):
    """The signal handler itself, on a clock of the test's: one press, passed on 200 ms later by `uv run`, is said
    once; the user's second press, 1.5 s later, is said as one (with how to stop at once)."""
    clock = [1000.0]
    monkeypatch.setattr(distributed, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(distributed, "atexit", types.SimpleNamespace(register=lambda *args: None))
    monkeypatch.setattr(distributed, "_stop_signal", None)
    monkeypatch.setattr(distributed, "_last_press", None)
    distributed.note_stop(signal.SIGINT)
    clock[0] += 0.2
    distributed.note_stop(signal.SIGINT)
    said = capsys.readouterr().err
    assert said.count("fullres: Ctrl-C: finishing this step") == 1 and "already stopping" not in said
    assert distributed.preemption_reached(7)
    clock[0] += 1.5
    distributed.note_stop(signal.SIGINT)
    assert capsys.readouterr().err == (f"fullres: already stopping after this step's checkpoint; kill -KILL "
                                       f"{os.getpid()} stops at once, without it\n")


@pytest.mark.slow  # one training process, stopped after its first logged step (about 30 s on the shared machine)
def test_ctrl_c_checkpoints_the_step_and_exits_with_the_resume_status(demo_data, tmp_path):
    run = tmp_path / "run"
    process = _endless_run(demo_data, run, subprocess.PIPE)
    try:
        for line in process.stdout:  # the first step has run
            if line.startswith("step "):
                break
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.05)  # a second press while the step finishes and its checkpoint is written (CI's run exited
        os.killpg(process.pid, signal.SIGINT)  # within 0.3 s of the first): taken as the same press, not said
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:  # Ctrl-C again, and again, until it exits:
            time.sleep(0.3)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    # Said once; a press a second after it is said too (whether the run outlasts one is the machine's speed:
    # test_a_later_ctrl_c_is_said_and_the_same_press_passed_on_is_not).
    assert err.count("fullres: Ctrl-C: finishing this step, then writing its checkpoint and exiting with status 75") == 1
    stopped = next(line for line in out.splitlines() if line.startswith("fullres: interrupted (Ctrl-C)"))
    step = int(stopped.split("checkpoint written at step ")[1].split(";")[0])
    assert stopped.endswith("rerun the same command to resume (exit status 75)")
    assert step >= 1 and os.path.isdir(run / "checkpoints" / f"{step:08d}")
    assert not (run / "model.keras").exists()


@pytest.mark.slow  # one training process, stopped after its second logged step (about 30 s on the shared machine)
def test_one_ctrl_c_passed_on_by_a_launcher_is_said_once_and_finishes_only_the_step_it_came_in(demo_data, tmp_path):
    """`uv run` outside a terminal passes the terminal's Ctrl-C on to its child 200 ms after the process group got
    it: one press, two SIGINTs. It was said as two ("already stopping ...; kill -KILL PID"), and the run went on for
    a second step after the one it came in."""
    run = tmp_path / "run"
    process = _endless_run(demo_data, run, subprocess.STDOUT)  # progress and the sentences in the order written
    try:
        before = []
        for line in process.stdout:  # past the compile: steps run one after the other
            before.append(line)
            if line.startswith("step 2/"):
                break
        time.sleep(0.1)  # into the next step's computation
        os.killpg(process.pid, signal.SIGINT)  # the terminal: the whole process group
        time.sleep(0.2)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)  # uv: the same press, passed on to its child
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, out[-3000:]
    assert "Traceback" not in out and "already stopping" not in out, out[-3000:]
    lines = out.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("fullres: Ctrl-C: finishing this step")]
    assert len(said) == 1, out[-3000:]
    stopped = next(line for line in lines if line.startswith("fullres: interrupted (Ctrl-C)"))
    step = int(stopped.split("checkpoint written at step ")[1].split(";")[0])
    logged = [int(line.split()[1].split("/")[0]) for line in before + lines if line.startswith("step ")]
    # The step the press came in is the last one run: at most one step is logged after the sentence, and the
    # checkpoint is the last step logged.
    assert len([line for line in lines[said[0]:] if line.startswith("step ")]) <= 1, out[-3000:]
    assert step == logged[-1] and os.path.isdir(run / "checkpoints" / f"{step:08d}")
