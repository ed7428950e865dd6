"""The training step of nnU-Net's PlainConvUNet (the zoo's port) with each kernel candidate, timed on this machine's
first device: one call on a GPU times every candidate of `trainer/parallel/kernels.py` against XLA's own ops.

The step is `fullres train`'s (`compiled_step.plan_config` → `program.build_model` → `jit_step`, with the run's
`kernels` setting), on synthetic int16 images and uint8 labels (`device_check_rows.Step`'s batch), as
`benchmarks/device_check_rows.py` times its rows: median over `--steps` after `--warmup`, the allocator's peak.
Issue #49's row: 128³, batch 2; PyTorch eager 104 ms (float32) and 77 ms (bfloat16), fullres 292 and 586 ms.

    uv run python benchmarks/kernel_timing.py                                # on a GPU: results/kernel_timing.json
    uv run python benchmarks/kernel_timing.py --size 32 --batch 1 --steps 2 --warmup 1 --output /tmp/k.json  # CPU

A CPU's times say nothing about a GPU's: the CPU form only checks that the command runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import device_check_rows  # noqa: E402
import kernel_hlo  # noqa: E402  (its CANDIDATES: the same names in both results)


class Step(device_check_rows.Step):
    """`device_check_rows.Step` for the zoo's PlainConvUNet with `settings` (a candidate's, the precision...)."""

    def __init__(self, settings: dict):  # noqa: D107  (device_check_rows.Step.__init__ with another config)
        import jax

        from trainer.engine import program
        from trainer.parallel import device_mesh
        from trainer.plan import compiled_step
        from trainer.tasks import registry

        self.config = compiled_step.plan_config(kernel_hlo.NETWORK, "default", {**settings, "augment": False})
        self.task = registry.make_task(self.config)
        self.distribution = device_mesh.make_distribution(self.config.partition, jax.devices()[:1])
        with self.distribution.scope():
            self.model, self.optimizer, _, self.state = program.build_model(self.config, self.task, self.config.steps)
        self.jitted = program.jit_step(self.task, self.model, self.optimizer, self.distribution, self.state, 5,
                                       self.config.kernels)


def time_candidate(settings: dict, size: int, warmup: int, steps: int) -> dict:
    import jax
    import numpy as np

    from trainer.engine import placement

    step = Step(settings)
    compiled, arguments, image_shape, seconds = step.compile(size)
    state = placement.place_state(step.state, step.distribution)
    inputs, labels = step.synthetic_batch(arguments, image_shape)
    times = []
    for number in range(warmup + steps):
        started = time.perf_counter()
        state, metrics = compiled(state, inputs, labels, jax.device_put(np.int32(number), arguments[3].sharding))
        jax.block_until_ready((state, metrics))
        if number >= warmup:
            times.append(time.perf_counter() - started)
    return {"median_step_seconds": statistics.median(times), "steps": len(times), "compile_seconds": round(seconds, 2),
            "loss": float(metrics["loss"]), **device_check_rows.device_figures(jax.devices()[0]),
            "device_compiler": device_check_rows.compiler_figures(compiled)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precisions", default="bfloat16,float32")
    parser.add_argument("--candidates", default="xla,taps,subpixel,fused,all three,flags conv_nhwc")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "kernel_timing.json"))
    args = parser.parse_args(argv)
    import jax

    rows = []
    for precision in args.precisions.split(","):
        for name in args.candidates.split(","):
            settings = {**kernel_hlo.CANDIDATES[name], "precision": precision, "batch_size": args.batch}
            row = {"candidate": name, "precision": precision, "settings": kernel_hlo.CANDIDATES[name]}
            try:
                row.update(status="ok", **time_candidate(settings, args.size, args.warmup, args.steps))
            except Exception as error:  # noqa: BLE001  (one candidate out of memory or refused: the others still run)
                row.update(status="failed", error=str(error).splitlines()[0][:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
            result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "device": jax.devices()[0].device_kind, "network": kernel_hlo.NETWORK, "size": args.size,
                      "batch": args.batch, "rows": rows}
            with open(args.output, "w", encoding="utf-8") as handle:  # after every row: a cut run keeps its rows
                json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
