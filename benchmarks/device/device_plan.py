"""What `fullres plan --target h100x1` (or `h200x1`) says for every row of `device_check.py`, written ahead, without a GPU.

For each model, precision and augmentation of `device_check.py`'s training part: the plan at 128³, then the
largest cube 32 voxels apart that the plan says fits, found by `fullres plan --largest`'s search
(`edge_search.find_edge`) from the size its 128³ figure scales to. Each point is `memory_plan.run`, `fullres plan`'s own
code (the CPU compile for the roofline's counts, then the target's compiler; `target_total_bytes` and
`target_fits` repeat the target compiler's figures, the fields `device_check.py` reads first). On a GPU `fullres
plan` leaves a size uncompiled for the target only where its CPU figure is over ten times the device's memory
(`target_search.LEAST_SHARE_OF_CPU`: the GPU's compiler lays out as little as a fifth of the CPU's bytes, for
bfloat16), far past any size walked here; such a row says so and does not fit. Then `fullres predict`'s pass of
one 256³ volume, the program predict compiles (`plan.predict_plan`). Each row's `total_bytes` is the device's
(`plan.device_bytes`: the compiler's figure, `compiler_total_bytes`, and what the device adds, `device_terms`;
rows written before the device's terms hold the compiler's figure alone there), and the file names the compilers it
modelled (`compiler_versions`). A rerun keeps the rows it has (rows
written before the GPU pre-filter was loosened, 2026-11-27, carry the target's figures in `target_*` and a note).

    uv sync --group cuda
    nice -n 10 uv run --group cuda python benchmarks/device/device_plan.py [--target h100x1]  # results/device_plan_h100x1.json
    nice -n 10 uv run --group cuda python benchmarks/device/device_plan.py --target h200x1 --models default \
        --augmentations none  # the rows the H200 run checks first: results/device_plan_h200x1.json

One target point takes 30-60 s on the 2-core machine; all of them, about half an hour.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import device_check  # noqa: E402
import device_check_rows  # noqa: E402

STEP = 32


def plan_point(row: dict, size: int, target: str) -> dict:
    """`fullres plan --target` of `row`'s step at size³, one device: the plan's bytes, roofline and verdict."""
    from trainer.plan import memory_plan

    settings = {"precision": row["precision"], "augmentation": row["augmentation"],
                **device_check_rows.MODELS[row["model"]]}
    plan = memory_plan.run(model="unet3d", settings=settings, image_size=(size,) * 3, partitions=(1,), target=target)
    found = plan.to_json()
    if found["over_cpu_estimate"]:  # far past the memory by its CPU figure: the plan does not compile it for the target
        over = found["over_cpu_estimate"][0]
        return {**row, "size": size, "total_bytes": None, "cpu_total_bytes": over["cpu_total_bytes"], "fits": False,
                "step_seconds": None, "target_total_bytes": None, "target_fits": False,
                "note": f"fullres plan does not compile it for the target: its CPU figure per device {over['why']}"}
    if not found["rows"]:  # the target's compiler refused it for memory
        refused = found["refused"][0]
        return {**row, "size": size, "total_bytes": refused["needed_bytes"], "fits": False, "step_seconds": None,
                "target_total_bytes": refused["needed_bytes"], "target_fits": False,
                "note": "the target's compiler refuses it"}
    top = found["rows"][0]
    estimate = top.get("estimate") or {}
    return {**row, "size": size, "total_bytes": top["total_bytes"], "cpu_total_bytes": top["cpu_total_bytes"],
            "compiler_total_bytes": top["compiler_total_bytes"], "device_terms": top["device_terms"],
            "expected_compile_seconds": top["expected_compile_seconds"],
            "temp_bytes": top["temp_bytes"], "argument_bytes": top["argument_bytes"], "fits": top["fits"],
            "target_total_bytes": top["total_bytes"], "target_fits": top["fits"], "step_seconds": estimate.get("seconds"),
            "bound": estimate.get("bound"), "flops": top["flops"], "bytes_accessed": top["bytes_accessed"],
            "compile_seconds": top["compile_seconds"]}


def predict_point(size: int, target: str) -> dict:
    """The bytes per device `fullres predict`'s whole-volume pass of one size³ volume needs on the target: the program
    predict compiles (`predict_plan`: the weights alone, padded as predict pads) and what the device holds beside it."""
    from trainer.plan import predict_plan, targets

    row = {"part": "predict", "model": "default", "precision": "float32", "augmentation": "none"}
    found = predict_plan.predict_bytes(device_check_rows.make_config(row), (size, size, size, 1), targets.parse(target))
    return {**row, "size": size, **found, "target_total_bytes": found["total_bytes"], "target_fits": found["fits"],
            "step_seconds": None, "note": "no roofline: the CUDA compiler gives no counts ahead of time"}


def scaled_roofline(point: dict, first: dict, target: str) -> dict:
    """Where the plan has no counts at a size (a row written past its old CPU pre-filter, or refused): the roofline
    of the 128³ counts scaled by volume (a convolutional step's flops and bytes grow with its voxels), marked so."""
    from trainer.plan import roofline, targets

    if point.get("step_seconds") is not None or not first.get("flops") or not first.get("bytes_accessed"):
        return point
    volume = (point["size"] / first["size"]) ** 3
    estimate = roofline.estimate(first["flops"] * volume, first["bytes_accessed"] * volume, 0,
                                 targets.hardware(targets.parse(target).kind), point["precision"])
    return {**point, "step_seconds": estimate.seconds, "bound": estimate.bound,
            "step_source": "the 128³ plan's counts scaled by volume"}


def fits(point: dict) -> bool:
    """The target compiler's verdict (`target_fits`; in rows written before the GPU pre-filter was loosened, also
    where `fullres plan` left the size uncompiled)."""
    return bool(point.get("target_fits", point["fits"]))


def largest(row: dict, first: dict, known: list[dict], target: str, save, start: int | None = None) -> None:
    """The largest cube the plan says fits, among cubes 32 apart up to 1024: `fullres plan --largest`'s search
    (`edge_search.find_edge`) from where the 128³ figure scales to (or `start`); points already in `known` are read,
    not planned again."""
    from trainer.plan import edge_search, targets

    limit = targets.memory_per_device(targets.parse(target))
    scale = ((limit - first["argument_bytes"]) / first["temp_bytes"]) ** (1 / 3)
    sides = list(range(STEP, 1024 + 1, STEP))
    size = min(max(start or int(128 * scale) // STEP * STEP, STEP), sides[-1])
    seen = {p["size"]: p for p in known if "target_fits" in p}

    def probe(index: int) -> dict:
        side = sides[index]
        if side not in seen or seen[side].get("step_seconds") is None:
            seen[side] = scaled_roofline(seen.get(side) or plan_point(row, side, target), first, target)
            save(seen[side])
        return seen[side]

    edge_search.find_edge(len(sides), probe, fits, sides.index(size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="h100x1")
    parser.add_argument("--json", default=None, help="default: benchmarks/results/device_plan_TARGET.json, which "
                        "device_check.py reads")
    parser.add_argument("--start", action="append", default=[], metavar="PRECISION=SIZE",
                        help="where the walk to the largest cube starts (default: the 128³ figure scaled)")
    for key in ("models", "precisions", "augmentations"):
        parser.add_argument(f"--{key}", default=",".join(device_check.GPU[key]), help=f"only these {key}")
    args = parser.parse_args()
    args.json = args.json or os.path.join(HERE, "results", f"device_plan_{args.target}.json")
    import jax

    jax.config.update("jax_platforms", "cpu")
    from trainer.plan import device_bytes, target_compile

    compilers = target_compile.compiler_versions()
    versions = ", ".join(f"{name} {version}" for name, version in compilers.items())
    result = {"about": "device_plan: fullres plan --target for device_check.py's rows, ahead of time, no GPU",
              "source": f"fullres plan --target {args.target} (the device's bytes: its compiler's figure and what "
                        f"the device adds, device_bytes; step: roofline estimate; {versions})", "target": args.target,
              "compiler_versions": compilers, "device_bytes": device_bytes.plan_json("cuda", compilers), "rows": []}
    if os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as file:
            result["rows"] = json.load(file)["rows"]
    def key(point: dict) -> tuple:
        return point["part"], point["model"], point["precision"], point["augmentation"], point["size"]

    def save(point: dict) -> None:
        print(json.dumps(point), flush=True)
        result["rows"] = [r for r in result["rows"] if key(r) != key(point)] + [point]
        result["date"] = datetime.date.today().isoformat()
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=1)

    chosen = {**device_check.GPU, **{key: tuple(getattr(args, key).split(",")) for key in
                                     ("models", "precisions", "augmentations")}}
    combinations = [{k: r[k] for k in ("part", "model", "precision", "augmentation")}
                    for r in device_check.training_rows(chosen) if r["size_from"] == "fixed"]
    firsts = []
    for row in combinations:  # every 128³ point first: the rows a device reaches first, and the walks' start
        first = next((r for r in result["rows"] if all(r.get(k) == row[k] for k in row) and r["size"] == 128
                      and "temp_bytes" in r), None)
        if first is None:
            first = plan_point(row, 128, args.target)
            save(first)
        firsts.append(first)
    if not any(r["part"] == "predict" for r in result["rows"]):  # before the walks, the longest part
        save(predict_point(device_check.GPU["predict_size"], args.target))
    for row, first in zip(combinations, firsts):
        starts = dict(text.split("=") for text in args.start)
        largest(row, first, [r for r in result["rows"] if all(r.get(k) == row[k] for k in row)], args.target, save,
                int(starts[row["precision"]]) if row["precision"] in starts else None)


if __name__ == "__main__":
    main()
