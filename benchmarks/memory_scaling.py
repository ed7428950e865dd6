"""Per-device memory scaling of the partitioned training step (the table behind `fullres plan`).

For the 3D UNet at 256³ (batch 1, default model config) it compiles the step
ahead of time for N = 1, 2, 4, 8, 16 cores, N-way along depth, in float32,
bfloat16 and bfloat16 with rematerialization; for RetinaNet (ResNet-18 + FPN)
at 2560² for N = 1, 4, 8 along height, in float32. On virtual CPU devices;
nothing runs. It reports activation memory, total per device, E(N) = M(1) / (N · M(N)),
activation all-gathers and halo bytes, and the smallest N that fits 16 GiB.

    uv run python benchmarks/memory_scaling.py [--image-size 256,256,256] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=16"  # before JAX starts
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from trainer import memory_plan  # noqa: E402

GIB = 2**30
VARIANTS = (("float32", False), ("bfloat16", False), ("bfloat16", True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", default="256,256,256")
    parser.add_argument("--partitions", default="1,2,4,8,16")
    parser.add_argument("--device-memory", default="16GiB")
    parser.add_argument("--retinanet-size", default="2560,2560")
    parser.add_argument("--retinanet-partitions", default="1,4,8")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    limit = memory_plan.parse_bytes(args.device_memory)
    runs = [("unet3d", args.image_size, args.partitions, precision, remat) for precision, remat in VARIANTS]
    runs.append(("retinanet", args.retinanet_size, args.retinanet_partitions, "float32", False))
    results = []
    for model, size_text, counts_text, precision, remat in runs:
        size = tuple(int(v) for v in size_text.split(","))
        counts = [int(v) for v in counts_text.split(",")]
        started = time.perf_counter()
        rows = memory_plan.plan(model, size, counts, precision=precision, remat=remat, device_memory=limit)
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
