"""Per-device memory scaling of the partitioned training step (the table behind `fullres plan`).

For the 3D UNet at 256³ (batch 1; the plain UNet, 4 levels of 16-128 filters and no stem, the default model when
these results were recorded: `unet.PLAIN_SETTINGS`) it compiles the step
ahead of time for N = 1, 2, 4, 8, 16 cores, N-way along depth, in float32,
bfloat16 and bfloat16 with rematerialization; for RetinaNet (ResNet-18 + FPN)
at 2560² for N = 1, 4, 8 along height, in float32; batch 1 throughout. On virtual CPU devices;
nothing runs. It reports activation memory, total per device, E(N) = M(1) / (N · M(N)),
activation all-gathers and halo bytes, and the smallest N that fits 16 GiB.

With `--layout-search MODEL:SIZE:N[,N...]` (repeatable) it instead compiles
every layout of each N over the spatial dimensions (`fullres plan --layouts
all`) and records the ranked rows, the pruned layouts, the best layout next to
the 1-D one (N-way along the first dimension), and the search time.

    uv run python benchmarks/partitioning/memory_scaling.py [--image-size 256,256,256] [--json results.json]
    uv run python benchmarks/partitioning/memory_scaling.py --layout-search unet3d:512,512,512:64 \
        --json benchmarks/results/layout_search.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common import parsing, sizes

os.environ.setdefault("JAX_PLATFORMS", "cpu")
GIB = 2**30
VARIANTS = (("float32", False), ("bfloat16", False), ("bfloat16", True))


def _device_count(argv: list[str]) -> int:
    """Enough virtual devices for the largest N asked for (XLA reads this when JAX starts)."""
    counts = [16]
    for index, value in enumerate(argv[:-1]):
        if value == "--layout-search":
            counts += parsing.parse_list(argv[index + 1].split(":")[2], int, "--layout-search")
    return max(counts)


os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_device_count(sys.argv)}"  # before JAX starts

from trainer.models import unet  # noqa: E402
from trainer.plan import compiled_step, layout_search, plan_text  # noqa: E402


def _unet(model: str) -> dict:
    """The UNet these results were measured with: the default before the space-to-depth stem (`unet.PLAIN_SETTINGS`)."""
    return dict(unet.PLAIN_SETTINGS) if model.startswith("unet") else {}


def run_layout_search(cases: list[str], output: str | None) -> None:
    """Every layout of each N, ranked; results are written after each case, so a long run keeps what finished."""
    results = []
    for case in cases:
        model, size_text, counts_text = case.split(":")
        size = parsing.parse_list(size_text, int, "size")
        overrides = {"batch_size": 1, **({"image_size": size_text} if len(size) == 2 else {})}  # batch 1, as above
        config = compiled_step.plan_config(model, overrides={**_unet(model), **overrides})
        shape = compiled_step.example_shape(config, size)
        for count in parsing.parse_list(counts_text, int, "partitions"):
            started = time.perf_counter()
            search = layout_search.search(config, shape, [count], log=lambda line: print(line, flush=True))[0]
            seconds = time.perf_counter() - started
            best = search.rows[0]
            one_d = next((r for r in search.rows if r.input_partition_dims == compiled_step.default_partition_dims(
                count, len(shape) + 1)), None)
            print(f"\n{model} {list(size)} N={count}: {len(search.rows)} layouts compiled, {len(search.pruned)} pruned, "
                  f"{seconds:.0f} s")
            print("\n".join(plan_text.table([search], "ranked:")), flush=True)
            results.append({"model": model, "image_size": list(size), "partitions": count,
                            "search_seconds": round(seconds, 1), "pruned": [list(d) for d, _ in search.pruned],
                            "best": best.to_json(), "one_d": one_d.to_json() if one_d else None,
                            "rows": [r.to_json() for r in search.rows]})
            if output:
                with open(output, "w") as file:
                    json.dump(results, file, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", default="256,256,256")
    parser.add_argument("--partitions", default="1,2,4,8,16")
    parser.add_argument("--device-memory", default="16GiB")
    parser.add_argument("--retinanet-size", default="2560,2560")
    parser.add_argument("--retinanet-partitions", default="1,4,8")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--layout-search", action="append", metavar="MODEL:SIZE:N[,N]",
                        help="rank every layout instead, e.g. unet3d:512,512,512:64 (repeatable)")
    args = parser.parse_args()
    if args.layout_search:
        run_layout_search(args.layout_search, args.json)
        return
    limit = sizes.parse_bytes(args.device_memory)
    runs = [("unet3d", args.image_size, args.partitions, precision, remat) for precision, remat in VARIANTS]
    runs.append(("retinanet", args.retinanet_size, args.retinanet_partitions, "float32", False))
    results = []
    for model, size_text, counts_text, precision, remat in runs:
        size = parsing.parse_list(size_text, int, "size")
        counts = list(parsing.parse_list(counts_text, int, "--partitions"))
        started = time.perf_counter()
        config = compiled_step.plan_config(model, overrides={**_unet(model), "precision": precision, "remat": remat,
                                                            "batch_size": 1,
                                                            **({"image_size": size_text} if len(size) == 2 else {})})
        rows = layout_search.plan(config, compiled_step.example_shape(config, size), counts, device_memory=limit)
        label = precision + (" + remat" if remat else "")
        print(f"\n{model} {list(size)}, {label} ({time.perf_counter() - started:.0f} s to compile {len(rows)} steps)")
        print(f"{'N':>3} {'activations GiB':>16} {'total GiB':>10} {'E(N)':>6} {'all-gathers':>11} {'halo MiB':>9} fits")
        for r in rows:
            print(f"{r.partitions:>3} {r.temp_bytes / GIB:>16.3f} {r.total_bytes / GIB:>10.3f} {r.efficiency:>6.3f} "
                  f"{r.activation_all_gathers:>11} {r.halo_bytes / 2**20:>9.1f} {'yes' if r.fits else 'no'}")
        smallest = next((r.partitions for r in rows if r.fits), None)
        print(f"smallest N that fits {args.device_memory}: {smallest}")
        results.append({"model": model, "image_size": size, "precision": precision, "remat": remat,
                         "smallest_fitting_partitions": smallest, "device_memory": args.device_memory,
                         "rows": [{**r.__dict__, "input_partition_dims": list(r.input_partition_dims)} for r in rows]})
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
