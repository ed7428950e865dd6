"""Counting what a conversion does: each record written, each dead letter, each summary count.

A conversion's `DoFn` yields `accept(record)` and `reject(letter)`, and calls
`count(field, key)` for summary fields of its own. Each adds to a Beam counter,
read back after the run into `summary.json` (`summary_fields`); `accept` and
`reject` also log a line the workers send home, which `progress` turns into a
progress line every few seconds while the run goes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import time
from collections.abc import Callable

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

METRICS_NAMESPACE = "fullres"
DEAD_LETTER = "dead_letter"
SUMMARY_COUNTER = "summary/"
RANGE = "range/"  # distributions (see `extreme`) reach `summary_fields` as range/NAME: (min, max)  # counters named summary/FIELD/KEY become summary.json's FIELD: {KEY: total}
PROGRESS_LOGGER = logging.getLogger("fullres.progress")
# Where the local runners deliver worker log lines: directly (in-memory runner), or
# forwarded from worker processes by the job service (multi-processing DirectRunner).
_PROGRESS_SOURCES = ("fullres.progress", "apache_beam.runners.portability.local_job_service")
_PROGRESS_LINE = re.compile(r"fullres-progress (ok|failed)")


def reject(letter: dict):
    """Counts a dead letter and returns it as the `DoFn`'s tagged output."""
    Metrics.counter(METRICS_NAMESPACE, f"failed_{letter['reason']}").inc()
    PROGRESS_LOGGER.info("fullres-progress failed %s", letter["source"])
    return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def count(field: str, key, amount: int = 1) -> None:
    """Adds `amount` to `summary.json`'s `field`[`key`] (a conversion's own summary fields, e.g. label values)."""
    Metrics.counter(METRICS_NAMESPACE, f"{SUMMARY_COUNTER}{field}/{key}").inc(amount)


def extreme(name: str, value: float) -> None:
    """Records `value` (rounded to a whole number) in the distribution `name`; its least and greatest value over the
    run reach the summary fields as `counters[RANGE + name]` = (min, max) (see `conversion`)."""
    Metrics.distribution(METRICS_NAMESPACE, name).update(int(round(value)))


def accept(serialized: bytes) -> bytes:
    """Counts a written record and returns it as the `DoFn`'s main output."""
    Metrics.counter(METRICS_NAMESPACE, "ok").inc()
    PROGRESS_LOGGER.info("fullres-progress ok")
    return serialized


def summary_fields(counters: dict) -> dict:
    """`summary/FIELD/KEY` counters (see `count`) as {FIELD: {KEY: total}}, keys in numeric order where numeric."""
    fields: dict[str, dict] = collections.defaultdict(dict)
    for name, total in counters.items():
        if name.startswith(SUMMARY_COUNTER) and total:
            field, key = name[len(SUMMARY_COUNTER):].split("/", 1)
            fields[field][key] = int(total)
    order = lambda key: (0, int(key), "") if key.lstrip("-").isdigit() else (1, 0, key)  # noqa: E731
    return {field: dict(sorted(values.items(), key=lambda item: order(item[0]))) for field, values in fields.items()}


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
def progress(total: int, log: Callable[[str], None], every_seconds: float = 5.0):
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
