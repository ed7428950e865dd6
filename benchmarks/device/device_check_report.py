"""The table and the checks of `device_check.py`'s JSON: one line per row, and what a row must hold.

`check` is what the suite runs on the CPU run's JSON and what the command runs on its own before it exits: every
field there, every figure in its unit (whole bytes, seconds), every ratio computed from the row's own figures.
"""

from __future__ import annotations

import math

STATUSES = ("ok", "out_of_memory", "timed_out", "failed", "not_run")


def with_ratios(row: dict) -> dict:
    """The row with measured ÷ planned memory and step time, where both figures are there."""
    measured, planned = row.get("measured") or {}, row.get("planned") or {}
    seconds = measured.get("median_step_seconds", measured.get("median_seconds"))
    ratios = {}
    if measured.get("peak_bytes") and planned.get("total_bytes"):
        ratios["memory"] = measured["peak_bytes"] / planned["total_bytes"]
    if seconds and planned.get("step_seconds"):
        ratios["step_time"] = seconds / planned["step_seconds"]
    return {**row, "ratios": ratios}


def _gib(value) -> str:
    return "" if value is None else f"{value / 2**30:.2f}"


def _ms(value) -> str:
    return "" if value is None else f"{value * 1e3:.4g}"


def _ratio(value) -> str:
    return "" if value is None else f"{value:.3g}"


HEADER = (f"{'part':<8}{'model':<9}{'size':>5} {'prec':<9}{'aug':<7}{'status':<14}{'step ms':>9}{'ex/s':>8}"
          f"{'peak GiB':>9}{'plan GiB':>9}{'mem ÷':>9}{'roof ms':>9}{'time ÷':>9}  note")


def table_line(row: dict) -> str:
    """One row of the printed table (memory in GiB, times in ms, ratios measured ÷ planned)."""
    measured, planned, ratios = row.get("measured") or {}, row.get("planned") or {}, row.get("ratios") or {}
    seconds = measured.get("median_step_seconds", measured.get("median_seconds"))
    if row["part"] == "input":
        seconds = measured.get("median_wait_seconds")
    note = row.get("error") or ""
    if row["part"] == "input" and "input_wait_fraction" in measured:
        note = f"input wait {measured['input_wait_fraction']:.1%} of {measured['measured_seconds']:.1f} s (ms column: median wait)"
    elif measured.get("steps_cut_by_time_limit"):
        note = note or f"{measured['steps']} steps: its time limit cut the rest"
    elif planned.get("source", "").startswith("the device's"):
        note = note or "planned = device compiler"
    examples = measured.get("examples_per_second")
    return (f"{row['part']:<8}{row['model']:<9}{row.get('size') or '':>5} {row['precision']:<9}{row['augmentation']:<7}"
            f"{row['status']:<14}{_ms(seconds):>9}{'' if examples is None else f'{examples:.2f}':>8}"
            f"{_gib(measured.get('peak_bytes')):>9}{_gib(planned.get('total_bytes')):>9}{_ratio(ratios.get('memory')):>9}"
            f"{_ms(planned.get('step_seconds')):>9}{_ratio(ratios.get('step_time')):>9}  {note[:90]}")


REQUIRED = {"part", "model", "size", "precision", "augmentation", "status", "planned", "ratios"}


def check(result: dict) -> list[str]:
    """Problems with a device_check JSON: missing fields, figures not in their units, ratios not from the figures."""
    problems = [f"missing {key}" for key in ("date", "device", "software", "rows", "units", "limits_seconds")
                if key not in result]
    for number, row in enumerate(result.get("rows", [])):
        where = f"row {number} ({row.get('part')} {row.get('model')} {row.get('size')})"
        problems += [f"{where}: missing {key}" for key in sorted(REQUIRED - set(row))]
        if row.get("status") not in STATUSES:
            problems.append(f"{where}: status {row.get('status')!r} is not one of {STATUSES}")
        measured = row.get("measured") or {}
        for key, value in [*measured.items(), *(row.get("planned") or {}).items()]:
            if key.endswith("_bytes") and value is not None and not (isinstance(value, int) and value >= 0):
                problems.append(f"{where}: {key} {value!r} is not a whole number of bytes")
            if key.endswith("_seconds") and value is not None and not (isinstance(value, (int, float)) and value >= 0):
                problems.append(f"{where}: {key} {value!r} is not a number of seconds")
        if row.get("status") == "ok" and row.get("part") == "train":
            problems += [f"{where}: measured has no {key}" for key in ("median_step_seconds", "peak_bytes",
                         "examples_per_second", "peak_bytes_source") if measured.get(key) is None]
            wanted = result.get("settings", {}).get("steps", 1)
            if measured.get("steps", 0) < min(wanted, 3) or (measured.get("steps", 0) < wanted
                                                              and not measured.get("steps_cut_by_time_limit")):
                problems.append(f"{where}: {measured.get('steps')} steps measured of {wanted}")
        expected = with_ratios(row)["ratios"] if row.get("status") == "ok" else {}
        for key, value in expected.items():
            got = (row.get("ratios") or {}).get(key)
            if got is None or not math.isclose(got, value, rel_tol=1e-9):
                problems.append(f"{where}: ratio {key} {got!r} is not measured ÷ planned ({value!r})")
    return problems
