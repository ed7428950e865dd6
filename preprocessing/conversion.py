"""What every conversion to TFRecords shares: the Beam run, dead letters, summary and atomic output.

A conversion is a list of work items and a `DoFn` that turns one item into
serialized records (main output) and dead letters (`DEAD_LETTER` tag). This
module runs it and lays out the output directory:

    data-SSSSS-of-NNNNN.tfrecord[.gz]   the records
    dead_letter.jsonl                   {"source", "stage", "reason", "detail"} per rejected input
    summary.json                        {"ok", "failed", "reasons", "shards", "bytes", ...}

Everything is written to a staging directory beside the output and swapped in
by renames only when the pipeline has finished, so a rerun or a crash never
leaves old and new shards mixed.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

METRICS_NAMESPACE = "fullres"
DEAD_LETTER = "dead_letter"


class PreprocessingFailed(RuntimeError):
    """Too many inputs failed; the good ones were still written."""


def dead_letter(source: str, stage: str, reason: str, detail: str) -> dict:
    """One dead-letter record, as written to `dead_letter.jsonl`."""
    return {"source": source, "stage": stage, "reason": reason, "detail": detail}


def reject(letter: dict):
    """Counts a dead letter and returns it as the `DoFn`'s tagged output."""
    Metrics.counter(METRICS_NAMESPACE, f"failed_{letter['reason']}").inc()
    return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def accept(serialized: bytes) -> bytes:
    """Counts a written record and returns it as the `DoFn`'s main output."""
    Metrics.counter(METRICS_NAMESPACE, "ok").inc()
    return serialized


def default_pipeline_args() -> list[str]:
    """DirectRunner with one worker process per core."""
    return [
        "--runner=DirectRunner",
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
        os.path.join(staging, "data"), file_name_suffix=suffix, num_shards=num_shards
    )
    _ = (
        (outputs[DEAD_LETTER], pipeline | "EarlyDeadLetters" >> beam.Create(list(early_dead_letters)))
        | "AllDeadLetters" >> beam.Flatten()
        | "ToJson" >> beam.Map(lambda letter: json.dumps(letter, sort_keys=True))
        | "WriteDeadLetters" >> beam.io.WriteToText(
            os.path.join(staging, "dead_letter"), file_name_suffix=".jsonl", shard_name_template="", num_shards=1
        )
    )


def publish(staging: str, output: str) -> None:
    """Swaps `staging` in as `output` with renames; the old output is removed afterwards."""
    if os.path.exists(output):
        old = f"{output}.old-{uuid.uuid4().hex[:8]}"
        os.rename(output, old)
        os.rename(staging, output)
        shutil.rmtree(old)
    else:
        os.rename(staging, output)


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
    log: Callable[[str], None] = print,
) -> dict:
    """Runs `convert` over `items` with Beam and publishes the output directory.

    Args:
        items: the work items, one `convert` call each.
        early_dead_letters: inputs rejected before the pipeline (discovery, pairing).
        convert: a `DoFn` yielding `accept(record)` / `reject(letter)`.
        output: the output directory (replaced whole).
        pipeline_args: Beam options; DirectRunner on every core by default.
        num_shards: TFRecord shards; 0 lets the runner decide.
        compress: write `.tfrecord.gz`.
        max_failed_fraction: dead letters / (records + dead letters) above which
            `PreprocessingFailed` is raised (after the output is in place).
        extra_files: more JSON files to write into the output, by name.

    Returns:
        The summary written to `summary.json`.
    """
    output = os.path.abspath(output)
    staging = f"{output}.staging-{uuid.uuid4().hex[:8]}"
    os.makedirs(staging)
    try:
        options = PipelineOptions(list(pipeline_args) if pipeline_args is not None else default_pipeline_args())
        pipeline = beam.Pipeline(options=options)
        build(pipeline, items, early_dead_letters, convert, staging, num_shards, compress)
        result = pipeline.run()
        result.wait_until_finish()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    with open(os.path.join(staging, "dead_letter.jsonl")) as file:
        letters = [json.loads(line) for line in file if line.strip()]
    shards = sorted(name for name in os.listdir(staging) if name.startswith("data-"))
    summary = {
        "ok": int(counters.get("ok", 0)),
        "failed": len(letters),
        "reasons": dict(sorted(collections.Counter(letter["reason"] for letter in letters).items())),
        "shards": shards,
        "bytes": sum(os.path.getsize(os.path.join(staging, name)) for name in shards),
    }
    for name, content in {"summary.json": summary, **(extra_files or {})}.items():
        with open(os.path.join(staging, name), "w") as file:
            json.dump(content, file, indent=2)
    publish(staging, output)
    log(f"wrote {summary['ok']} records in {len(shards)} shards ({summary['bytes'] / 2**20:.1f} MiB), "
        f"{summary['failed']} dead letters {summary['reasons'] or ''}".rstrip())
    total = summary["ok"] + summary["failed"]
    if total and summary["failed"] / total > max_failed_fraction:
        raise PreprocessingFailed(
            f"{summary['failed']} of {total} inputs failed ({summary['failed'] / total:.0%}), more than "
            f"--max-failed-fraction {max_failed_fraction:g}; see {os.path.join(output, 'dead_letter.jsonl')}."
        )
    return summary
