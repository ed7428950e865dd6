"""The Beam pipeline: CT cases to sharded TFRecords, a dead-letter file and a summary.

Output directory:
    data-SSSSS-of-NNNNN.tfrecord[.gz]   the records (schema: `tfrecord_schema`)
    dead_letter.jsonl                   one line per case that could not be used:
                                        {"source", "stage", "reason", "detail"}
    summary.json                        {"ok", "failed", "reasons", "shards", "bytes"}

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

from preprocessing import ct_io, ct_transforms, tfrecord_schema

METRICS_NAMESPACE = "fullres"
DEAD_LETTER = "dead_letter"


class PreprocessingFailed(RuntimeError):
    """Too many cases failed; the good ones were still written."""


class PreprocessCaseFn(beam.DoFn):
    """One `CaseSource` in, a serialized record (main output) or a dead letter (tagged) out."""

    def __init__(self, config: ct_transforms.CtPreprocessConfig):
        self.config = config
        self.ok = Metrics.counter(METRICS_NAMESPACE, "ok")

    def process(self, case: ct_io.CaseSource):
        try:
            record = ct_transforms.preprocess_case(case, self.config)
        except ct_io.CaseError as error:
            Metrics.counter(METRICS_NAMESPACE, f"failed_{error.reason}").inc()
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER, ct_io.dead_letter(case.image.path, error.stage, error.reason, error.detail)
            )
            return
        except Exception as error:  # one case's surprise must not cost the other cases
            Metrics.counter(METRICS_NAMESPACE, "failed_unexpected_error").inc()
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER, ct_io.dead_letter(case.image.path, "preprocess", "unexpected_error", repr(error))
            )
            return
        self.ok.inc()
        yield tfrecord_schema.encode_ct_example(record)


def default_pipeline_args() -> list[str]:
    """DirectRunner with one worker process per core."""
    return [
        "--runner=DirectRunner",
        f"--direct_num_workers={os.cpu_count() or 1}",
        "--direct_running_mode=multi_processing",
    ]


def build(pipeline: beam.Pipeline, cases: Sequence[ct_io.CaseSource], early_dead_letters: Sequence[dict],
          config: ct_transforms.CtPreprocessConfig, staging: str, num_shards: int, compress: bool) -> None:
    """Adds the preprocessing transforms to `pipeline`, writing into `staging`."""
    outputs = (
        pipeline
        | "Cases" >> beam.Create(list(cases))
        | "Spread" >> beam.Reshuffle()
        | "Preprocess" >> beam.ParDo(PreprocessCaseFn(config)).with_outputs(DEAD_LETTER, main="records")
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


def _publish(staging: str, output: str) -> None:
    """Swaps `staging` in as `output` with renames; the old output is removed afterwards."""
    if os.path.exists(output):
        old = f"{output}.old-{uuid.uuid4().hex[:8]}"
        os.rename(output, old)
        os.rename(staging, output)
        shutil.rmtree(old)
    else:
        os.rename(staging, output)


def run(
    input_path: str,
    output: str,
    labels: str | None = None,
    config: ct_transforms.CtPreprocessConfig = ct_transforms.CtPreprocessConfig(),
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> dict:
    """Preprocesses every case under `input_path` into `output`; returns the summary.

    Args:
        num_shards: number of TFRecord shards; 0 lets the runner decide.
        pipeline_args: Beam options, e.g. `["--runner=DataflowRunner", "--project=p", ...]`;
            DirectRunner on every core by default.

    Raises:
        FileNotFoundError: `input_path` does not exist.
        ValueError: nothing under `input_path` looks like a CT volume.
        PreprocessingFailed: more than `max_failed_fraction` of the cases failed
            (raised after the output, good records included, is in place).
    """
    output = os.path.abspath(output)
    images, dead = ct_io.discover(input_path)
    cases, pairing_dead = ct_io.pair_with_labels(images, labels)
    dead.extend(pairing_dead)
    if not cases and not dead:
        raise ValueError(f"no CT volumes (DICOM, {', '.join(ct_io.VOLUME_SUFFIXES)}) found under {input_path}.")
    log(f"fullres preprocess ct: {len(cases)} cases to convert, {len(dead)} rejected before reading; writing {output}")

    staging = f"{output}.staging-{uuid.uuid4().hex[:8]}"
    os.makedirs(staging)
    options = PipelineOptions(list(pipeline_args) if pipeline_args is not None else default_pipeline_args())
    pipeline = beam.Pipeline(options=options)
    build(pipeline, cases, dead, config, staging, num_shards, compress)
    result = pipeline.run()
    result.wait_until_finish()
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
    with open(os.path.join(staging, "summary.json"), "w") as file:
        json.dump(summary, file, indent=2)
    _publish(staging, output)
    log(f"wrote {summary['ok']} records in {len(shards)} shards ({summary['bytes'] / 2**20:.1f} MiB), "
        f"{summary['failed']} dead letters {summary['reasons'] or ''}")

    total = summary["ok"] + summary["failed"]
    if total and summary["failed"] / total > max_failed_fraction:
        raise PreprocessingFailed(
            f"{summary['failed']} of {total} cases failed ({summary['failed'] / total:.0%}), more than "
            f"--max-failed-fraction {max_failed_fraction:g}; see {os.path.join(output, 'dead_letter.jsonl')}."
        )
    return summary
