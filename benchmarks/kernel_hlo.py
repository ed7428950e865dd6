"""What each kernel candidate (`trainer/parallel/kernels.py`) does to the compiled training step, without a device.

For every candidate (`--set kernels.FIELD=VALUE`) against XLA's own ops: the step `fullres train` runs
(`compiled_step.StepBuilder`: `config.resolve`, `program.build_model`, `jit_step`) of a zoo network, compiled for

* `h100x1` (JAX's CUDA plug-in, the `cuda` group): how its convolutions are computed, counted in the optimized
  HLO: cuDNN custom calls by kind (forward, input gradient, weight gradient; `__cudnn$conv...`), convolutions XLA
  computes itself (`convolution(` left in the HLO), matrix products (cuBLAS calls, Triton GEMM fusions, `dot(`),
  transposes, converts and fusions; the per-device bytes of `memory_analysis()`;
* `v5e:2x2` (libtpu, the `tpu` group), split 2 ways and 2×2: per-device bytes and activation all-gathers.

Deviceless: the GPU compiler autotunes nothing here, so which cuDNN algorithm runs and how long it takes are the
GPU call's to measure (docs/layers.md, "Kernels fullres computes itself").

    uv sync --group cuda --group tpu
    nice -n 10 uv run python benchmarks/kernel_hlo.py [--size 32] [--targets h100x1,v5e:2x2]   # results/kernel_hlo.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

NETWORK = "tests/trainer/zoo/nnunet_plain.py:build"
CANDIDATES = {
    "xla": {},
    "taps": {"kernels.conv_weight_grad": "taps"},
    "subpixel": {"kernels.conv_transpose": "subpixel"},
    "fused": {"kernels.norm": "fused"},
    "all three": {"kernels.conv_weight_grad": "taps", "kernels.conv_transpose": "subpixel", "kernels.norm": "fused"},
    "taps unmerged": {"kernels.conv_weight_grad": "taps", "kernels.xla_flags": "taps_unmerged"},
    "flags conv_nhwc": {"kernels.xla_flags": "conv_nhwc"},
    "flags cudnn_fusion": {"kernels.xla_flags": "cudnn_fusion"},
    "flags exhaustive_gemm": {"kernels.xla_flags": "exhaustive_gemm"},
    "flags cublas_gemm": {"kernels.xla_flags": "cublas_gemm"},
    "flags conv_nhwc_fusion": {"kernels.xla_flags": "conv_nhwc_fusion"},
}
_CUDNN = re.compile(r'custom_call_target="__cudnn\$(conv[A-Za-z]*)"')


def gpu_counts(text: str) -> dict:
    """Counts of the ops that say how a compiled GPU step computes its convolutions (optimized HLO text)."""
    counts = {"cudnn": {}}
    for kind in _CUDNN.findall(text):
        counts["cudnn"][kind] = counts["cudnn"].get(kind, 0) + 1
    counts["xla_convolutions"] = len(re.findall(r"= \S+ convolution\(", text))
    counts["cublas_gemms"] = len(re.findall(r'custom_call_target="__cublas\$', text))
    counts["triton_gemm_fusions"] = len(re.findall(r'"kind":"__triton\w*gemm\w*"', text))  # nested gemm too
    # Operands laid side by side for one product (XLA merges the per-tap products into one GEMM over an im2col).
    counts["concatenates"] = len(re.findall(r"= \S+ concatenate\(", text))
    counts["dots"] = len(re.findall(r"= \S+ dot\(", text))
    counts["transposes"] = len(re.findall(r"= \S+ transpose\(", text))
    counts["converts"] = len(re.findall(r"= \S+ convert\(", text))
    counts["fusions"] = len(re.findall(r"= \S+ fusion\(", text))
    return counts


def compile_point(overrides: dict, precision: str, size: int, dims: tuple[int, ...], devices) -> dict:
    from trainer.plan import compiled_step, gathers, target_compile

    config = compiled_step.plan_config(NETWORK, "default", {**overrides, "precision": precision, "batch_size": 1, "augment": False,
                                                            "partition.input_partition_dims": ",".join(map(str, dims))})
    shape = compiled_step.example_shape(config, (size,) * 3)
    started = time.perf_counter()
    with target_compile.compile_only():
        builder = compiled_step.StepBuilder(config, shape)
        lowered, _ = builder.lower(dims, devices[:math.prod(dims)])
        compiled = lowered.compile()
    text = compiled.as_text()
    memory = compiled.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
             - memory.alias_size_in_bytes)
    found = gathers.of_step(lowered, compiled, 1, gathers.weight_shapes(builder.state))
    return {"bytes_per_device": int(total), "activation_all_gathers": len(found),
            "all_gathers": len(re.findall(r"= \S+ all-gather(?:-start)?\(", text)),
            "compile_seconds": round(time.perf_counter() - started, 1), "text": text}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--targets", default="h100x1,v5e:2x2")
    parser.add_argument("--precisions", default="float32,bfloat16")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="names in CANDIDATES, comma-separated")
    parser.add_argument("--hlo-dir", default=None, help="also write each compiled step's HLO text here")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "kernel_hlo.json"))
    args = parser.parse_args(argv)
    os.environ["JAX_PLATFORMS"] = "cpu"  # the model is built on the CPU; the targets' devices are compile-only (as plan)
    from trainer.plan import targets

    rows = []
    for target in args.targets.split(","):
        devices = targets.devices(targets.parse(target))
        layouts = [(1, 1, 1, 1, 1)] if target.startswith("h100") else [(1, 2, 1, 1, 1), (1, 2, 2, 1, 1)]
        for dims in layouts:
            for precision in args.precisions.split(","):
                for name in args.candidates.split(","):
                    overrides = CANDIDATES[name]
                    if name.startswith("flags") and not target.startswith("h100"):
                        continue  # GPU options: the TPU compiler ignores them
                    point = compile_point(overrides, precision, args.size, dims, devices)
                    text = point.pop("text")
                    if args.hlo_dir:
                        os.makedirs(args.hlo_dir, exist_ok=True)
                        label = f"{target}_{'x'.join(map(str, dims))}_{precision}_{name.replace(' ', '_')}.hlo"
                        with open(os.path.join(args.hlo_dir, label), "w", encoding="utf-8") as handle:
                            handle.write(text)
                    row = {"target": target, "dims": list(dims), "precision": precision, "candidate": name,
                           "settings": overrides, **point}
                    if target.startswith("h100"):
                        row["hlo"] = gpu_counts(text)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    import importlib.metadata

    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "network": NETWORK, "size": args.size, "batch": 1,
              "versions": {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "keras")},
              "rows": rows}
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
