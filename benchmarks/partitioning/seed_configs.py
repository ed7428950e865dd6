"""The seed's two configurations, answered by the TPU compiler: does each fit, per-core memory, halo.

The 3D UNet at 256³ split 16 ways along depth, and RetinaNet (ResNet-18 + FPN,
float32, batch 1) at 2560² split 8×8 = 64 ways, each compiled by libtpu for TPU
v5e and v4 slices of that many chips (`fullres plan --target`'s code path:
`layout_measure.compile_layout`). The UNet twice: the default model (TPU-shaped:
space-to-depth stem, 3 levels of 128-512 filters) and the plain UNet that was
the default before it (4 levels of 16-128 filters, no stem; `unet.PLAIN_SETTINGS`),
both with instance norm, float32, batch 1. One JSON line per compile (`unet`:
which of the two):

    uv run --group tpu python benchmarks/partitioning/seed_configs.py > benchmarks/results/seed_configs.jsonl
    uv run --group tpu python benchmarks/partitioning/seed_configs.py v4:2x2x4      # only the jobs on that target
    uv run --group tpu python benchmarks/partitioning/seed_configs.py default       # only the default UNet's

Each TPU compile of the plain UNet or RetinaNet takes 6-30 minutes on a 2-core machine and ~9 GiB of host
memory; the default UNet's, 2-3 minutes.
The same answers on the command line:

    fullres plan --model unet3d --image-size 256,256,256 --partitions 16 --target v5e:4x4
    fullres plan --model retinanet --image-size 2560,2560 --input-partition-dims 1,8,8,1 --target v5e:8x8
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

from trainer.models import unet  # noqa: E402
from trainer.plan import compiled_step, layout_measure, targets  # noqa: E402

JOBS = [  # model, size, input_partition_dims, target, UNet ("default" or "plain")
    ("unet3d", (256, 256, 256), "1,16,1,1,1", "v5e:4x4", "plain"),
    ("retinanet", (2560, 2560), "1,8,8,1", "v5e:8x8", None),
    ("unet3d", (256, 256, 256), "1,16,1,1,1", "v4:2x2x4", "plain"),
    ("retinanet", (2560, 2560), "1,8,8,1", "v4:4x4x4", None),
    ("unet3d", (256, 256, 256), "1,16,1,1,1", "v5e:4x4", "default"),
    ("unet3d", (256, 256, 256), "1,16,1,1,1", "v4:2x2x4", "default"),
]


def main() -> None:
    only = sys.argv[1:]  # targets, or "default" / "plain" for one UNet
    for model, size, dims, target, variant in JOBS:
        if only and not {target, variant} & set(only):
            continue
        settings = {"partition.input_partition_dims": dims, **(unet.PLAIN_SETTINGS if variant == "plain" else {})}
        if model == "retinanet":
            settings["image_size"] = ",".join(map(str, size))
        config = compiled_step.plan_config(model, "default", settings)
        shape = compiled_step.example_shape(config, size)
        started = time.time()
        try:
            out = layout_measure.compile_layout(config, shape, targets.parse(target)).to_json()
        except Exception as error:  # noqa: BLE001  (recorded, and the next job still runs)
            out = {"error": str(error)[:2000]}
        out.update(model=model, size=list(size), dims=dims, target=target, wall_seconds=round(time.time() - started, 1),
                   **({"unet": variant} if variant else {}))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
