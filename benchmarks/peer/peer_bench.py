"""The same networks under PyTorch and under fullres's training step, side by side, in one command.

Networks: nnU-Net's default 3d_fullres PlainConvUNet (dynamic-network-architectures) and MONAI's UNet (monai), each
against the zoo's Keras port of the same configuration (`tests/trainer/zoo/`) in the step `fullres train` runs.
Same shapes (128³, batch 2 on a GPU), same loss (fullres's cross-entropy + soft Dice, `peer_torch.py`), same
optimizer (Adam), same precision. Rows per network, in the order they run:
  torch eager float32 · fullres float32 · torch eager bfloat16 (autocast) · fullres bfloat16 ·
  torch as nnU-Net runs it (torch.compile, float16 autocast, GradScaler) · fullres bfloat16 and float32 with
  `kernels.choose=measure` (each layer's fastest exact kernel, timed on the device at the row's first compile, within
  `MEASURE_SECONDS`, from a cache of the command's own: the first run's cost) · then fullres once per `--candidate`
  (a list of `--set` strings, e.g. "kernels.norm=fused kernels.conv_transpose=subpixel") or per name of
  `--candidates` (the kernel candidates, `zoo_kernels.CANDIDATES`, e.g. `taps,subpixel,fused,conv_nhwc,all`): every
  candidate's bfloat16 row first (where the gap is widest), then their float32 rows.
Per row: median step time, the allocator's peak (torch.cuda.max_memory_allocated; JAX's peak_bytes_in_use; on a CPU
the process's peak RSS, marked so), compile seconds (fullres: lower + compile; torch.compile: its first step), the
first step. Each row runs in its own process (`peer_rows.py`) under a time limit; what does not fit the command's
`--limit` is listed as not run, and so is what cannot run here, with why. The JSON's `ratios` are fullres ÷ PyTorch
for the speed goals. `--trace-dir` adds JAX's profiler to fullres's rows: the kernels' time per convolution kind.

On a GPU (the device machine; docs/device-check.md, "Running it on a lent GPU", gives the one call with device_check):
    python3 benchmarks/peer/peer_bench.py --json $OUT/peer_bench.json --trace-dir $OUT/traces --candidates taps,subpixel,fused,conv_nhwc,all --limit 360
On a CPU, at tiny sizes, in seconds (the suite runs this): python benchmarks/peer/peer_bench.py --tiny --json F
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "device"))  # result_file: where the JSON goes, checked first
import peer_checks  # noqa: E402
import result_file  # noqa: E402
import zoo_kernels  # noqa: E402  (the kernel candidates by name: the same names as its HLO counts)

ROWS = os.path.join(HERE, "peer_rows.py")
GPU = {"tiny": False, "size": 128, "batch_size": 2, "steps": 15, "warmup": 3, "row_limit": 120, "limit": 600,
       "measure_seconds": 45}
# A row's process on the loaded 2-core machine: 25-60 s for PyTorch's, 130-160 s for fullres's (imports, compile).
# --tiny's measure rows time no candidate (the CPU form shows that the rows run; the tests time candidates).
TINY = {"tiny": True, "size": 16, "batch_size": 1, "steps": 3, "warmup": 1, "row_limit": 300, "limit": 1800,
        "measure_seconds": 0}
NETWORKS = ("nnunet_plain", "monai_unet")
MEASURE_SECONDS = GPU["measure_seconds"]  # a measure row's bound on timing candidates (its compiles and steps on top)


def measure_sets(seconds: float = MEASURE_SECONDS) -> list[str]:
    """The `--set` strings of a measure row."""
    return ["kernels.choose=measure", f"kernels.measure_seconds={seconds:g}"]


MEASURE = measure_sets()
MIN_ROW_SECONDS = 10  # a row is not started with less of the command's time left
# The speed goals: (name, numerator row, denominator row, at most).
GOALS = (("fullres float32 ÷ torch eager float32", "fullres float32", "torch eager float32", 1.0),
         ("fullres bfloat16 ÷ torch eager bfloat16", "fullres bfloat16", "torch eager bfloat16", 1.0),
         ("fullres bfloat16 ÷ fullres float32", "fullres bfloat16", "fullres float32", 0.6),
         ("fullres best ÷ torch.compile float16 (nnU-Net's default)", "fullres best", "torch nnunet float16", 1.25))


def planned_rows(networks, candidates: list[list[str]], measure: list[str] = MEASURE) -> list[dict]:
    """Every row in the order it runs: each network's five baseline rows, its two measured rows (bfloat16, float32),
    then its candidates' bfloat16 rows, then their float32 rows (what a `--limit` leaves out is the float32 half
    first)."""
    rows = []
    for network in networks:
        for side, mode, precision in (("torch", "eager", "float32"), ("fullres", None, "float32"),
                                      ("torch", "eager", "bfloat16"), ("fullres", None, "bfloat16"),
                                      ("torch", "nnunet", "float16")):
            name = f"fullres {precision}" if side == "fullres" else f"torch {mode} {precision}"
            rows.append({"network": network, "side": side, "mode": mode, "precision": precision, "sets": [],
                         "name": name})
        for precision in ("bfloat16", "float32"):
            rows.append({"network": network, "side": "fullres", "mode": None, "precision": precision,
                         "sets": list(measure), "name": f"fullres {precision} [{' '.join(measure)}]"})
        for precision in ("bfloat16", "float32"):
            for sets in candidates:
                rows.append({"network": network, "side": "fullres", "mode": None, "precision": precision,
                             "sets": sets, "name": f"fullres {precision} [{' '.join(sets)}]"})
    return rows


@contextlib.contextmanager
def shared_autotuning(enabled: bool):
    """fullres's rows share the GPU compiler's autotuning, as device_check's rows do (a folder made here and removed
    after): a candidate's convolutions that its baseline row autotuned are not autotuned again, and each kernel is
    still the autotuner's choice. Each baseline row is the first of its precision, so its compile seconds are whole;
    a candidate row's are what it added."""
    if not enabled:
        yield
        return
    folder = tempfile.mkdtemp(prefix="peer_bench_autotune_")
    before = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = f"{before or ''} --xla_gpu_per_fusion_autotune_cache_dir={folder}".strip()
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if before is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = before


def run_row(spec: dict, limit: float) -> dict:
    """`peer_rows.py` on one row under `limit` seconds: its figures, or why there are none."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, ROWS, json.dumps({**spec, "limit_seconds": limit})],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=max(limit, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the row and what it started (torch.compile's workers)
        process.communicate()
        return {"status": "timed_out", "error": f"no result within its {limit:.0f} s",
                "wall_seconds": round(time.perf_counter() - started, 1)}
    lines = [line for line in output.splitlines() if line.startswith("ROW_RESULT ")]
    if not lines:
        tail = " | ".join(output.strip().splitlines()[-3:])[-600:]
        return {"status": "failed", "error": f"exit {process.returncode}: {tail}",
                "wall_seconds": round(time.perf_counter() - started, 1)}
    return {**json.loads(lines[-1][len("ROW_RESULT "):]), "wall_seconds": round(time.perf_counter() - started, 1)}


def ratios(rows: list[dict]) -> list[dict]:
    """The speed goals per network (and per candidate where one ran): step time and peak bytes, fullres ÷ the other."""
    out = []
    for network in dict.fromkeys(r["network"] for r in rows):
        ran = [r for r in rows if r["network"] == network and r["status"] == "ok"]
        fullres = [r for r in ran if r["side"] == "fullres"]
        for sets in dict.fromkeys(tuple(r["sets"]) for r in fullres):
            named = {r["name"]: r for r in ran if r["side"] == "torch" or tuple(r["sets"]) == sets}
            named = {(n.split(" [")[0] if n.startswith("fullres") else n): r for n, r in named.items()}
            mine = [r for r in fullres if tuple(r["sets"]) == sets]
            if mine:
                named["fullres best"] = min(mine, key=lambda r: r["median_step_seconds"])
            for goal, top, bottom, most in GOALS:
                if top not in named or bottom not in named:
                    continue
                a, b = named[top], named[bottom]
                step = a["median_step_seconds"] / b["median_step_seconds"]
                memory = a["peak_bytes"] / b["peak_bytes"] if a.get("peak_bytes") and b.get("peak_bytes") else None
                out.append({"network": network, "candidate": list(sets), "goal": goal, "numerator": a["name"],
                            "denominator": b["name"], "step_time": round(step, 4),
                            "memory": None if memory is None else round(memory, 4), "at_most": most,
                            "met": step <= most})
    return out


def table(result: dict) -> str:
    """The rows as a markdown table (docs/speed.md)."""
    lines = ["| network | row | status | median step | peak bytes | compile s | first step s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        step = f"{r['median_step_seconds'] * 1e3:.1f} ms" if r.get("median_step_seconds") else ""
        peak = f"{r['peak_bytes'] / 1e9:.2f} GB" if r.get("peak_bytes") else ""
        compiled = f"{r['compile_seconds']:.1f}" if r.get("compile_seconds") else ""
        first = f"{r['first_step_seconds']:.2f}" if r.get("first_step_seconds") else ""
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')[:120]}"
        if r.get("kernel_choice"):  # a measure row: what it cost and chose
            chosen = r["kernel_choice"]
            status += (f" (measured in {chosen['seconds']:.0f} s: " + "; ".join(
                f"{kind} " + ", ".join(f"{value} {count}" for value, count in counts.items())
                for kind, counts in chosen["by_kind"].items()) + f"; xla_flags {chosen['xla_flags']})")
        lines.append(f"| {r['network']} | {r['name']} | {status} | {step} | {peak} | {compiled} | {first} |")
    lines += ["", "| network | candidate | goal | step time | memory | at most | met |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for g in result["ratios"]:
        memory = "" if g["memory"] is None else f"{g['memory']:.2f}"
        lines.append(f"| {g['network']} | {' '.join(g['candidate']) or 'today'} | {g['goal']} | {g['step_time']:.2f} | "
                     f"{memory} | {g['at_most']} | {'yes' if g['met'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the JSON goes (a new file, or one this command wrote)")
    parser.add_argument("--tiny", action="store_true", help="the zoo's tiny networks at 16³ on this machine's CPU")
    parser.add_argument("--networks", default=",".join(NETWORKS), help="which networks, in order")
    parser.add_argument("--candidate", action="append", default=[], metavar="SETS",
                        help="fullres rows with these --set strings, space-separated (repeatable: one row pair each)")
    parser.add_argument("--candidates", metavar="NAMES",
                        help="the kernel candidates by name, comma-separated (after any --candidate): "
                             + ", ".join(zoo_kernels.CANDIDATES))
    parser.add_argument("--limit", type=float, help="seconds for every row together (default 600; --tiny 1800)")
    parser.add_argument("--trace-dir", help="JAX profiler traces of fullres's baseline rows go here (a GPU's kernels)")
    args = parser.parse_args(argv)
    networks = [n for n in args.networks.split(",") if n]
    unknown = [n for n in networks if n not in NETWORKS] or ([] if networks else [""])
    if unknown:
        parser.error(f"--networks {unknown[0]!r} is not one of {', '.join(NETWORKS)}")
    candidates = [text.split() for text in args.candidate]
    try:
        candidates += [sets for _, sets in zoo_kernels.candidate_sets(args.candidates or "")]
    except ValueError as error:
        parser.error(str(error))
    bad = [s for sets in candidates for s in sets if "=" not in s]
    if bad:
        parser.error(f"--candidate: {bad[0]!r} is not a KEY=VALUE setting, e.g. kernels.norm=fused")
    if args.limit is not None and not (math.isfinite(args.limit) and args.limit > 0):
        parser.error(f"--limit {args.limit:g} is not a number of seconds above 0; give the seconds for every row "
                     "together, e.g. 600")
    if (problem := result_file.path_problem(args.json, "peer_bench")) is not None:
        parser.error(problem)
    settings = dict(TINY if args.tiny else GPU)
    args.limit = args.limit or settings["limit"]
    base = {**{k: settings[k] for k in ("tiny", "size", "batch_size", "steps", "warmup")},
            "platform": "cpu" if args.tiny else "gpu"}
    # Each candidate's settings as its rows resolve them, before any row: a typo is not found after the baseline's.
    if (problem := peer_checks.candidate_problem([{**base, **row} for row in planned_rows(networks, candidates)
                                                  if row["sets"] in candidates])) is not None:
        parser.error(problem)
    started = time.perf_counter()
    deadline = started + args.limit
    measure = measure_sets(settings["measure_seconds"])
    planned, rows = planned_rows(networks, candidates, measure), []
    with shared_autotuning(not args.tiny), tempfile.TemporaryDirectory(prefix="peer_bench_kernels_") as choices:
        for row in planned:
            left = deadline - time.perf_counter()
            if left < MIN_ROW_SECONDS:
                result = {"status": "not_run", "error": "the command's --limit ran out"}
            else:
                trace = args.trace_dir if row["side"] == "fullres" and not row["sets"] else None
                result = run_row({**base, **row, "trace_dir": trace and os.path.abspath(trace),
                                  "kernel_cache": os.path.join(choices, "choices.json")},
                                 min(left, settings["row_limit"] + (settings["measure_seconds"] if row["sets"] == measure else 0)))
            rows.append({**row, **result})
            print(table({"rows": rows[-1:], "ratios": []}).splitlines()[2], flush=True)
            # After every row: a command stopped from outside (the device call's own limit) keeps what it measured,
            # and the rows it did not reach are listed as not run.
            unreached = [{**r, "status": "not_run", "error": "not reached: the command was stopped before this row"}
                         for r in planned[len(rows):]]
            result = {"about": "peer_bench: the same networks under PyTorch and fullres's training step",
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "command": " ".join(["python benchmarks/peer/peer_bench.py",
                                           *(argv if argv is not None else sys.argv[1:])]),
                      "settings": settings, "networks": networks, "candidates": candidates, "limit_seconds": args.limit,
                      "xla_flags": os.environ.get("XLA_FLAGS"),
                      "units": {"*_bytes": "bytes", "*_seconds": "seconds", "ratios": "fullres ÷ the other row "
                                "(step_time: median step seconds; memory: peak bytes)"},
                      "wall_seconds": round(time.perf_counter() - started, 1), "rows": rows + unreached,
                      "ratios": ratios(rows)}
            with open(args.json, "w", encoding="utf-8") as file:
                json.dump(result, file, indent=1)
    print(table(result), flush=True)
    print(f"{len(rows)} rows in {result['wall_seconds']} s, {sum(r['status'] == 'ok' for r in rows)} ran; JSON {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
