"""What every conversion to TFRecords shares: the Beam run, dead letters, summary and atomic output.

A conversion is a list of work items and a `DoFn` that turns one item into
serialized records (main output) and dead letters (`DEAD_LETTER` tag). This
module runs it and lays out the output directory:

    data-SSSSS-of-NNNNN.tfrecord[.gz]   the records
    dead_letter.jsonl                   {"source", "stage", "reason", "detail"} per rejected input
    notes.json                          the same, per input set aside or repaired without failing (if any)
    summary.json                        {"ok", "failed", "reasons", "shards", "bytes", ...}

    .fullres-output                     the manifest: the files above, which a rerun may replace

Everything is written to a staging directory beside the output and swapped in
only when the pipeline has finished, so a rerun or a crash never leaves old and
new shards mixed. An existing output is replaced only if fullres wrote it, and
then only the files its manifest lists are deleted (`common.output_guard`);
a lock beside the output keeps a second run out while one writes. On a local
disk the swap is two directory renames. On an object store (gs://), which has
no directories to rename, the old files are deleted, the new ones moved in, and
`summary.json` is written last: a reader that finds `summary.json` finds the
complete output.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from common import output_guard

METRICS_NAMESPACE = "fullres"
DEAD_LETTER = "dead_letter"
SUMMARY_COUNTER = "summary/"  # counters named summary/FIELD/KEY become summary.json's FIELD: {KEY: total}
PROGRESS_LOGGER = logging.getLogger("fullres.progress")
# Where the local runners deliver worker log lines: directly (in-memory runner), or
# forwarded from worker processes by the job service (multi-processing DirectRunner).
_PROGRESS_SOURCES = ("fullres.progress", "apache_beam.runners.portability.local_job_service")
_PROGRESS_LINE = re.compile(r"fullres-progress (ok|failed)")


class PreprocessingFailed(RuntimeError):
    """Too many inputs failed; the good ones were still written."""



def reject(letter: dict):
    """Counts a dead letter and returns it as the `DoFn`'s tagged output."""
    Metrics.counter(METRICS_NAMESPACE, f"failed_{letter['reason']}").inc()
    PROGRESS_LOGGER.info("fullres-progress failed %s", letter["source"])
    return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def count(field: str, key, amount: int = 1) -> None:
    """Adds `amount` to `summary.json`'s `field`[`key`] (a conversion's own summary fields, e.g. label values)."""
    Metrics.counter(METRICS_NAMESPACE, f"{SUMMARY_COUNTER}{field}/{key}").inc(amount)


def accept(serialized: bytes) -> bytes:
    """Counts a written record and returns it as the `DoFn`'s main output."""
    Metrics.counter(METRICS_NAMESPACE, "ok").inc()
    PROGRESS_LOGGER.info("fullres-progress ok")
    return serialized


class _ProgressFilter(logging.Filter):
    """Turns the workers' per-record log lines into a progress line every few seconds."""

    def __init__(self, total: int, log: Callable[[str], None], every_seconds: float):
        super().__init__()
        self.total, self.log, self.every_seconds = total, log, every_seconds
        self.ok = self.failed = 0
        self.last = time.monotonic()

    def filter(self, record: logging.LogRecord) -> bool:
        match = _PROGRESS_LINE.search(record.getMessage())
        if match is None:
            # The loggers are lowered to INFO for the progress lines only: the workers' other INFO chatter
            # (bundle processing, harness start-up) stays hidden, their warnings and errors do not.
            return record.levelno >= logging.WARNING
        if match.group(1) == "ok":
            self.ok += 1
        else:
            self.failed += 1
        now = time.monotonic()
        if now - self.last >= self.every_seconds:
            self.last = now
            self.log(f"  {self.ok} records written, {self.failed} dead letters so far ({self.total} inputs)")
        return False  # the raw worker line is not for people


@contextlib.contextmanager
def _progress(total: int, log: Callable[[str], None], every_seconds: float = 5.0):
    progress = _ProgressFilter(total, log, every_seconds)
    loggers = [logging.getLogger(name) for name in _PROGRESS_SOURCES]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addFilter(progress)
        logger.setLevel(logging.INFO)
    try:
        yield progress
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeFilter(progress)
            logger.setLevel(level)


@contextlib.contextmanager
def _quiet_local_workers(pipeline_args: Sequence[str] | None):
    """Holds back what local Beam workers print to stderr while the pipeline runs, unless the run fails to write.

    A worker prints its traceback straight to the stderr it inherited; when the
    run then fails for want of disk space or permission, the command says so in
    one sentence and the traceback is dropped. On success, or on any other
    failure, everything held back is shown. `fullres --verbose`
    (FULLRES_VERBOSE=1) and remote runners (Dataflow) are left alone.
    """
    runner = next((a.split("=", 1)[1] for a in (pipeline_args or []) if a.startswith("--runner=")), LOCAL_RUNNER)
    if os.environ.get("FULLRES_VERBOSE") == "1" or runner not in (LOCAL_RUNNER, "DirectRunner"):
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
            show = output_guard.write_failure(error, "") is None
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if show:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
                sys.stderr.flush()


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


def build(pipeline: beam.Pipeline, items: Sequence, early_dead_letters: Sequence[dict], convert: beam.DoFn,
          staging: str, num_shards: int, compress: bool) -> None:
    """Adds Create → Reshuffle → convert → (TFRecords, dead letters) to `pipeline`, writing into `staging`."""
    outputs = (
        pipeline
        | "Items" >> beam.Create(list(items))
        | "Spread" >> beam.Reshuffle()
        | "Convert" >> beam.ParDo(convert).with_outputs(DEAD_LETTER, main="records")
    )
    suffix = ".tfrecord.gz" if compress else ".tfrecord"
    _ = outputs.records | "WriteRecords" >> beam.io.WriteToTFRecord(
        FileSystems.join(staging, "data"), file_name_suffix=suffix, num_shards=num_shards
    )
    _ = (
        (outputs[DEAD_LETTER], pipeline | "EarlyDeadLetters" >> beam.Create(list(early_dead_letters)))
        | "AllDeadLetters" >> beam.Flatten()
        | "ToJson" >> beam.Map(lambda letter: json.dumps(letter, sort_keys=True))
        | "WriteDeadLetters" >> beam.io.WriteToText(
            FileSystems.join(staging, "dead_letter"), file_name_suffix=".jsonl", shard_name_template="", num_shards=1
        )
    )


def _is_local(path: str) -> bool:
    return "://" not in path


def _list(directory: str, pattern: str = "*") -> list:
    """File metadata under `directory` (any Beam filesystem); empty if there is none."""
    try:
        return FileSystems.match([FileSystems.join(directory, pattern)])[0].metadata_list
    except Exception:  # Beam raises BeamIOError for a pattern that matches nothing on some filesystems
        return []


def _write_json(path: str, content) -> None:
    with FileSystems.create(path) as file:
        file.write(json.dumps(content, indent=2).encode())


def publish(staging: str, output: str, last: str = "summary.json") -> None:
    """Swaps `staging` in as `output`, deleting only the files a previous conversion wrote there.

    Local: two directory renames, then the old output's own files are deleted.
    Object store: a manifest covering old and new files first (so an interrupted
    swap is still recognised as fullres's), delete the old files, move the new
    ones in with `last` (the completion marker) after everything else, then the
    manifest of the new files.

    Raises:
        output_guard.OutputRefused: `output` holds files fullres did not write
            (they may have appeared while the pipeline ran); nothing is deleted.
    """
    old_files = output_guard.conversion_files(output)
    new_files = [name for name in _names(staging) if name != output_guard.MARKER]
    output_guard.write_marker(staging, "tfrecords", new_files)
    if _is_local(output):
        if os.path.exists(output):
            old = f"{output}.old-{uuid.uuid4().hex[:8]}"
            os.rename(output, old)
            os.rename(staging, output)
            for name in old_files:
                os.remove(os.path.join(old, name))
            os.rmdir(old)  # empty now; rmdir, unlike rmtree, could never take a file fullres did not write
        else:
            os.rename(staging, output)
        return
    output_guard.write_marker(output, "tfrecords", sorted(set(old_files) | set(new_files)))
    stale = [FileSystems.join(output, name) for name in old_files if name != output_guard.MARKER]
    if stale:
        FileSystems.delete(stale)
    for name in sorted(new_files, key=lambda name: name == last):
        FileSystems.rename([FileSystems.join(staging, name)], [FileSystems.join(output, name)])
    output_guard.write_marker(output, "tfrecords", new_files)
    FileSystems.delete([FileSystems.join(staging, output_guard.MARKER)])


def _names(directory: str) -> list[str]:
    """The names of the files in `directory` (local or object store)."""
    if _is_local(directory):
        return sorted(os.listdir(directory))
    return sorted(m.path.rsplit("/", 1)[-1] for m in _list(directory))


def _convert(items, early_dead_letters, convert, staging, output, pipeline_args, num_shards, compress, extra_files,
             notes, summary_fields, log) -> tuple[dict, list]:
    """Runs the Beam pipeline into `staging` and writes the summary (and `extra_files`, `notes.json`) there."""
    options = PipelineOptions(list(pipeline_args) if pipeline_args is not None else default_pipeline_args())
    pipeline = beam.Pipeline(options=options)
    build(pipeline, items, early_dead_letters, convert, staging, num_shards, compress)
    with _progress(len(items), log):
        result = _run_watched(pipeline, output)
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    with FileSystems.open(FileSystems.join(staging, "dead_letter.jsonl")) as file:
        letters = [json.loads(line) for line in file.read().decode().splitlines() if line.strip()]
    shards = sorted(_list(staging, "data-*"), key=lambda m: m.path)
    summary = {
        "ok": int(counters.get("ok", 0)),
        "failed": len(letters),
        "reasons": dict(sorted(collections.Counter(letter["reason"] for letter in letters).items())),
        "shards": [m.path.rsplit("/", 1)[-1] for m in shards],
        "bytes": sum(m.size_in_bytes for m in shards),
        **_summary_fields(counters),
        **(summary_fields(counters) if summary_fields else {}),
    }
    if notes:
        summary["notes"] = dict(sorted(collections.Counter(note["reason"] for note in notes).items()))
        extra_files = {**(extra_files or {}), "notes.json": list(notes)}
    for name, content in {**(extra_files or {}), "summary.json": summary}.items():
        _write_json(FileSystems.join(staging, name), content)
    return summary, shards


def _summary_fields(counters: dict) -> dict:
    """`summary/FIELD/KEY` counters (see `count`) as {FIELD: {KEY: total}}, keys in numeric order where numeric."""
    fields: dict[str, dict] = collections.defaultdict(dict)
    for name, total in counters.items():
        if name.startswith(SUMMARY_COUNTER) and total:
            field, key = name[len(SUMMARY_COUNTER):].split("/", 1)
            fields[field][key] = int(total)
    order = lambda key: (0, int(key), "") if key.lstrip("-").isdigit() else (1, 0, key)  # noqa: E731
    return {field: dict(sorted(values.items(), key=lambda item: order(item[0]))) for field, values in fields.items()}


_WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"


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


class _DebugOnly(logging.Filter):
    """Turns a logger's records that start with `prefix` into debug records of this module."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.prefix):
            return True
        logging.getLogger(__name__).debug(record.getMessage(), exc_info=record.exc_info)
        return False


def _stop_workers(pipeline_thread: threading.Thread, wait_seconds: float = 10.0) -> None:
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


def _run_watched(pipeline: beam.Pipeline, output: str, poll_seconds: float = 0.5):
    """Runs `pipeline` to the end and returns its result; a worker that dies fails the run instead of hanging it.

    Beam's local runner notices a dead worker process (the out-of-memory killer's
    kill -9) only in the thread that started it, which raises and ends, while the
    runner waits for that worker's results for good. So the pipeline runs in a
    thread of its own, any thread's uncaught exception during the run counts as a
    dead worker, and the run stops with one sentence; the remaining local workers
    are stopped and the previous output is left as it was.
    """
    outcome: dict = {}
    finished = threading.Event()
    crashes: list[str] = []
    previous_hook = threading.excepthook

    def on_thread_exception(args) -> None:
        crashes.append(f"{args.exc_type.__name__}: {args.exc_value}")
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        logging.getLogger(__name__).debug("thread %s failed", args.thread.name, exc_info=exc_info)
        finished.set()

    def execute() -> None:
        try:
            result = pipeline.run()
            result.wait_until_finish()
            outcome["result"] = result
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error
        finally:
            finished.set()

    # The runner logs the dead worker's broken connection with a traceback before anything else notices; the
    # sentence below says it for people, the traceback goes to debug logging.
    data_plane = logging.getLogger("apache_beam.runners.worker.data_plane")
    broken_connection = _DebugOnly("Failed to read inputs")
    data_plane.addFilter(broken_connection)
    threading.excepthook = on_thread_exception
    try:
        # A daemon thread: the threads Beam starts from it are daemons too, so a stuck runner cannot hold the exit.
        pipeline_thread = threading.Thread(target=execute, name="fullres-pipeline", daemon=True)
        pipeline_thread.start()
        while not finished.wait(poll_seconds):
            pass
        if crashes and "result" not in outcome:
            _stop_workers(pipeline_thread)  # their threads' exceptions still land in this hook, not on the screen
    finally:
        threading.excepthook = previous_hook
        data_plane.removeFilter(broken_connection)
    if crashes and "result" not in outcome:
        # The thread that waited on the dead worker says how it ended; other threads only see a broken connection.
        crash = next((c for c in crashes if "exited with return code" in c), crashes[0])
        killed = ": killed, as the out-of-memory killer does" if re.search(r"code (-9|137)$", crash) else ""
        raise PreprocessingFailed(
            f"a Beam worker died ({crash}{killed}), so the run stopped and {output} was left as it was; give "
            f"each worker more memory (fewer --workers, or a lower --max-voxels) and rerun."
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def run(
    items: Sequence,
    early_dead_letters: Sequence[dict],
    convert: beam.DoFn,
    output: str,
    *,
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    extra_files: dict[str, object] | None = None,
    notes: Sequence[dict] = (),
    summary_fields: Callable[[dict], dict] | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Runs `convert` over `items` with Beam and publishes the output directory.

    Args:
        items: the work items, one `convert` call each.
        early_dead_letters: inputs rejected before the pipeline (discovery, pairing).
        convert: a `DoFn` yielding `accept(record)` / `reject(letter)`.
        output: the output directory: new, empty, or a previous conversion's (replaced whole).
        pipeline_args: Beam options; DirectRunner on every core by default.
        num_shards: TFRecord shards; 0 lets the runner decide.
        compress: write `.tfrecord.gz`.
        max_failed_fraction: dead letters / (records + dead letters) above which
            `PreprocessingFailed` is raised (after the output is in place).
        extra_files: more JSON files to write into the output, by name.
        notes: dead-letter-shaped records of inputs set aside or repaired
            without failing (a duplicate file dropped, slices resampled):
            written to `notes.json` and counted by reason in the summary.
        summary_fields: more summary entries, computed from the run's counters (by name).

    Returns:
        The summary written to `summary.json`.

    Raises:
        output_guard.OutputRefused: `output` holds files fullres did not write, or
            another run is writing it; nothing was written.
        output_guard.OutputWriteFailed: the disk filled up or refused a write;
            the previous output is untouched.
    """
    if _is_local(output):
        output = os.path.abspath(output)
    staging = f"{output}.staging-{uuid.uuid4().hex[:8]}"
    try:
        with output_guard.lock(output):
            output_guard.conversion_files(output)  # again, under the lock: another run may have written it meanwhile
            try:
                if _is_local(staging):
                    os.makedirs(staging)
                with _quiet_local_workers(pipeline_args):
                    summary, shards = _convert(items, early_dead_letters, convert, staging, output, pipeline_args,
                                               num_shards, compress, extra_files, notes, summary_fields, log)
                publish(staging, output)
            except BaseException:
                if _is_local(staging):
                    shutil.rmtree(staging, ignore_errors=True)
                raise
    except Exception as error:
        sentence = output_guard.write_failure(error, output)
        if sentence is not None:
            raise output_guard.OutputWriteFailed(sentence) from error
        raise
    log(f"wrote {summary['ok']} records in {len(shards)} shards ({summary['bytes'] / 2**20:.1f} MiB), "
        f"{summary['failed']} dead letters {summary['reasons'] or ''}".rstrip())
    total = summary["ok"] + summary["failed"]
    if total and summary["failed"] / total > max_failed_fraction:
        raise PreprocessingFailed(
            f"{summary['failed']} of {total} inputs failed ({summary['failed'] / total:.0%}), more than "
            f"--max-failed-fraction {max_failed_fraction:g}; see {FileSystems.join(output, 'dead_letter.jsonl')}."
        )
    return summary
