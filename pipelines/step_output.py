"""What a local pipeline run shows: the steps and fullres's own lines, the rest in a log file.

kfp.local prints each step's executor input (a page of JSON), the KFP
executor's and Beam workers' INFO lines, and every output artifact's repr,
and warns twice per step about settings a local run ignores (warnings go to
the log file only). The user needs
the steps, the progress lines and the result. Every line still goes to the run's
log file, so nothing is lost; `fullres --verbose` shows it all on the terminal.

A step that fails prints Python's traceback; the terminal shows none of it
(it stays in the log file), and the exception's own sentence, the one the
step's command would print, is kept in `failures` for the run's error.

The lines come from two places, both through `sys.stdout` while the run lasts:
kfp's own log records (`HH:MM:SS.mmm - LEVEL - message`, some spanning
several lines) and each step's output, which kfp streams between its
"Streamed logs:" record and the step's status record, indented by 4 spaces.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

_RECORD = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} - (?P<level>[A-Z]+) - (?P<message>.*)$")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_NAMED = re.compile(r"^(?P<what>Executing task|Task|Pipeline) '(?P<name>[^']+)'(?P<rest>.*)$")
# Per-step chatter of the KFP executor and Beam's workers; errors from them are kept.
_EXECUTOR_NOISE = re.compile(r"\[KFP Executor [^\]]* (INFO|DEBUG|WARNING)\]")
# JAX looking for accelerators that are not there (the TPU plug-in on a machine without TPUs).
_ACCELERATOR_PROBE = re.compile(r"libtpu|Unable to initialize backend|TPU platform|CUDA-enabled jaxlib")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(: (?P<message>.*))?$")


class StepOutput:
    """A text stream for `sys.stdout`: every line into `log`, the lines a user needs onto `terminal`.

    Args:
        terminal: where the kept lines go (the real stdout).
        log: the run's log file; receives every line.
        verbose: keep every line on the terminal too.
    """

    def __init__(self, terminal: TextIO, log: TextIO, verbose: bool = False):
        self._terminal = terminal
        self._log = log
        self._verbose = verbose
        self._pending = ""
        self._state = "between"  # "streaming" inside a step's output, "executor_input" inside its JSON dump,
        # "traceback" inside a failing step's traceback
        self._step = ""
        self._exception: str | None = None  # the sentence of the traceback being read
        self._awaiting_exception = False
        self.failures: list[tuple[str, str]] = []  # (step, the sentence its exception says), in order

    def write(self, text: str) -> int:
        self._log.write(text)
        if self._verbose:
            self._terminal.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            kept = self.keep(line)  # also under --verbose: `failures` is read from what passes
            if kept is not None and not self._verbose:
                self._terminal.write(kept + "\n")
                self._terminal.flush()  # progress shows as it happens, also when piped
        return len(text)

    def flush(self) -> None:
        self._log.flush()
        self._terminal.flush()

    def isatty(self) -> bool:
        return False

    def finish(self) -> None:
        """Ends a last line written without its newline."""
        if self._pending:
            self.write("\n")

    def keep(self, line: str) -> str | None:
        """The line as the terminal shows it, or None to leave it to the log file."""
        line = _COLOUR.sub("", line)
        record = _RECORD.match(line)
        if record:
            if self._state == "traceback" and self._exception is not None:
                self.failures.append((self._step, self._exception))
            message, level = record["message"], record["level"]
            if message.startswith("Streamed logs:"):
                self._state = "streaming"
                return None
            self._state = "between"
            named = _NAMED.match(message)
            if named and named["what"] == "Executing task":
                self._step, self._exception = named["name"], None
                return f"step {named['name']}"
            if named and named["rest"].startswith(" finished with status "):
                return f"{named['what'].lower().replace('task', 'step')} {named['name']}: {named['rest'].split()[-1]}"
            if level in ("WARNING", "ERROR", "CRITICAL"):
                return f"{level}: {message}"
            return None  # "Running pipeline", artifact listings, workspace clean-up
        if self._state == "executor_input":
            if line == "    }":
                self._state = "streaming"
            return None
        if self._state == "traceback":
            self._read_traceback(line[4:] if line.startswith("    ") else line)
            return None
        if self._state == "streaming":
            if line.rstrip().endswith("Got executor_input:"):
                self._state = "executor_input"
                return None
            if line.strip() == _TRACEBACK:
                self._state, self._awaiting_exception = "traceback", True
                return None
            if not line.strip() or _EXECUTOR_NOISE.search(line) or _ACCELERATOR_PROBE.search(line):
                return None
            return line
        # Between steps: the rest of a multi-line record (an artifact listing) and the separators.
        if not line.strip() or line.startswith(" ") or set(line.strip()) == {"-"}:
            return None
        return line


    def _read_traceback(self, body: str) -> None:
        """Follows a traceback (kfp's indent taken off): frames, chained tracebacks, then the exception's line."""
        if not body.strip():
            return
        if body.startswith(" ") or body.strip() == _TRACEBACK or body.startswith(_CHAINED):
            self._awaiting_exception = True  # frames and chains: an exception line follows
            return
        if self._awaiting_exception:
            found = _EXCEPTION.match(body)
            self._exception = (found["message"] or found["type"]) if found else body
            self._awaiting_exception = False
        # Otherwise the exception's message goes on over more lines: the log file has them.


@contextlib.contextmanager
def captured(log_path: str, verbose: bool = False) -> Iterator[StepOutput]:
    """While the context lasts, `sys.stdout` is a `StepOutput` writing every line to `log_path`."""
    with open(log_path, "a", encoding="utf-8") as log, warnings.catch_warnings():
        if not verbose:  # warnings go to the log file only
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
                warnings.formatwarning(message, category, filename, lineno, line))
        terminal = sys.stdout
        stream = StepOutput(terminal, log, verbose)
        sys.stdout = stream
        try:
            yield stream
        finally:
            sys.stdout = terminal
            stream.finish()
            terminal.flush()
