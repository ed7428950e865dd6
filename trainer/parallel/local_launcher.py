"""`fullres train --local-processes N`: one training run in N processes on this machine.

Each process is `python -m trainer train` with the same arguments plus its
coordinates (`--coordinator-address localhost:PORT --num-processes N
--process-id I`), so it forms one global mesh with the others exactly as hosts
of a cluster do. Their output is forwarded line by line with a `[pI]` prefix.
When one process fails, the others are stopped (a run that lost a process
cannot go on). SIGTERM to the launcher is passed on to every process (a
preemption: they checkpoint and exit with the "resume me" status, which the
launcher then exits with too), and so is Ctrl-C (SIGINT): the processes had it
from the terminal too, and take the two as one press.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from trainer.parallel import distributed


def free_port() -> int:
    """A TCP port nobody listens on right now (for the coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


REFUSAL = "fullres: error: "  # how a process's one-sentence refusal begins (`common.console.fail`)
REFUSAL_GRACE_SECONDS = 10  # after one process refused, before the others still running are stopped


def _forward(stream, prefix: str, log: Callable[[str], None], refusals: list[str], hold: bool) -> None:
    """Each line of `stream` to `log` under `prefix`; its refusals kept in `refusals` too, and with `hold`, only
    there (`_said_once` says them at the end)."""
    for line in iter(stream.readline, ""):
        if line.startswith(REFUSAL):
            refusals.append(line.rstrip())
            if hold:
                continue
        log(f"{prefix}{line.rstrip()}")
    stream.close()


def _said_once(refusals: list[list[str]], log: Callable[[str], None]) -> None:
    """The refusals of processes 1, 2, ... that process 0 did not say: one of the command line or the data is every
    process's, and is printed once, by process 0, not once a process."""
    for process_id, lines in enumerate(refusals[1:], start=1):
        for line in lines:
            if line not in refusals[0]:
                log(f"[p{process_id}] {line}")


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


def launch(train_arguments: Sequence[str], num_processes: int, log: Callable[[str], None] = print) -> int:
    """Runs `fullres train TRAIN_ARGUMENTS` in `num_processes` local processes; returns the run's exit status.

    Args:
        train_arguments: the `fullres train` options, without `--local-processes`
            (`--virtual-devices K` gives each process K CPU devices).
        num_processes: how many processes.
        log: where the prefixed lines go.

    Returns:
        0 when every process finished, `distributed.PREEMPTED_EXIT_CODE` when
        they all stopped for a preemption, otherwise the first failure's status.
    """
    coordinator = f"localhost:{free_port()}"
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    processes, readers = [], []
    refusals: list[list[str]] = [[] for _ in range(num_processes)]
    for process_id in range(num_processes):
        command = [sys.executable, "-m", "trainer", "train", *train_arguments, "--coordinator-address", coordinator,
                   "--num-processes", str(num_processes), "--process-id", str(process_id)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=environment)
        readers.append(threading.Thread(target=_forward, daemon=True, args=(
            process.stdout, f"[p{process_id}] ", log, refusals[process_id], process_id > 0)))
        readers[-1].start()
        processes.append(process)
    log(f"[launcher] {num_processes} processes, coordinator {coordinator}, pids "
        f"{' '.join(str(p.pid) for p in processes)}")

    def pass_on(signum, frame):
        if signum == signal.SIGTERM:  # Ctrl-C is said by process 0
            log("[launcher] SIGTERM: passing it on to every process (they checkpoint and stop)")
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, pass_on)
    previous_ctrl_c = signal.signal(signal.SIGINT, pass_on)
    failure, stop_at = None, None
    try:
        while any(p.poll() is None for p in processes):
            for process_id, process in enumerate(processes):
                code = process.poll()
                if failure is None and code not in (None, 0, distributed.PREEMPTED_EXIT_CODE):
                    failure = code
                    log(f"[launcher] process {process_id} refused the run (status 2); stopping the other processes"
                        if code == 2 else  # a sentence of the command line or the data: nothing to resume
                        f"[launcher] process {process_id} {_describe(code)}; stopping the other processes, "
                        "since the run cannot go on without it (rerun the same command to resume from the last "
                        "checkpoint)")
                    # The others refuse the same command line or data a moment later, process 0 saying it: waited for.
                    stop_at = time.monotonic() + (REFUSAL_GRACE_SECONDS if code == 2 else 0)
            if stop_at is not None and time.monotonic() >= stop_at:
                _stop(processes)
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_ctrl_c)
    codes = [p.wait() for p in processes]
    for reader in readers:
        reader.join(timeout=10)  # each process's last lines, read to its end
    _said_once(refusals, log)
    if failure is not None:
        return failure if failure > 0 else 128 - failure
    if all(code == 0 for code in codes):
        return 0
    if all(code in (0, distributed.PREEMPTED_EXIT_CODE) for code in codes):
        return distributed.PREEMPTED_EXIT_CODE
    bad = next(code for code in codes if code not in (0, distributed.PREEMPTED_EXIT_CODE))
    return bad if bad > 0 else 128 - bad


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGKILL at once: a survivor cannot checkpoint without the lost process, and SIGTERM would make it try."""
    for process in processes:
        if process.poll() is None:
            process.kill()
