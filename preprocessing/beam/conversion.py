"""What every conversion to TFRecords shares: the Beam run, watched for dead workers, and its output directory.

A conversion is a list of work items and a `DoFn` that turns one item into
serialized records (main output) and dead letters (`counting.DEAD_LETTER` tag).
This module runs it and lays out the output directory:

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

Beside this module: `counting` (records, dead letters and summary counts, the
progress lines), `publishing` (the swap) and `local_workers` (the local runner
and its worker processes).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from common import file_writes, output_guard, output_lock
from preprocessing.beam import counting, local_workers, publishing


STAGING_KIND = "staging"  # the marker's kind in a staging directory (`OUTPUT.staging-1a2b3c4d`) being written


def remove_stale_staging(output: str, log: Callable[[str], None] = print) -> list[str]:
    """Removes the staging directories an interrupted run into `output` left beside it; returns their paths.

    Called under the output's lock, so no live run is writing one. Only what fullres's own marker proves its
    own is removed (a staging directory marked as such, or an empty one of that name); anything else is left.
    """
    parent, base = os.path.split(output.rstrip(os.sep))
    pattern = re.compile(re.escape(base) + r"\.staging-[0-9a-f]{8}")
    removed = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        path = os.path.join(parent, name)
        if not pattern.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        if not os.listdir(path):
            os.rmdir(path)  # empty: rmdir could never take a file
        elif (output_guard.read_marker(path) or {}).get("kind") == STAGING_KIND:
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
        log(f"removed {path}, left by an interrupted run")
    return removed


class PreprocessingFailed(RuntimeError):
    """Too many inputs failed; the good ones were still written."""


def build(pipeline: beam.Pipeline, items: Sequence, early_dead_letters: Sequence[dict], convert: beam.DoFn,
          staging: str, num_shards: int, compress: bool) -> None:
    """Adds Create → Reshuffle → convert → (TFRecords, dead letters) to `pipeline`, writing into `staging`."""
    outputs = (
        pipeline
        | "Items" >> beam.Create(list(items))
        | "Spread" >> beam.Reshuffle()
        | "Convert" >> beam.ParDo(convert).with_outputs(counting.DEAD_LETTER, main="records")
    )
    suffix = ".tfrecord.gz" if compress else ".tfrecord"
    _ = outputs.records | "WriteRecords" >> beam.io.WriteToTFRecord(
        FileSystems.join(staging, "data"), file_name_suffix=suffix, num_shards=num_shards
    )
    _ = (
        (outputs[counting.DEAD_LETTER], pipeline | "EarlyDeadLetters" >> beam.Create(list(early_dead_letters)))
        | "AllDeadLetters" >> beam.Flatten()
        | "ToJson" >> beam.Map(lambda letter: json.dumps(letter, sort_keys=True))
        | "WriteDeadLetters" >> beam.io.WriteToText(
            FileSystems.join(staging, "dead_letter"), file_name_suffix=".jsonl", shard_name_template="", num_shards=1
        )
    )


def _convert(items, early_dead_letters, convert, staging, output, pipeline_args, num_shards, compress, extra_files,
             notes, summary_fields, log) -> tuple[dict, list]:
    """Runs the Beam pipeline into `staging` and writes the summary (and `extra_files`, `notes.json`) there."""
    given = list(pipeline_args) if pipeline_args is not None else local_workers.default_pipeline_args()
    with local_workers.without_worker_notices():
        pipeline = beam.Pipeline(options=PipelineOptions(given))
        build(pipeline, items, early_dead_letters, convert, staging, num_shards, compress)
        with counting.progress(len(items), log):
            result = _run_watched(pipeline, output)
    metrics = result.metrics().query(MetricsFilter().with_namespace(counting.METRICS_NAMESPACE))
    counters = {c.key.metric.name: c.committed for c in metrics["counters"]}
    counters.update({counting.RANGE + d.key.metric.name: (d.committed.min, d.committed.max)
                     for d in metrics["distributions"] if d.committed is not None and d.committed.count})
    with FileSystems.open(FileSystems.join(staging, "dead_letter.jsonl")) as file:
        letters = [json.loads(line) for line in file.read().decode().splitlines() if line.strip()]
    shards = sorted(publishing.list_files(staging, "data-*"), key=lambda m: m.path)
    summary = {
        "ok": int(counters.get("ok", 0)),
        "failed": len(letters),
        "reasons": dict(sorted(collections.Counter(letter["reason"] for letter in letters).items())),
        "shards": [m.path.rsplit("/", 1)[-1] for m in shards],
        "bytes": sum(m.size_in_bytes for m in shards),
        **counting.summary_fields(counters),
        **(summary_fields(counters) if summary_fields else {}),
    }
    if notes:
        summary["notes"] = dict(sorted(collections.Counter(note["reason"] for note in notes).items()))
        extra_files = {**(extra_files or {}), "notes.json": list(notes)}
    for name, content in {**(extra_files or {}), "summary.json": summary}.items():
        publishing.write_json(FileSystems.join(staging, name), content)
    return summary, shards


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
            local_workers.stop_workers(pipeline_thread)  # their threads' exceptions still land in this hook, not on the screen
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
        file_writes.OutputWriteFailed: the disk filled up or refused a write;
            the previous output is untouched.
    """
    if publishing.is_local(output):
        output = os.path.abspath(output)
    staging = f"{output}.staging-{uuid.uuid4().hex[:8]}"
    try:
        with output_lock.lock(output):
            output_guard.conversion_files(output)  # again, under the lock: another run may have written it meanwhile
            try:
                if publishing.is_local(staging):
                    remove_stale_staging(output, log)
                    os.makedirs(staging)
                    output_guard.write_marker(staging, STAGING_KIND)  # what proves it fullres's to a later run
                with local_workers.quiet_local_workers(pipeline_args):
                    summary, shards = _convert(items, early_dead_letters, convert, staging, output, pipeline_args,
                                               num_shards, compress, extra_files, notes, summary_fields, log)
                publishing.publish(staging, output)
            except BaseException:
                if publishing.is_local(staging):
                    shutil.rmtree(staging, ignore_errors=True)
                raise
    except Exception as error:
        sentence = file_writes.write_failure(error, output)
        if sentence is not None:
            raise file_writes.OutputWriteFailed(sentence) from error
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
