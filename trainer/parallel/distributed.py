"""Multi-process start-up and preemption: `jax.distributed` from the command line or the cluster's environment.

Where the processes come from:

* by hand (or `fullres train --local-processes N`): `--coordinator-address
  HOST:PORT --num-processes N --process-id I` on every process;
* Vertex AI custom jobs (GPU hosts) set `CLUSTER_SPEC`: worker pool 0 is the
  chief, whose first address is the coordinator;
* Cloud TPU slices are found by `jax.distributed.initialize()` itself;
* one process: nothing to do.

All processes of a run form one global mesh. If one of them dies, the others
stop within `HEARTBEAT_TIMEOUT_SECONDS` (JAX's coordination service notices the
missing heartbeats and ends them), instead of waiting forever in a collective.

Preemption (SIGTERM) is agreed on through JAX's preemption sync point: the
process that gets the signal tells the coordinator, and every process learns
the same step at which to stop, checkpoint, and exit with `PREEMPTED_EXIT_CODE`.
Ctrl-C (SIGINT) does the same, in one process or several (`install_stop_handlers`).
Checking costs nothing per step (a local flag until a notice arrives).

Processes start each new compiled program together (`RunTogether`): each
compiles at its own speed (a loaded host, a compilation-cache hit), and gloo,
the CPU collectives, gives up when a peer is 30 s late to the first collective
between a set of devices ("Gloo context initialization failed ... Connect
timeout"), a limit no setting changes.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable

from trainer.parallel import xla_compile

COORDINATOR_PORT = 8476
# How long the others wait for a silent process before they stop (JAX's default is 100 s).
HEARTBEAT_TIMEOUT_SECONDS = 20
# How long a process waits at a barrier for the others (compiling a large step on a loaded host takes minutes);
# a process that died ends the others sooner, through the heartbeats.
BARRIER_TIMEOUT_SECONDS = 3600
# "Preempted, resume me": EX_TEMPFAIL from sysexits.h, a temporary failure worth retrying.
PREEMPTED_EXIT_CODE = 75


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where this process stands in a multi-process run.

    Args:
        coordinator_address: HOST:PORT of process 0's coordination service.
        num_processes: processes in the run, each with its own local devices.
        process_id: this process's number, 0 to num_processes - 1 (0 coordinates).
    """

    coordinator_address: str
    num_processes: int
    process_id: int

    def __post_init__(self):
        host, _, port = self.coordinator_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"coordinator address {self.coordinator_address!r} is not HOST:PORT; write e.g. "
                             f"10.0.0.2:{COORDINATOR_PORT} (process 0's host).")
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process id {self.process_id} is not between 0 and num_processes - 1 "
                             f"({self.num_processes - 1}); number the processes 0, 1, ... {self.num_processes - 1}.")


class Preempted(Exception):
    """Raised by training after it checkpointed at a preemption notice; exit with `PREEMPTED_EXIT_CODE`."""

    def __init__(self, step_number: int):
        super().__init__(f"{'interrupted (Ctrl-C)' if _stop_signal == 'Ctrl-C' else 'preempted (SIGTERM)'}: "
                         f"checkpoint written at step {step_number}; rerun the same command to resume (exit status "
                         f"{PREEMPTED_EXIT_CODE})")
        self.step_number = step_number


def cluster_from_spec(spec: str) -> ProcessGroup | None:
    """The process group a Vertex `CLUSTER_SPEC` describes, or None for a single process.

    Processes are numbered pool by pool (workerpool0 first), then by index.
    """
    values = json.loads(spec)
    cluster, task = values.get("cluster", {}), values.get("task", {})
    pools = sorted(name for name in cluster if name.startswith("workerpool"))
    hosts = [(pool, index) for pool in pools for index in range(len(cluster[pool]))]
    if len(hosts) <= 1:
        return None
    chief = cluster[pools[0]][0].split(":")[0]
    return ProcessGroup(f"{chief}:{COORDINATOR_PORT}", len(hosts), hosts.index((task["type"], int(task["index"]))))


def initialize(group: ProcessGroup | None = None) -> None:
    """Joins this process to its run's global mesh; before any JAX computation.

    Args:
        group: explicit coordinates (from the command line); None reads them
            from the environment (Vertex's `CLUSTER_SPEC`, a TPU slice) and
            does nothing in a single-process run.
    """
    import jax

    if group is None:
        spec = os.environ.get("CLUSTER_SPEC")
        if spec:
            group = cluster_from_spec(spec)
        elif os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:  # a multi-host TPU slice
            jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS)
            install_stop_handlers(jax.process_index())
            return
        if group is None:
            install_stop_handlers()
            return
    if group.num_processes == 1:
        install_stop_handlers()
        return
    # CPU devices of different processes talk through gloo (TCP); other platforms bring their own collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=group.coordinator_address,
        num_processes=group.num_processes,
        process_id=group.process_id,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS,
    )
    install_stop_handlers(group.process_id)
    _cache_cpu_programs_of_every_process()


def _cache_cpu_programs_of_every_process() -> None:
    """Lets every process of a CPU run write its programs to the persistent compilation cache, not only process 0.

    JAX writes the cache from process 0 alone, so that hosts sharing one cache
    folder (GCS, NFS) do not write the same entries; the others read what it
    wrote. On CPU that reading never happens: a CPU program's key holds its
    process's topology, which is that process's own devices (process 0 and 1
    of a 2-process run have different fingerprints, the same in every run), so
    no key of process 1 is ever one that process 0 wrote, and process 1
    compiled every program again in every run: 14.5 CPU-s of XLA compiles in
    a 20-step smoke `--local-processes 2` run (`perf`, 2026-11-26). Its keys
    are its own, so its writes cannot clash with another process's. With them,
    process 1 of that run takes 20 CPU-s instead of 32-39, and the seven
    multi-process tests 207 CPU-s instead of 275 (two runs each).

    Other platforms keep JAX's rule: a TPU or GPU program's key is the same on
    every host, and there the one writer is what JAX means it to be. Where a
    JAX release no longer has the function wrapped here, nothing changes (and
    `tests/trainer/parallel/test_multiprocess.py` fails).
    """
    from jax._src import compilation_cache, compiler, config
    from jax._src import distributed as jax_distributed

    jax_write = getattr(compiler, "_cache_write", None)
    if jax_write is None or getattr(jax_write, "fullres_every_process", False):
        return

    def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        if jax_distributed.global_state.process_id == 0 or backend.platform != "cpu":
            return jax_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
        # JAX's own conditions for an entry, past the process-0 rule.
        if host_callbacks or compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
            return None
        try:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                      int(compile_time_secs))
        except Exception as error:  # as in JAX's own write: a cache that cannot take it does not end the run
            warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': "
                          f"{type(error).__name__}: {error}", stacklevel=2)
        return None

    write.fullres_every_process = True
    compiler._cache_write = write


def initialize_from_environment() -> None:
    """Starts `jax.distributed` when the cluster's environment says this process is one of several."""
    initialize(None)


_stop_signal: str | None = None  # what asked this process to stop: "SIGTERM" or "Ctrl-C"
_last_press: float | None = None  # time.monotonic() of the last Ctrl-C taken as a press of its own
# A Ctrl-C this soon after the last one taken is the same press, passed on: `uv run` outside a terminal sends its
# child the SIGINT that the terminal already sent the whole process group, 200 ms later, and `--local-processes`'s
# launcher passes its own on to processes that had it from the terminal too.
SAME_PRESS_SECONDS = 1.0


def install_stop_handlers(process_id: int | None = None) -> None:
    """Ctrl-C (SIGINT) stops a run as a preemption does: the step ends, its checkpoint is written, and the run exits
    with the resume status, instead of a KeyboardInterrupt's traceback and no checkpoint (`note_stop`).

    Args:
        process_id: this process's number in a run of several (None: the only process). One process reads its own
            flag, set by SIGTERM too. Several agree on the step to stop after through JAX's preemption notifier,
            which holds SIGTERM: a Ctrl-C becomes a SIGTERM to this process, and process 0 alone says it.
    """
    try:
        if process_id is None:
            signal.signal(signal.SIGTERM, note_stop)
        signal.signal(signal.SIGINT, functools.partial(note_stop, process_id=process_id))
    except ValueError:  # not the main thread (e.g. inside a test runner's worker); the signals keep their defaults
        pass


def note_stop(signum: int, frame=None, process_id: int | None = None) -> None:
    """The signal handler: the first SIGTERM or Ctrl-C asks the run to stop after this step. A Ctrl-C after it is
    said and ignored, so none lands in JAX's exit-time clean-up as a traceback, unless it is the same press passed
    on (within `SAME_PRESS_SECONDS`): that one is not said at all."""
    global _stop_signal, _last_press
    if signum == signal.SIGINT:
        now = time.monotonic()
        if _last_press is not None and now - _last_press < SAME_PRESS_SECONDS:
            return
        _last_press = now
    says = signum == signal.SIGINT and not process_id
    if _stop_signal is not None:
        if says:
            print(f"fullres: already stopping after this step's checkpoint; kill -KILL {os.getpid()} stops at "
                  "once, without it", file=sys.stderr, flush=True)
        return
    _stop_signal = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    # Past the run, at exit: ignored. Python's finalization would otherwise hand SIGINT back to the system, and
    # a Ctrl-C in JAX's clean-up would end the process by the signal (status 130), not with the resume status.
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)  # runs before JAX's own, registered earlier
    if process_id is not None:
        os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier tells the others
    if says:
        print("fullres: Ctrl-C: finishing this step, then writing its checkpoint and exiting with status "
              f"{PREEMPTED_EXIT_CODE} (rerun the same command to resume)", file=sys.stderr, flush=True)


_barrier_numbers = itertools.count()


def wait_for_the_others(name: str) -> None:
    """Returns when every process of the run has called this (with the same `name`, in the same order).

    A barrier of JAX's coordination service, not a device collective (Orbax's
    `sync_global_processes` is one by default, so gloo's 30 s would apply to
    it too); nothing to do in one process.
    """
    import jax

    if jax.process_count() == 1:
        return
    from orbax.checkpoint import multihost

    barrier = multihost.get_barrier_sync_fn()
    barrier(key=f"fullres-{next(_barrier_numbers)}-{name}", timeout_ms=BARRIER_TIMEOUT_SECONDS * 1000)


class RunTogether:
    """A jitted function that, across processes, starts each newly compiled program on every process at once.

    In one process it is the jitted function itself. With several, a call
    with new argument shapes compiles ahead of time, waits for the other
    processes to finish compiling theirs (`wait_for_the_others`), then runs;
    later calls with those shapes run the compiled program directly.
    """

    def __init__(self, jitted, name: str, log: Callable[[str], None] = print):
        self.jitted = jitted
        self.name = name
        self.log = log
        self._compiled: dict = {}
        self._primed: dict = {}
        self._options: dict = {}  # compiler options the program needs (xla_compile.py); {}: the default

    def __call__(self, *args):
        import jax

        if jax.process_count() == 1 and not self._options:
            return self.jitted(*args)
        key = _shapes_key(args)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._primed.pop(key, None) or xla_compile.compile(self.jitted.lower(*args), self._options)[0]
            wait_for_the_others(self.name)
            self._compiled[key] = compiled
        return compiled(*args)

    def prime(self, compiled, *args, options: dict | None = None) -> None:
        """Hands over `compiled`, this function already compiled for `args` (`jax.ShapeDtypeStruct`s will do), for
        the first call with those shapes to run instead of compiling it again. Process 0 would read it back from
        JAX's persistent cache; the others neither write nor read that cache, so without this they compiled the
        training step twice (once for the gather check). In one process it keeps nothing, unless the compile needed
        `options` (`xla_compile.compile`: the jitted function, compiled by default, would fail): the jitted
        function is called there, and holding a second executable would only take memory."""
        import jax

        if options:
            self._options = dict(options)
            self.log(f"{self.name}: {xla_compile.describe(options)}")
        if jax.process_count() > 1 or options:
            self._primed[_shapes_key(args)] = compiled


def _shapes_key(args) -> tuple:
    """`RunTogether`'s key for its compiled programs: the arguments' tree, shapes and dtypes."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(args)
    return treedef, tuple((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves)


def preemption_reached(step_number: int) -> bool:
    """True at the step where every process of the run stops for a preemption notice.

    Call it once per step, with the same step numbers on every process.
    """
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        return multihost_utils.reached_preemption_sync_point(step_number)
    return _stop_signal is not None
