"""What to rent, as a grid: `fullres plan`'s figures by each target's own compiler, one row at a time, no device.

Rows, in the order they are computed (`ROWS`): the two goals (1024³ bfloat16 for the default UNet on v5p:4x4x4;
512×512×1024 on h100x8 with the device's terms), then the smallest v5e, v5p and H100 slices for 512×512×1024 and
1024³ (`fullres plan --target GENERATION`), then the largest whole cube (`fullres plan --largest`) for the default
UNet and nnU-Net's PlainConvUNet (the zoo's port) in float32 and bfloat16 on seven targets, then the largest
volume `fullres predict` segments whole on one chip. Each row runs in a child process bounded by `ROW_SECONDS`
(15 minutes: the search's own --max-seconds a minute short of it); a row that does not finish is written as such,
with the largest size its log had found to fit.
Rows are appended to benchmarks/results/rent_grid.json with the compilers' versions, the date and the seconds
taken; a rerun computes only the rows not there (`--redo NAME` computes one again). `--write-docs` renders the
grid into docs/what-to-rent.md and the README's table from the JSON.

    nice -n 10 uv run --group tpu --group cuda python benchmarks/partitioning/rent_grid.py [--only NAME] [--until HH:MM]

These are compiler figures, not device measurements.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "rent_grid.json")
ROW_SECONDS = 900
PLAIN = "tests/trainer/zoo/nnunet_plain.py:build"
_SIZE_LOGGED = re.compile(r"^\[[^\]]+\] (\d+(?:x\d+)+): (fits|does not fit)", re.MULTILINE)


def _rows() -> list[dict]:
    rows = [
        {"name": "goal: 1024³ bfloat16 on v5p:4x4x4", "kind": "plan", "target": "v5p:4x4x4", "size": [1024] * 3,
         "precision": "bfloat16", "dims": [1, 4, 4, 4, 1]},
        {"name": "goal: 512x512x1024 bfloat16 on h100x8", "kind": "plan", "target": "h100x8",
         "size": [1024, 512, 512], "precision": "bfloat16", "dims": [1, 2, 2, 2, 1]},
    ]
    for size in ([1024, 512, 512], [1024] * 3):  # D, H, W: 512×512 slices, 1024 of them
        for generation in ("v5e", "v5p", "h100"):
            rows.append({"name": f"smallest {generation} for {'x'.join(map(str, size[::-1]))} bfloat16", "kind": "smallest",
                         "generation": generation, "size": size, "precision": "bfloat16"})
    for model in ("default", "nnunet_plain"):
        for precision in ("bfloat16", "float32"):
            for target in ("v5e:4x4", "v5e:8x8", "v5p:4x4x4", "h100x1", "h100x8", "h200x1", "h200x8"):
                rows.append({"name": f"largest cube {model} {precision} on {target}", "kind": "largest",
                             "target": target, "model": model, "precision": precision})
    for target in ("h100x1", "h200x1", "v5e:1x1"):
        rows.append({"name": f"predict largest cube on {target}", "kind": "predict", "target": target,
                     "precision": "float32"})
    return rows


ROWS = _rows()


def _model(row: dict) -> dict:
    return {"model": PLAIN if row.get("model") == "nnunet_plain" else None,
            "settings": {"precision": row["precision"]}}


def compute(row: dict, max_seconds: float) -> dict:
    """One row's figures (in this process: the child's)."""
    from trainer import cli_options
    from trainer.plan import smallest_slice, targets

    if row["kind"] == "smallest":
        devices = max(t.device_count for t in smallest_slice.slices(row["generation"]))
    else:
        devices = targets.parse(row["target"]).device_count
    cli_options.set_host_device_count(devices)  # the CPU pre-filter poses as the target's devices
    import jax

    jax.config.update("jax_platforms", "cpu")
    from trainer.plan import memory_plan, rent

    if row["kind"] == "plan":
        plan = memory_plan.run(settings={"precision": row["precision"]}, image_size=row["size"],
                               partitions=(math.prod(row["dims"]),),
                               layouts_to_try=tuple(row["dims"]), target=row["target"])
        found = plan.to_json()
        top = (found["rows"] or [None])[0]
        return {"fits": bool(top and top["fits"]), "row": top, "refused": found["refused"],
                "over_cpu_estimate": found["over_cpu_estimate"], "compiler": found["compiler"],
                "step_time": rent.step_time(plan.results[0].rows[0]) if plan.results[0].rows else None}
    if row["kind"] == "smallest":
        return rent.smallest(kind=row["generation"], image_size=row["size"], max_seconds=max_seconds,
                             log=lambda line: print(line, file=sys.stderr, flush=True), **_model(row))
    if row["kind"] == "largest":
        return rent.largest(target=row["target"], max_seconds=max_seconds,
                            log=lambda line: print(line, file=sys.stderr, flush=True), **_model(row))
    return predict_largest(row, max_seconds)


def predict_largest(row: dict, max_seconds: float) -> dict:
    """The largest cube `fullres predict` segments whole on one device of the target: its pass as the plan sizes it
    (`predict_plan.predict_bytes`), bisected over the sizes the network takes (`edge_search.find_edge`)."""
    from trainer.plan import compiled_step, edge_search, predict_plan, targets

    config = compiled_step.plan_config("unet3d", "default", {"precision": row["precision"]})
    step = 2 ** config.model.downsampling_levels
    sides = list(range(step, 4096 + 1, step))
    on, deadline = targets.parse(row["target"]), time.perf_counter() + max_seconds

    def probe(index: int) -> dict:
        if time.perf_counter() > deadline:
            return {"side": sides[index], "fits": None}
        began = time.perf_counter()
        found = predict_plan.predict_bytes(config, (sides[index],) * 3 + (1,), on)
        print(f"predict {sides[index]}³: {found['total_bytes']} bytes, fits {found['fits']}", file=sys.stderr, flush=True)
        return {"side": sides[index], **found, "seconds": round(time.perf_counter() - began, 1)}

    edge = edge_search.find_edge(len(sides), probe, lambda p: p["fits"], sides.index(512))
    return {"largest": None if edge.last_fit is None else edge.points[edge.last_fit],
            "next_searched": None if edge.first_miss is None else edge.points[edge.first_miss],
            "not_searched": [sides[i] for i in edge.unsearched][:1] + [sides[i] for i in edge.unsearched][-1:],
            "points": list(edge.points.values())}


def reached(log: str | bytes | None) -> dict:
    """How far a row cut at the time bound got, from its search's log (`largest_volume.SizeProbe`'s lines): the
    largest size it found to fit and the smallest it found not to, each None where none was logged."""
    text = log.decode(errors="replace") if isinstance(log, bytes) else log or ""
    logged = [([int(n) for n in size.split("x")], verdict == "fits") for size, verdict in _SIZE_LOGGED.findall(text)]
    fitted = [size for size, fits in logged if fits]
    missed = [size for size, fits in logged if not fits]
    return {"fitted": max(fitted, key=math.prod) if fitted else None,
            "not_fitted": min(missed, key=math.prod) if missed else None}


def _size(size: list[int]) -> str:
    return f"{size[0]}³" if len(set(size)) == 1 else "x".join(map(str, size))


def _gib(count) -> str:
    return "" if count is None else f"{count / 2**30:.1f} GiB"


def _step(planned: dict) -> str:
    """The step time of a row as `rent.step_time` gives it now, from the row's JSON (a row computed before a rule
    changed, e.g. a negative optimal_seconds set aside, reads as the rule says)."""
    import types

    from trainer.plan import rent

    step = rent.step_time(types.SimpleNamespace(compiler_seconds=planned.get("compiler_seconds"),
                                                estimate=planned.get("estimate")))
    return f"{step['seconds']:.3g} s ({step['source']})" if step else ""


def _figures(row: dict) -> tuple[str, str, str, str]:
    """(answer, layout, per-device bytes of the device's memory, step time) of one computed row, for the table."""
    found = row["result"]
    if "not_finished" in found or "error" in found:
        return found.get("not_finished") or f"failed: {found['error']}", "", "", ""
    if row["kind"] == "plan":
        top = found["row"] or {}
        answer = "fits" if found["fits"] else "does not fit"
        return (answer, ",".join(map(str, top.get("input_partition_dims", []))), _gib(top.get("total_bytes")),
                _step(top) if top else "")
    if row["kind"] == "predict":
        best = found["largest"] or {}
        return (f"{best['side']}³" if best else "none searched fits", "1 device", _gib(best.get("total_bytes")), "")
    key = "smallest" if row["kind"] == "smallest" else "largest"
    best = found[key]
    if best is None and key == "smallest" and found.get("not_searched"):
        missed = [p["target"] for p in found["points"] if p["fits"] is False]
        return (f"not {missed[-1] if missed else 'any searched'} or smaller; {found['not_searched'][0]} to "
                f"{found['not_searched'][-1]}: not searched", "", "", "")
    if best is None:
        return ("none searched fits" + (", some not searched" if found.get("not_searched") else ""), "", "", "")
    size = best.get("size") or []
    answer = best["target"] if key == "smallest" else _size(size)
    if key == "largest" and found.get("not_searched"):
        answer = "≥" + answer  # the largest reached: larger sizes were not searched in the time
    layout = ",".join(map(str, best["row"]["input_partition_dims"]))
    return answer, layout, _gib(best["row"]["total_bytes"]), _step(best["row"])


TARGET_COLUMNS = ("v5e:4x4", "v5e:8x8", "v5p:4x4x4", "h100x1", "h100x8", "h200x1", "h200x8")


def _cell(entry: dict | None) -> str:
    """One row's figures in one cell: the answer, its layout, the device's bytes, the step time, the minutes here."""
    if entry is None:
        return "not computed"
    if "not_finished" in entry["result"]:
        fitted = entry["result"].get("fitted") if entry["kind"] == "largest" else None
        return (f"≥{_size(fitted)} fits; " if fitted else "") + f"not finished in {ROW_SECONDS // 60} min here"
    answer, layout, per_device, step = _figures(entry)
    minutes = entry["seconds"] / 60
    took = f"{minutes:.1f} min" + (", over the 15-minute bound" if entry["seconds"] > ROW_SECONDS else "")
    if "is no time" in step:  # a TPU row whose compiler's estimate was set aside: the roofline's figure, said so
        step = step.split(" (")[0] + " roofline"
    return ", ".join(part for part in (answer, layout, per_device, step.split(" (")[0]) if part) + f" ({took})"


def _compilers(entries: list[dict]) -> str:
    """The compilers and versions of the computed rows, and their dates, in words."""
    versions = {}
    for entry in entries:
        versions.update(entry.get("compiler_versions") or {})
    dates = sorted({entry["date"][:10] for entry in entries})
    named = [f"{name} {versions[name]}" for name in ("libtpu", "jax-cuda12-plugin", "jax") if name in versions]
    return (f"Computed {' to '.join(dict.fromkeys([dates[0], dates[-1]]))} by {', '.join(named)}; step: a TPU's "
            "optimal_seconds or a GPU's roofline (\"roofline\" on a TPU: libtpu's was no time); in brackets, the "
            "row's time here. Compiler figures, not device measurements.") if entries else "Nothing computed yet."


def grid(result: dict) -> list[str]:
    """The full grid as Markdown, every row of `ROWS` computed or said not computed: the goals, the smallest slices,
    the largest whole cubes (network and precision by target) and the largest volume predict segments whole."""
    done = {r["name"]: r for r in result["rows"]}

    def named(name: str) -> dict | None:
        return done.get(name)

    lines = ["| goal | answer |", "|---|---|"]
    lines += [f"| {row['name'].removeprefix('goal: ')} | {_cell(named(row['name']))} |"
              for row in ROWS if row["kind"] == "plan"]
    lines += ["", "| smallest slice, bfloat16 | v5e | v5p | h100 |", "|---|---|---|---|"]
    for size in ("512x512x1024", "1024x1024x1024"):
        lines.append(f"| {size} | " + " | ".join(_cell(named(f"smallest {generation} for {size} bfloat16"))
                                               for generation in ("v5e", "v5p", "h100")) + " |")
    lines += ["", "| largest whole cube | " + " | ".join(TARGET_COLUMNS) + " |",
              "|---" * (len(TARGET_COLUMNS) + 1) + "|"]
    for model in ("default", "nnunet_plain"):
        for precision in ("bfloat16", "float32"):
            lines.append(f"| {'UNet' if model == 'default' else 'PlainConvUNet'}, {precision} | " + " | ".join(
                _cell(named(f"largest cube {model} {precision} on {target}")) for target in TARGET_COLUMNS) + " |")
    predict = [row["target"] for row in ROWS if row["kind"] == "predict"]
    lines += ["", "| largest cube `fullres predict` segments whole, float32 | " + " | ".join(predict) + " |",
              "|---" * (len(predict) + 1) + "|",
              "| one device | " + " | ".join(_cell(named(f"predict largest cube on {t}")) for t in predict) + " |"]
    return lines + ["", _compilers([done[row["name"]] for row in ROWS if row["name"] in done])]


def _brief(generation: str, entry: dict | None) -> str:
    """A smallest-slice row in a few words, for the README: the slice and its bytes per device, or how far it got."""
    if entry is None:
        return f"{generation}: not computed"
    answer, _, per_device, _ = _figures(entry)
    if per_device:
        return f"{answer} ({per_device}{', over 15 min' if entry['seconds'] > ROW_SECONDS else ''})"
    if "not searched" in answer:  # the smaller slices do not fit; the time ran out before the larger ones
        return f"{generation}: {answer.split(';')[0]}, the rest not searched in 15 min"
    return f"{generation}: {answer}"


def readme_table(result: dict) -> list[str]:
    """The README's table, from the same rows as `grid`: the goals, and the smallest slice of each generation."""
    done = {r["name"]: r for r in result["rows"]}
    lines = ["| bfloat16, default UNet | answer |", "| --- | --- |"]
    for row in ROWS:
        if row["kind"] == "plan":
            lines.append(f"| {row['name'].removeprefix('goal: ')} | {_cell(done.get(row['name']))} |")
    for size in ("512x512x1024", "1024x1024x1024"):
        cells = [_brief(generation, done.get(f"smallest {generation} for {size} bfloat16"))
                 for generation in ("v5e", "v5p", "h100")]
        lines.append(f"| smallest slice for {size} | {'; '.join(cells)} |")
    return lines


def _block_end(text: str, start: int, last_words: tuple[str, ...] | None) -> int:
    """Where the rendered block that begins at `start` ends: the end of its first line that begins with one of
    `last_words`, or, without them, its first blank line."""
    if last_words is None:
        return text.index("\n\n", start)
    return text.index("\n", min(text.index(word, start) for word in last_words if word in text[start:]))


def write_docs(result: dict) -> list[str]:
    """Replaces the grid in docs/what-to-rent.md and the table in the README with those rendered from `result`;
    returns the files changed."""
    changed = []
    for name, lines, last in (("docs/what-to-rent.md", grid(result), ("Computed ", "Nothing computed yet.")),
                              ("README.md", readme_table(result), None)):
        path = os.path.join(ROOT, name)
        with open(path, encoding="utf-8") as file:
            text = file.read()
        start = text.index(lines[0].split(" |")[0] + " |")
        updated = text[:start] + "\n".join(lines) + text[_block_end(text, start, last):]
        if updated != text:
            with open(path, "w", encoding="utf-8") as file:
                file.write(updated)
            changed.append(name)
    return changed


def _versions() -> dict:
    from trainer.plan import target_compile

    return target_compile.compiler_versions()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="compute only the rows of this name")
    parser.add_argument("--redo", action="append", default=[], help="compute this row again")
    parser.add_argument("--until", default=None, help="start no row after this UTC time (HH:MM)")
    parser.add_argument("--table", action="store_true", help="print the grid as Markdown from the JSON and stop "
                        "(docs/what-to-rent.md holds it; the README the goals and smallest slices: `readme_table`)")
    parser.add_argument("--write-docs", action="store_true", help="write the grid into docs/what-to-rent.md and the "
                        "README's table from the JSON, and stop")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    if args.child is not None:
        row = json.loads(args.child)
        print(json.dumps(compute(row, ROW_SECONDS - 60)), flush=True)
        return
    result = {"about": "what to rent: fullres plan's figures by each target's own compiler (no device); compiler "
                       "figures, not device measurements", "rows": []}
    if os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as file:
            result = json.load(file)
    if args.table:
        print("\n".join(grid(result)))
        return
    if args.write_docs:
        print("wrote " + (", ".join(write_docs(result)) or "nothing: the docs already hold the grid"))
        return
    done = {r["name"] for r in result["rows"] if r["name"] not in args.redo}
    for row in ROWS:
        if row["name"] in done or (args.only and row["name"] not in args.only):
            continue
        if args.until and datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M") >= args.until:
            break
        print(f"row: {row['name']}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            child = subprocess.run([sys.executable, __file__, "--child", json.dumps(row)], capture_output=True,
                                   text=True, timeout=ROW_SECONDS, cwd=ROOT)
            found = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {
                "error": (child.stderr.strip().splitlines() or ["?"])[-1][:500]}
        except subprocess.TimeoutExpired as cut:  # what its log says it found before the bound is kept
            found = {"not_finished": f"did not finish within {ROW_SECONDS // 60} minutes on this machine",
                     **reached(cut.stderr)}
        entry = {**row, "result": found, "seconds": round(time.perf_counter() - started, 1),
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                 "compiler_versions": _versions()}
        result["rows"] = [r for r in result["rows"] if r["name"] != row["name"]] + [entry]
        result["date"] = entry["date"][:10]  # the newest row's day: the measurements index dates the file by it
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS + ".tmp", "w", encoding="utf-8") as file:
            json.dump(result, file, indent=1)
        os.replace(RESULTS + ".tmp", RESULTS)
        print(f"row: {row['name']}: {entry['seconds']:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
