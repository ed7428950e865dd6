"""Checkpoints: the whole `TrainState` and its step, through Orbax, from one process or many.

A checkpoint is one directory named after its step (`checkpoints/00000040/`).
Every process calls `save` and writes the shards its devices hold; the primary
process (0) writes the metadata and, once all have finished, renames the
temporary directory into place, so a crash leaves either the previous
checkpoint or the new one, never half of one. Only the newest `keep` are kept;
restarting the same run in the same output directory resumes from the newest
complete one, restored straight onto the mesh (no host copy of the whole state,
which a state spanning processes would not allow). Local paths and gs:// work
alike.
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import re
import shutil
import sys
import traceback
import uuid
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath  # Orbax's path library (local paths and gs:// alike)

from trainer.engine import placement

_STEP_DIGITS = 8
DAMAGED_SUFFIX = ".damaged"  # a damaged checkpoint, set aside: `00000040.damaged`


def _absolute(directory: str) -> str:
    return directory if "://" in directory else os.path.abspath(directory)


def list_steps(directory: str) -> list[int]:
    """Steps of the complete checkpoints in `directory`, oldest first (temporary ones are not listed)."""
    return sorted(ocp.utils.checkpoint_steps(_absolute(directory)))


def load_arrays(directory: str, step_number: int) -> dict[str, np.ndarray]:
    """The checkpoint of `step_number` as host arrays named `trainable/00000`, ... (to inspect or compare runs)."""
    path = os.path.join(_absolute(directory), f"{step_number:0{_STEP_DIGITS}d}", "default")
    reader = ocp.PyTreeCheckpointer()
    stored = _metadata_tree(reader.metadata(path).item_metadata)
    as_numpy = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), stored,
                                      is_leaf=_is_array_metadata)
    tree = reader.restore(path, restore_args=as_numpy)
    return {f"{group}/{index:05d}": value for group, values in tree.items() for index, value in enumerate(values)}


def _metadata_tree(metadata) -> dict:
    """The plain tree of array metadata (shape, dtype) inside what Orbax returns as an item's metadata."""
    return dict(getattr(metadata, "tree", metadata))


def _as_tree(state: placement.TrainState) -> dict:
    return {group: list(values) for group, values in state._asdict().items()}


class Checkpointer:
    """The checkpoints of one run; every process of the run creates one and calls every method.

    Example:
        >>> checkpointer = Checkpointer("/tmp/run/checkpoints", keep=3)  # doctest: +SKIP
        >>> restored = checkpointer.restore_latest(state)  # doctest: +SKIP
        >>> checkpointer.save(100, state)  # doctest: +SKIP
        >>> checkpointer.close()  # doctest: +SKIP
    """

    def __init__(self, directory: str, keep: int = 3):
        self.directory = _absolute(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            step_format_fixed_length=_STEP_DIGITS,
            create=True,
            cleanup_tmp_directories=True,  # what a crash mid-save left behind
            enable_async_checkpointing=False,  # a checkpoint is complete when save returns
        )
        # The handler named up front, so a fresh manager (a resumed run) can read the metadata before restoring.
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=ocp.StandardCheckpointHandler())
        # Orbax removes what an interrupted save left behind in a background thread that only `save` waits for.
        # A run that stops before its first save (a full disk, a refused config) would exit with that thread
        # still working, and its traceback at interpreter exit would follow fullres's one-sentence error. Orbax
        # (0.12) has no public call for this wait, hence the private one; without it, the cleanup still happens.
        wait_for_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if wait_for_cleanup is not None:
            wait_for_cleanup()
        _quiet_failed_operations()

    def save(self, step_number: int, state: placement.TrainState) -> None:
        """Writes the checkpoint for `step_number` (a no-op if it exists) and deletes all but the newest `keep`."""
        if step_number in self._manager.all_steps():
            return
        path = os.path.join(self.directory, f"{step_number:0{_STEP_DIGITS}d}")
        # Orbax's writer threads log their failure with a traceback each before `save` raises it; the error
        # raised here says it once.
        absl_logger = logging.getLogger("absl")
        absl_logger.addFilter(_WRITER_THREAD_FAILURES)
        try:
            self._manager.save(step_number, args=ocp.args.StandardSave(_as_tree(state)), force=True)
            self._manager.wait_until_finished()
        except Exception as error:
            code = _write_error(error)
            if code is None:
                raise
            gc.collect()  # the failed writes' leftovers call back now, into the filter, not at interpreter exit
            self._remove_unfinished(step_number)
            raise OSError(code, os.strerror(code), path) from error
        finally:
            absl_logger.removeFilter(_WRITER_THREAD_FAILURES)

    def _remove_unfinished(self, step_number: int) -> None:
        """Removes what a failed save of `step_number` wrote (Orbax's temporary folder, its own name), on process 0.

        Orbax would remove it at the next start; on a full disk it would hold the space until then.
        """
        import jax

        if jax.process_index() != 0 or "://" in self.directory:
            return
        prefix = f"{step_number:0{_STEP_DIGITS}d}{_ORBAX_TEMPORARY}"
        for name in os.listdir(self.directory) if os.path.isdir(self.directory) else []:
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def restore_latest(self, like: placement.TrainState, log: Callable[[str], None] = print
                       ) -> tuple[placement.TrainState, int] | None:
        """The newest intact checkpoint, laid out like `like` (arrays on the mesh), and its step; None if there is none.

        A damaged checkpoint (a file truncated or missing, metadata that is not JSON) is named in the log and the
        one before it is tried. Those passed over are moved aside to `XXXXXXXX.damaged` beside the others, never
        deleted: left in place, Orbax would list one as the newest again, and the resumed run could not save
        its own checkpoint of that step. When none is intact nothing is moved, and the error says what to do.

        Raises:
            ValueError: when the checkpoint does not fit the model (another config wrote it).
            CheckpointDamaged: every checkpoint is damaged.
        """
        self._manager.reload()
        damaged: list[tuple[str, str]] = []  # (path, why)
        found = self._newest_intact(damaged, like, log)
        if damaged:
            gc.collect()  # the failed reads' leftovers call back now, into the filter, not at interpreter exit
        if found is not None:
            if damaged:
                self._set_aside([damaged_path for damaged_path, _ in damaged], log)
            return found
        if damaged:
            newest, why = damaged[0]
            older = f" and the {len(damaged) - 1} before it" if len(damaged) > 1 else ""
            raise CheckpointDamaged(
                f"checkpoint {newest} is damaged ({why}){older}, and no intact checkpoint is left to resume from; "
                f"move {self.directory} away to train from step 0 (fullres keeps it for you to inspect), "
                "or train into a new --output directory.")
        return None

    def _newest_intact(self, damaged: list[tuple[str, str]], like: placement.TrainState,
                       log: Callable[[str], None]) -> tuple[placement.TrainState, int] | None:
        """The newest checkpoint that restores, and its step; each damaged one on the way is added to `damaged`."""
        for step_number in sorted(self._manager.all_steps(), reverse=True):
            path = os.path.join(self.directory, f"{step_number:0{_STEP_DIGITS}d}")
            try:
                restored = self._restore(step_number, path, like)
            except _ModelMismatch:
                raise
            except Exception as error:
                why = _damage(error)
                if why is None:
                    raise
                log(f"checkpoint {path} is damaged ({why}); trying the one before it")
                damaged.append((path, why))
                continue
            return restored, step_number
        return None

    def _restore(self, step_number: int, path: str, like: placement.TrainState) -> placement.TrainState:
        target = _as_tree(like)
        stored = _metadata_tree(self._manager.item_metadata(step_number))
        stored_shapes = jax.tree_util.tree_map(lambda m: tuple(m.shape), stored, is_leaf=_is_array_metadata)
        wanted_shapes = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), target)
        if stored_shapes != wanted_shapes:
            raise _ModelMismatch(
                f"checkpoint {path} does not match this model ({_first_difference(stored_shapes, wanted_shapes)}); "
                "resume with the configuration that wrote it, or train into a new --output directory."
            )
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None)), target
        )
        restored = self._manager.restore(step_number, args=ocp.args.StandardRestore(abstract))
        return placement.TrainState(**restored)

    def _set_aside(self, paths: list[str], log: Callable[[str], None]) -> None:
        """Renames damaged checkpoints to `XXXXXXXX.damaged` (process 0; a name Orbax does not list as a step)."""
        import jax

        from trainer.parallel import distributed

        distributed.wait_for_the_others("damaged checkpoints read")  # nobody still reads what is renamed
        if jax.process_index() == 0:
            for path in paths:
                aside = f"{path}{DAMAGED_SUFFIX}"
                if os.path.lexists(aside):
                    aside = f"{aside}-{uuid.uuid4().hex[:8]}"
                epath.Path(path).rename(aside)  # os.rename locally; Orbax's own path library on gs://
                log(f"moved the damaged checkpoint {path} aside to {aside} (fullres keeps it; delete it when done)")
        distributed.wait_for_the_others("damaged checkpoints set aside")
        self._manager.reload()

    def close(self) -> None:
        self._manager.close()


_ORBAX_TEMPORARY = ".orbax-checkpoint-tmp"  # Orbax's name for a checkpoint being written: `00000040.orbax-checkpoint-tmp`
# The operating system's error inside TensorStore's text: "Failed to write 18143 bytes to file 17: No space left on
# device [os_error_code='28']".
_OS_ERROR_CODE = re.compile(r"\[os_error_code='(\d+)'\]")


class _OrbaxThreadFailure(logging.Filter):
    """Orbax's "_SignalingThread.run() raised an exception" records (with their tracebacks) go to debug logging."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "raised an exception" not in record.getMessage():
            return True
        logging.getLogger(__name__).debug(record.getMessage(), exc_info=record.exc_info)
        return False


_WRITER_THREAD_FAILURES = _OrbaxThreadFailure()


def _write_error(error: BaseException) -> int | None:
    """The errno of a failed checkpoint write the machine caused (disk full, quota, permission, read-only); else None."""
    seen, current = set(), error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _WRITE_ERRNOS:
            return current.errno
        found = _OS_ERROR_CODE.search(str(current))
        if found and int(found.group(1)) in _WRITE_ERRNOS:
            return int(found.group(1))
        current = current.__cause__ or current.__context__
    return None


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


class CheckpointDamaged(ValueError):
    """No checkpoint of the run can be read; the message names the newest and what to do."""


class _ModelMismatch(ValueError):
    """A checkpoint of another model (raised as is: it is intact, only not this run's)."""


# Status codes of TensorStore (the arrays) that mean the stored bytes are wrong, not that reading them failed.
_DAMAGE_CODES = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION")


def _damage(error: BaseException) -> str | None:
    """What is wrong with a checkpoint that failed to load, in a few words; None if the failure is not damage.

    Damage: a file truncated or missing (TensorStore's DATA_LOSS, OUT_OF_RANGE, NOT_FOUND), metadata that is
    not JSON. Anything else (permission denied, an unreachable bucket, out of memory) is not the checkpoint's
    fault, and is raised as it is.
    """
    text = str(error).split(" [tensorstore_spec=", 1)[0].strip()
    if isinstance(error, json.JSONDecodeError):
        return f"unreadable metadata: {error.msg} at character {error.pos}"
    if isinstance(error, FileNotFoundError):
        return f"{error.filename or text} is missing"
    code = text.split(":", 1)[0]
    if isinstance(error, ValueError) and code in _DAMAGE_CODES:
        return text.rsplit(": ", 1)[-1]  # the innermost cause: "Requested byte range [0, 332) is not valid ..."
    return None


class _OrbaxUnretrievedTask(logging.Filter):
    """asyncio's "... exception was never retrieved" records of Orbax's tasks and futures go to debug logging."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "exception was never retrieved" not in message:
            return True
        # Orbax's own tasks; and the futures of TensorStore's reads and writes, whose tracebacks pass through no
        # Orbax frame, when they failed as fullres reports in its own words: a damaged checkpoint or a full disk
        # or denied write (CI saw each leak once, depending on which array's future failed first).
        error = record.exc_info[1] if record.exc_info else None
        reported = error is not None and (_damage(error) is not None or _write_error(error) is not None)
        if not (_raised_in_orbax(record.exc_info) or reported):
            return True
        logging.getLogger(__name__).debug(message, exc_info=record.exc_info)
        return False


_UNRETRIEVED_TASKS = _OrbaxUnretrievedTask()


def _raised_in_orbax(exc_info) -> bool:
    """Whether the exception of a log record was raised inside Orbax (its traceback passes through Orbax's code)."""
    if not exc_info or exc_info[2] is None:
        return False
    return any(f"{os.sep}orbax{os.sep}" in frame.filename for frame in traceback.extract_tb(exc_info[2]))


def _quiet_failed_operations() -> None:
    """Keeps the aftermath of a failed Orbax read or write off the terminal, for the rest of the process.

    Orbax closes the event loop of a read or write that failed (a damaged checkpoint, a full disk), and the
    failure of one array leaves the others' tasks unawaited. TensorStore's other operations still finish and
    call back into the closed loop ("Event loop is closed", through sys.unraisablehook), and asyncio logs each
    unawaited task's error when it is collected ("Task exception was never retrieved"), up to seconds later
    or at interpreter exit: ten tracebacks after a full disk, in the middle of the run's log or after
    fullres's sentence. They say nothing the log or the sentence does not; other unraisable errors and
    other tasks' errors still reach the terminal.
    """
    asyncio_logger = logging.getLogger("asyncio")
    if _UNRETRIEVED_TASKS not in asyncio_logger.filters:
        asyncio_logger.addFilter(_UNRETRIEVED_TASKS)
    previous = sys.unraisablehook
    if getattr(previous, "fullres_quiet_closed_loop", False):
        return

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
            logging.getLogger(__name__).debug("a TensorStore callback found its event loop closed")
            return
        previous(unraisable)

    hook.fullres_quiet_closed_loop = True
    sys.unraisablehook = hook


def _is_array_metadata(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _first_difference(stored: dict, wanted: dict) -> str:
    for group in wanted:
        ours, theirs = wanted[group], stored.get(group)
        if theirs is None or len(theirs) != len(ours):
            return f"{group}: {0 if theirs is None else len(theirs)} arrays stored, {len(ours)} expected"
        for index, (a, b) in enumerate(zip(theirs, ours)):
            if a != b:
                return f"{group}/{index:05d}: stored shape {a}, expected {b}"
    return "another layout of the state"
