"""`fullres train --local-processes N`: one training run in N processes on this machine.

Each process is `python -m trainer train` with the same arguments plus its
coordinates (`--coordinator-address localhost:PORT --num-processes N
--process-id I`), so it forms one global mesh with the others exactly as hosts
of a cluster do. Their output is forwarded line by line with a `[pI]` prefix.
When one process fails, the others are stopped (a run that lost a process
cannot go on). SIGTERM to the launcher is passed on to every process (a
preemption: they checkpoint and exit with the "resume me" status, which the
launcher then exits with too).
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


def _forward(stream, prefix: str, log: Callable[[str], None]) -> None:
    for line in iter(stream.readline, ""):
        log(f"{prefix}{line.rstrip()}")
    stream.close()


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
    processes = []
    for process_id in range(num_processes):
        command = [sys.executable, "-m", "trainer", "train", *train_arguments, "--coordinator-address", coordinator,
                   "--num-processes", str(num_processes), "--process-id", str(process_id)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=environment)
        threading.Thread(target=_forward, args=(process.stdout, f"[p{process_id}] ", log), daemon=True).start()
        processes.append(process)
    log(f"[launcher] {num_processes} processes, coordinator {coordinator}, pids "
        f"{' '.join(str(p.pid) for p in processes)}")

    def pass_on(signum, frame):
        log("[launcher] SIGTERM: passing it on to every process (they checkpoint and stop)")
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, pass_on)
    failure = None
    try:
        while any(p.poll() is None for p in processes):
            for process_id, process in enumerate(processes):
                code = process.poll()
                if failure is None and code not in (None, 0, distributed.PREEMPTED_EXIT_CODE):
                    failure = code
                    log(f"[launcher] process {process_id} {_describe(code)}; stopping the other processes, "
                        "since the run cannot go on without it (rerun the same command to resume from the last "
                        "checkpoint)")
                    _stop(processes)
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    codes = [p.wait() for p in processes]
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
