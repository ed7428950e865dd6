"""Per-device memory of the plain 3D UNet's training step, by compiler: this CPU, TPU v5e and v4, H100.

The plain UNet (4 levels of 16-128 filters, no stem: `unet.PLAIN_SETTINGS`) was the default model when these
were measured; the TPU's several-fold figures here are why the default is now TPU-shaped (space-to-depth stem,
128+ filters), whose figures are in benchmarks/partitioning/seed_configs.py's results.

For each volume and core count N (split N-way along depth, `1,N,1,1,1`) the
step `fullres train` compiles is compiled for each target with that target's
own compiler (`fullres plan --target`'s code, its plan cache included, so a
rerun only compiles what it has not seen) and its `memory_analysis()` total
per device is recorded side by side; then the plot.

    uv run --group tpu --group cuda python benchmarks/partitioning/target_memory.py --json benchmarks/results/target_memory.json \\
        --plot benchmarks/results/target_memory.png [--max-minutes 120]

TPU compiles of the default UNet take 5-20 minutes each on a 2-core machine;
`--max-minutes` stops starting new ones (those left are recorded as not run).
GPU figures are without cuDNN workspace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=32")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

from trainer.models import unet  # noqa: E402
from trainer.plan import compiled_step, layout_measure, target_compile, targets  # noqa: E402

TOPOLOGY = {"v5e": {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8"}, "v4": {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4"}}
CASES = [(128, 4), (128, 8), (128, 16), (256, 8), (256, 16), (256, 32)]
TARGETS = ("cpu", "h100", "v5e", "v4")


def target_for(kind: str, partitions: int) -> targets.Target:
    if kind == "cpu":
        return targets.parse("cpu")
    if kind in TOPOLOGY:
        return targets.parse(f"{kind}:{TOPOLOGY[kind][partitions]}")
    hosts = max(1, partitions // 8)
    return targets.parse(f"{kind}x{min(8, partitions)}" + (f"x{hosts}" if hosts > 1 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--targets", default=",".join(TARGETS))
    arguments = parser.parse_args()
    started = time.perf_counter()
    cache = target_compile.PlanCache()
    results = json.load(open(arguments.json)) if os.path.exists(arguments.json) else {"rows": []}
    done = {(r["size"], r["partitions"], r["kind"]) for r in results["rows"] if "total_bytes" in r or "needed_bytes" in r}
    kinds = arguments.targets.split(",")
    # Cheap targets first, then the TPU compiles, smallest volume first.
    for kind in kinds:
        for size, partitions in CASES:
            if (size, partitions, kind) in done:
                continue
            if arguments.max_minutes is not None and time.perf_counter() - started > arguments.max_minutes * 60:
                print(f"--max-minutes reached: {kind} {size}^3 N={partitions} not run", flush=True)
                continue
            dims = compiled_step.default_partition_dims(partitions, 5)
            config = compiled_step.plan_config("unet3d", "default",
                                               {**unet.PLAIN_SETTINGS, "partition.input_partition_dims": ",".join(map(str, dims))})
            shape = compiled_step.example_shape(config, (size,) * 3)
            target = target_for(kind, partitions)
            builder = compiled_step.StepBuilder(config, shape)
            devices = jax.devices()[:partitions] if kind == "cpu" else targets.devices(target)[:partitions]
            begun = time.perf_counter()
            row = layout_measure.measure(builder, dims, devices, targets.memory_per_device(target),
                                        compile_only=kind != "cpu", cache=None if kind == "cpu" else cache)
            record = {"size": size, "partitions": partitions, "kind": kind, "target": target.name,
                      "wall_seconds": round(time.perf_counter() - begun, 1), **row.to_json()}
            results["rows"].append(record)
            figure = record.get("total_bytes") or record.get("needed_bytes")
            print(f"{kind:>4} {size}^3 N={partitions:>2} {target.name:<10} {figure / 2**30:7.2f} GiB "
                  f"({record['wall_seconds']} s{', cached' if record.get('cached') else ''})", flush=True)
            results["about"] = ("Default 3D UNet (4 levels, 16 filters, instance norm, float32, batch 1), split 1,N,1,1,1; "
                                "per-device bytes from each target's compiler (memory_analysis: temp + arguments + "
                                "outputs - aliased); GPU figures without cuDNN workspace. jax "
                                f"{jax.__version__}; measured on a 2-core CPU machine without accelerators.")
            with open(arguments.json, "w") as file:
                json.dump(results, file, indent=1)
    _add_seed_rows(results)
    with open(arguments.json, "w") as file:
        json.dump(results, file, indent=1)
    if arguments.plot:
        plot(results, arguments.plot)


def _add_seed_rows(results: dict) -> None:
    """Cells `seed_configs.py` measured on the same code path (the default UNet, 1,N,1,1,1, on v5e/v4), marked so."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "seed_configs.jsonl")
    if not os.path.exists(path):
        return
    have = {(r["size"], r["partitions"], r["kind"]) for r in results["rows"]}
    with open(path) as file:
        for line in file:
            row = json.loads(line)
            kind = row["target"].split(":")[0]
            cell = (row["size"][0], row["partitions"] if "partitions" in row else None, kind)
            if row["model"] != "unet3d" or "total_bytes" not in row or cell in have:
                continue
            results["rows"].append({**row, "size": cell[0], "kind": kind, "source": "benchmarks/partitioning/seed_configs.py"})


COLOURS = {"cpu": (120, 120, 120), "h100": (44, 160, 44), "v5e": (31, 119, 180), "v4": (214, 39, 40)}


def plot(results: dict, path: str) -> None:
    """Two panels (128³, 256³): GiB per device against N, log-log, one line per compiler."""
    from PIL import Image, ImageDraw

    width, height, margin = 460, 340, 60
    image = Image.new("RGB", (2 * width, height + 40), "white")
    draw = ImageDraw.Draw(image)
    rows = [r for r in results["rows"] if "total_bytes" in r]
    if not rows:
        image.save(path)
        return
    low = min(r["total_bytes"] for r in rows) / 2**30 / 1.5
    high = max(r["total_bytes"] for r in rows) / 2**30 * 1.5
    for panel, size in enumerate((128, 256)):
        left = panel * width
        x0, x1, y0, y1 = left + margin, left + width - 20, height - margin + 20, 40
        draw.rectangle([x0, y1, x1, y0], outline=(0, 0, 0))
        draw.text((x0, 14), f"default UNet {size}^3, float32: GiB per device", fill=(0, 0, 0))
        counts = sorted({n for s, n in CASES if s == size})

        def x_of(n, counts=counts, x0=x0, x1=x1):
            return x0 + 20 + (x1 - x0 - 40) * math.log2(n / counts[0]) / max(math.log2(counts[-1] / counts[0]), 1)

        def y_of(gib, y0=y0, y1=y1):
            return y0 - (y0 - y1) * math.log(gib / low) / math.log(high / low)
        for n in counts:
            draw.text((x_of(n) - 6, y0 + 6), f"N={n}", fill=(0, 0, 0))
        for tick in (0.25, 0.5, 1, 2, 4, 8, 16):
            if low <= tick <= high:
                draw.line([x0 - 4, y_of(tick), x0, y_of(tick)], fill=(0, 0, 0))
                draw.text((left + 8, y_of(tick) - 6), f"{tick:g}", fill=(0, 0, 0))
        for number, kind in enumerate(TARGETS):
            points = sorted((r["partitions"], r["total_bytes"] / 2**30) for r in rows
                            if r["size"] == size and r["kind"] == kind)
            if not points:
                continue
            xy = [(x_of(n), y_of(g)) for n, g in points]
            if len(xy) > 1:
                draw.line(xy, fill=COLOURS[kind], width=2)
            for x, y in xy:
                draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=COLOURS[kind])
            draw.text((x1 - 90, y1 + 8 + 14 * number), kind if kind != "h100" else "h100 (no cuDNN ws)",
                      fill=COLOURS[kind])
    image.save(path)


if __name__ == "__main__":
    main()
