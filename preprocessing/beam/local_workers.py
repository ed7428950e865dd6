"""Beam's local runner and its worker processes: the runner named exactly, their stderr held back, stopping them.

`conversion` runs the pipeline; this module is what it needs to know about the
processes the local runner starts on this machine.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence

from common import file_writes

# The local runner, named exactly: Beam's "DirectRunner" first tries the Prism runner, which downloads its
# binary from GitHub at run time, and falls back to this FnApiRunner only when that fails.
LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def default_pipeline_args() -> list[str]:
    """Beam's local (FnApi) runner with one worker process per core."""
    return [
        f"--runner={LOCAL_RUNNER}",
        f"--direct_num_workers={os.cpu_count() or 1}",
        "--direct_running_mode=multi_processing",
    ]


@contextlib.contextmanager
def quiet_local_workers(pipeline_args: Sequence[str] | None):
    """Holds back what local Beam workers print to stderr while the pipeline runs, unless the run fails to write.

    A worker prints its traceback straight to the stderr it inherited; when the
    run then fails for want of disk space or permission, the command says so in
    one sentence and the traceback is dropped. On success, or on any other
    failure, everything held back is shown. `fullres --verbose`
    (FULLRES_VERBOSE=1) and remote runners (Dataflow) are left alone.
    """
    if os.environ.get("FULLRES_VERBOSE") == "1" or not is_local(pipeline_args):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        show = True
        try:
            yield
        except Exception as error:
            show = file_writes.write_failure(error, "") is None
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if show:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
                sys.stderr.flush()


_WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"


def is_local(pipeline_args: Sequence[str] | None) -> bool:
    """Whether `pipeline_args` run the pipeline with workers on this machine (the local runner, as fullres names it)."""
    runner = next((a.split("=", 1)[1] for a in (pipeline_args or []) if a.startswith("--runner=")), LOCAL_RUNNER)
    return runner in (LOCAL_RUNNER, "DirectRunner")


class _DropWorkerNotice(logging.Filter):
    """Beam workers' "No semi_persistent_directory found" warning (relayed by the runner) goes to debug logging.

    Every local worker sends it as it starts; it concerns state kept between a Dataflow worker's restarts,
    which a local worker does not have, so it tells the user nothing.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if "No semi_persistent_directory found" not in record.getMessage():
            return True
        logging.getLogger(__name__).debug(record.getMessage())
        return False


_WORKER_NOTICES = _DropWorkerNotice()
_RELAY_LOGGERS = ("apache_beam.runners.portability.local_job_service", "apache_beam.runners.worker.sdk_worker_main")


@contextlib.contextmanager
def without_worker_notices():
    """While the pipeline runs: the workers' notices that concern no local run are not shown."""
    loggers = [logging.getLogger(name) for name in _RELAY_LOGGERS]
    for logger in loggers:
        logger.addFilter(_WORKER_NOTICES)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_WORKER_NOTICES)


def _worker_processes() -> list[int]:
    """Process ids of this process's local Beam SDK workers (Linux /proc; empty elsewhere)."""
    children = collections.defaultdict(list)
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a process may end while we look
            with open(f"/proc/{name}/stat", "rb") as file:
                # The parent id is the 2nd field after the parenthesised command name, which may hold spaces.
                children[int(file.read().rsplit(b")", 1)[1].split()[1])].append(int(name))
    workers, pending = [], list(children[os.getpid()])
    while pending:
        pid = pending.pop()
        pending.extend(children[pid])
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if _WORKER_MODULE in file.read():
                    workers.append(pid)
    return workers


def stop_workers(pipeline_thread: threading.Thread, wait_seconds: float = 10.0) -> None:
    """Kills this process's local Beam workers, then lets the runner wind down (quietly) for a few seconds."""
    beam_logger = logging.getLogger("apache_beam")
    level = beam_logger.level
    beam_logger.setLevel(logging.CRITICAL)  # the runner's complaints about the workers we killed are not for people
    try:
        for pid in _worker_processes():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pipeline_thread.join(wait_seconds)
    finally:
        beam_logger.setLevel(level)
