"""The plan meets a device: measure an available GPU against `fullres plan`, in one command, within 8 minutes.

Parts, each under its own time limit (seconds on one H100, compilation included; `--limit PART=SECONDS`):
  train    330  the training step `fullres train` runs, on one device, for the default UNet and for
                `--stem none --num-levels 4 --base-filters 16`; at 128³ and at the largest cube that fits;
                float32 and bfloat16; `--augmentation nnunet` and `none`. Per row: median step time over 20
                steps after 3 of warm-up, peak device memory (the allocator's peak_bytes_in_use), examples/s;
                beside them what `fullres plan --target` said for that GPU (h100x1 on an H100: memory,
                roofline step time) and measured ÷ planned. A row gets 60 s (the largest cube 120 s) or what is left of the part.
  predict   60  `fullres predict`'s pass of one 256³ volume whole: time, peak memory, against its plan.
  input     60  the CT input path (synthetic records, the project's reader) feeding the default UNet's
                128³ step: the input wait over 20 measured steps.

Every row runs in a process of its own (`device_check_rows.py`): one that runs out of memory, hangs past its
limit or fails is reported as such, with what the plan said, and the next row runs. Rows a part has no time
left for are listed as not run. One JSON (`--json`: device name, driver, JAX version, date, every row) and
a table.

The largest cube that fits: the plan first, then the device. `benchmarks/device/device_plan.py` (run ahead, on a
machine without a GPU) records `fullres plan --target h100x1` at growing cubes, 32 voxels apart; the largest
the plan says fits is compiled on the device, and, where the device's own compiler needs more than the
allocator holds, the next size down, until one fits; then it runs. Without a plan row the 128³ row's
compiler figure, scaled by volume, gives the first size tried. The "planned" columns are the plan file's
(`fullres plan`, ahead of time, no GPU); where it has no row, the device compiler's own figures on the
target's published peaks, marked so in `planned.source`.

On the device machine (Python 3.12, JAX with its CUDA 13 plug-in; no Keras, no TensorFlow and no network):
the few wheels fullres's training step needs beyond that image travel in `.whl` (docs/device-check.md, "Running
it on a lent GPU", says how to fetch them here); the lead's one call of the `run` tool, kind nvidia-h100-x1, carry
[".whl"], timeout_s 540:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
      .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; PYTHONUNBUFFERED=1 python3 \\
      benchmarks/device/device_check.py --json $OUT/device_check.json 2>&1 | tee $OUT/device_check.log

On a CPU, at tiny sizes, in seconds (the suite runs this): `python benchmarks/device/device_check.py --tiny --json F`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(os.path.dirname(HERE)))  # the plan's terms (trainer/plan/device_bytes.py)

from device_check_plan import autotune_choice, plan_versions, planned_for, version_drift, with_device_terms  # noqa: E402
from device_check_report import HEADER, STATUSES, check, table_line, with_ratios  # noqa: E402,F401
import result_file  # noqa: E402
ROWS = os.path.join(HERE, "device_check_rows.py")
LIMITS = {"train": 330, "predict": 60, "input": 60}  # seconds per part: 450 in all, inside the 8 minutes
ROW_LIMIT, LARGEST_LIMIT = 60, 120  # seconds per training row
MIN_ROW_SECONDS = 5  # a row is not started with less of its part's time left
GPU = {"models": ("default", "plain16"), "size": 128, "predict_size": 256, "step": 32, "steps": 20, "warmup": 3,
       "examples": 8, "precisions": ("float32", "bfloat16"), "augmentations": ("none", "nnunet")}
# --tiny: the same parts on a CPU in seconds; a 4 MiB "device" makes the largest-cube search step down (32³ to 24³).
TINY = {"models": ("tiny",), "size": 16, "predict_size": 16, "step": 8, "steps": 3, "warmup": 1, "examples": 2,
        "precisions": ("float32",), "augmentations": ("none",), "memory_limit_bytes": 4 * 2**20, "largest": 32}


def largest_candidates(plan: dict | None, row: dict, first: dict | None, settings: dict) -> tuple[list[int], str]:
    """Sizes to try for the largest cube, largest first, and how they were found (the plan first)."""
    step = settings["step"]
    if "largest" in settings:
        top = settings["largest"]
        return [top - step * k for k in range(3) if top - step * k > 0], f"--tiny: from {top}³ down"
    fitting = [e["size"] for e in (plan or {}).get("rows", []) if e.get("target_fits", e.get("fits")) and
               all(e.get(k) == row[k] for k in ("part", "model", "precision", "augmentation"))]
    if fitting:
        top = max(fitting)
        return [top - step * k for k in range(3)], f"the plan's largest that fits ({top}³), then the device"
    measured = (first or {}).get("measured") or {}
    compiler = (measured.get("device_compiler") or {}).get("total_bytes")
    if not compiler or not measured.get("bytes_limit"):
        return [], "no plan row and no 128³ figure to scale"
    top = int(settings["size"] * (measured["bytes_limit"] / compiler) ** (1 / 3)) // step * step
    return [top + step, top, top - step], f"the 128³ compiler figure scaled by volume ({top}³), then the device"


def fallback_plan(measured: dict) -> dict | None:
    """Where the plan file has no row: the device compiler's bytes and its counts' roofline, marked so."""
    compiler, roof = measured.get("device_compiler") or {}, measured.get("device_roofline") or {}
    if not compiler.get("total_bytes"):
        return None
    return {"total_bytes": compiler["total_bytes"], "step_seconds": roof.get("step_seconds"), "bound": roof.get("bound"),
            "fits": None, "source": "the device's own compiler (memory_analysis; cost_analysis on the target's "
                                    "published peaks): no fullres plan row for this size"}


def run_row(spec: dict, limit: float) -> dict:
    """Runs one row in its own process under `limit` seconds; its figures, or why there are none."""
    started = time.perf_counter()
    environment = dict(os.environ)
    if spec.get("xla_flags"):  # the row's own choice (autotuning off for a largest cube), recorded in the row
        environment["XLA_FLAGS"] = f"{environment.get('XLA_FLAGS', '')} {spec['xla_flags']}".strip()
    process = subprocess.Popen([sys.executable, ROWS, json.dumps(spec)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True, env=environment)
    try:
        output, _ = process.communicate(timeout=max(limit, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the row and anything it started
        process.communicate()
        return {"status": "timed_out", "error": f"no result within its {limit:.0f} s", "wall_seconds": round(
            time.perf_counter() - started, 1)}
    lines = [line for line in output.splitlines() if line.startswith("ROW_RESULT ")]
    if not lines:
        tail = " | ".join(output.strip().splitlines()[-3:])[-600:]
        oom = "RESOURCE_EXHAUSTED" in output or "out of memory" in output.lower()
        return {"status": "out_of_memory" if oom else "failed", "error": f"exit {process.returncode}: {tail}",
                "wall_seconds": round(time.perf_counter() - started, 1)}
    result = json.loads(lines[-1][len("ROW_RESULT "):])
    return {**result, "wall_seconds": round(time.perf_counter() - started, 1)}


def measure_row(row: dict, spec: dict, limit: float, plan: dict | None) -> dict:
    """`row` measured (`run_row`) with what the plan said beside it and the ratios."""
    if limit < MIN_ROW_SECONDS:
        planned = planned_for(plan, row, spec["sizes"][0])
        return with_ratios({**row, "size": spec["sizes"][0], "status": "not_run", "planned": planned,
                            "error": "its part's time ran out"})
    result = run_row({**spec, "limit_seconds": limit}, limit)
    here, status = result.pop("here", None), result.pop("status")
    error, wall = result.pop("error", None), result.pop("wall_seconds")
    size = result.get("size", spec["sizes"][0])
    planned = with_device_terms(planned_for(plan, row, size) or fallback_plan(result), result, spec.get("hardware", "h100"))
    roofline = result.get("device_roofline") or {}
    if planned and planned["step_seconds"] is None and roofline.get("step_seconds"):
        planned.update(step_seconds=roofline["step_seconds"], bound=roofline.get("bound"),
                       step_source="the device compiler's counts on the target's published peaks (no plan roofline)")
    out = {**row, "size": size, "status": status, "wall_seconds": wall, "measured": result, "planned": planned}
    if error:
        out["error"] = error
    if here:
        out["here"] = here
    return with_ratios(out)


def training_rows(settings: dict) -> list[dict]:
    """The training rows in the order they run: the first precision and augmentation at both sizes (the largest
    cube is the plan's memory claim at its edge), then every other 128³ row (a compile and 23 short steps each),
    then the other largest cubes (long steps): a part that runs out of time has measured the most rows it could."""
    rows = [{"part": "train", "model": model, "precision": precision, "augmentation": augmentation,
             "size_from": size_from} for size_from in ("fixed", "largest") for augmentation in settings["augmentations"]
            for precision in settings["precisions"] for model in settings["models"]]
    first = {k: rows[0][k] for k in ("precision", "augmentation")}
    ahead = [r for r in rows if {k: r[k] for k in first} == first]
    return ahead + [r for r in rows if r not in ahead]


def run_parts(args, settings: dict, plan: dict | None) -> list[dict]:
    """Every part in turn, each within its limit; the rows."""
    base = {"platform": "cpu" if args.tiny else "gpu", "hardware": args.target_kind, "steps": settings["steps"],
            "warmup": settings["warmup"], "memory_limit_bytes": settings.get("memory_limit_bytes")}
    out = []
    for part in args.parts:
        deadline = time.perf_counter() + args.limits[part]
        if part == "train":
            done = {}
            for row in training_rows(settings):
                key = (row["model"], row["precision"], row["augmentation"])
                how, fit = "fixed", False
                sizes = [settings["size"]]
                if row["size_from"] == "largest":
                    sizes, how = largest_candidates(plan, row, done.get(key), settings)
                    fit = True
                left = deadline - time.perf_counter()
                if not sizes:
                    result = {**row, "size": None, "status": "not_run", "planned": None, "error": how, "ratios": {}}
                else:
                    spec = {**base, **row, "sizes": sizes, "fit": fit}
                    if fit and not args.tiny:  # the largest cube compiles within its row's limit, or not at all
                        autotune, why = autotune_choice(planned_for(plan, row, sizes[0]), None, LARGEST_LIMIT)
                        spec.update(autotune_why=why, xla_flags="" if autotune else "--xla_gpu_autotune_level=0")
                    result = measure_row(row, spec, min(left, LARGEST_LIMIT if fit else ROW_LIMIT), plan)
                    ran_out = []
                    while fit and result["status"] == "out_of_memory" and any(s < result["size"] for s in sizes):
                        # Verified on the device: it ran out at this size, so the next one down, in a fresh process.
                        ran_out.append({"size": result["size"], "error": result.get("error")})
                        sizes = [s for s in sizes if s < result["size"]]
                        left = deadline - time.perf_counter()
                        result = measure_row(row, {**spec, "sizes": sizes}, min(left, LARGEST_LIMIT), plan)
                    if ran_out:
                        result["ran_out_of_memory_at"] = ran_out
                result["size_found_by"] = how
                done.setdefault(key, result)
                out.append(result)
                print(table_line(result), flush=True)
        else:
            model = settings["models"][0]
            row = {"part": part, "model": model, "precision": "float32", "augmentation": "none"}
            size = settings["predict_size"] if part == "predict" else settings["size"]
            spec = {**base, **row, "sizes": [size], "examples": settings["examples"],
                    "steps": 3 if part == "predict" else settings["steps"]}
            result = measure_row(row, spec, deadline - time.perf_counter(), plan)
            out.append(result)
            print(table_line(result), flush=True)
    return out


def nvidia_smi(field: str) -> str | None:
    """One field of the first GPU as nvidia-smi reports it (driver_version, name), None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        found = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else None


def target_here() -> str:
    """`h100x1`, `h200x1`, ...: the plan target of this machine's first GPU (`h100x1` where none is named)."""
    name = (nvidia_smi("name") or "").lower()
    return next((f"{model}x1" for model in ("h200", "h100", "b200", "a100") if model in name), "h100x1")


def default_plan(target: str) -> str:
    """`device_plan.py`'s JSON for `target` in benchmarks/results/ (where results stay; it may not be there)."""
    return os.path.join(os.path.dirname(HERE), "results", f"device_plan_{target}.json")


def read_plan(path: str) -> dict:
    """`device_plan.py`'s JSON in `path`.

    Raises:
        ValueError: it is not JSON, or not a plan's (an object with its `rows`): one sentence, with the fix.
    """
    fix = "name the JSON `benchmarks/device/device_plan.py --json` wrote for the target"
    try:
        with open(path, encoding="utf-8") as file:
            plan = json.load(file)
    except UnicodeDecodeError:
        raise ValueError(f"--plan {path} is not text, so not device_plan.py's JSON; {fix}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--plan {path} is not JSON (line {error.lineno}: {error.msg}); {fix}") from None
    except OSError as error:
        raise ValueError(f"--plan {path} cannot be read ({error.strerror}); {fix}") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("rows"), list):
        raise ValueError(f"--plan {path} is JSON but not a device plan (it has no list of rows); {fix}")
    return plan


def parse_limits(texts: list[str]) -> dict:
    limits = dict(LIMITS)
    for text in texts:
        part, _, seconds = text.partition("=")
        if part not in LIMITS or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"--limit {text!r}: give PART=SECONDS with PART one of {', '.join(LIMITS)}, e.g. train=300.")
        limits[part] = float(seconds)
    return limits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the JSON goes (a new file, or one this command wrote)")
    parser.add_argument("--target", default=None, help="the plan's target, e.g. h100x1 (default: this machine's GPU, "
                        "as nvidia-smi names it); its published peaks give the roofline")
    parser.add_argument("--plan", default=None, help="device_plan.py's JSON for the target (default: "
                        "benchmarks/results/device_plan_TARGET.json, where there is one)")
    parser.add_argument("--parts", default="train,predict,input", help="which parts, in order")
    parser.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS", help="a part's time limit")
    parser.add_argument("--tiny", action="store_true", help="on this machine's CPU at tiny sizes, in seconds")
    parser.add_argument("--models", help="only these of the training rows' models (default, plain16)")
    parser.add_argument("--precisions", help="only these precisions (float32, bfloat16)")
    parser.add_argument("--augmentations", help="only these augmentations (none, nnunet)")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in args.parts if p not in LIMITS]
    if bad:
        parser.error(f"--parts {bad[0]!r} is not a part; use some of {', '.join(LIMITS)}")
    args.limits = parse_limits(args.limit)
    if not args.tiny and nvidia_smi("name") is None:  # else the GPU's rows (128³ and up) run on this CPU
        parser.error("this machine has no GPU (nvidia-smi names none), and device_check measures one; run it on the "
                     "device machine, or pass --tiny for the same parts on this CPU at tiny sizes")
    args.target = args.target or target_here()
    args.target_kind = args.target.split("x")[0]
    given_plan = args.plan
    args.plan = args.plan or default_plan(args.target)
    if (problem := result_file.path_problem(args.json, "device_check")) is not None:
        parser.error(problem)
    plan = None
    if given_plan or (os.path.exists(args.plan) and not args.tiny):  # --tiny sets no plan beside its rows
        try:
            read = read_plan(args.plan)
        except ValueError as error:
            parser.error(str(error))
        plan = None if args.tiny else read
    settings = dict(TINY if args.tiny else GPU)
    for key in ("models", "precisions", "augmentations"):
        chosen = getattr(args, key)
        if chosen:
            unknown = [v for v in chosen.split(",") if v not in settings[key]]
            if unknown:
                parser.error(f"--{key} {unknown[0]!r} is not one of {', '.join(settings[key])}")
            settings[key] = tuple(chosen.split(","))
    folder = None
    if not args.tiny:
        # Rows share the GPU compiler's autotuning (the same convolutions at the same size and precision, with and
        # without augmentation): each kernel is still the autotuner's choice, found once instead of once per row.
        folder = tempfile.mkdtemp(prefix="device_check_autotune_")
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_per_fusion_autotune_cache_dir={folder}".strip()
    print(f"device_check: parts {', '.join(args.parts)}; limits {args.limits} s; plan "
          f"{args.plan if plan else 'none (the device compiler stands in)'}", flush=True)
    print(HEADER, flush=True)
    started = time.perf_counter()
    try:
        rows = run_parts(args, settings, plan)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)  # the autotuning cache this command made
    here = next((r.pop("here") for r in rows if r.get("here")), {})
    for row in rows:
        row.pop("here", None)
    result = {"about": "device_check: measured ÷ planned for fullres's training step, predict and input path",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python benchmarks/device/device_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "device": {"name": here.get("device_kind"), "platform": here.get("platform"),
                         "count": here.get("device_count"), "driver": nvidia_smi("driver_version")},
              "software": {"python": here.get("python"), **here.get("versions", {}),
                           "xla_flags": os.environ.get("XLA_FLAGS"),
                           "allocator_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")},
              "target": args.target, "plan_file": os.path.relpath(args.plan) if plan else None,
              "plan_compiler_versions": plan_versions(plan),
              "version_drift": version_drift(plan_versions(plan), here.get("versions", {})),
              "settings": {k: v for k, v in settings.items()}, "limits_seconds": args.limits,
              "units": {"*_bytes": "bytes", "*_seconds": "seconds", "examples_per_second": "examples/s",
                        "ratios": "measured ÷ planned (memory: peak_bytes ÷ total_bytes; step_time: median step "
                                  "seconds ÷ roofline seconds)"},
              "wall_seconds": round(time.perf_counter() - started, 1), "rows": rows}
    with open(args.json, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=1)
    if result["version_drift"]:
        print(f"the plan modelled another compiler than the device runs: {'; '.join(result['version_drift'])}",
              flush=True)
    problems = check(result)
    print(f"{len(rows)} rows in {result['wall_seconds']} s; {sum(r['status'] == 'ok' for r in rows)} ran; "
          f"JSON {args.json}" + (f"; problems: {problems}" if problems else ""), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
