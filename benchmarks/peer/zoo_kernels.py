"""The zoo's networks compiled for a GPU without one, their convolutions classified (`hlo_kernels.py`), per precision.

    uv run --group cuda python benchmarks/peer/zoo_kernels.py --target h100x1 --size 32 \\
        --json benchmarks/results/hlo_kernels_h100x1.json [--set kernels.norm=fused] [--published]

compiles fullres's training step (batch 1) of each of the zoo's six networks (`tests/trainer/zoo/`, their `tiny`
configuration unless `--published`) for the target, float32 and bfloat16, with JAX's CUDA plug-in (the `cuda`
group; nothing runs), and prints one table per network and precision: each convolution's layer kind, direction and
how the GPU runs it, with the layout changes and converts beside it (docs/speed.md). `--set` (repeatable) compiles
with those training settings; a setting this checkout does not know is a row's error. `--candidates` compiles each
network and precision once per named kernel candidate (`CANDIDATES`, the `kernels.*` settings of
`trainer/parallel/kernels.py`; `peer_bench.py --candidates` times the same names) and gives each row its per-device
bytes against the `xla` row's (`bytes_vs_xla`) and its op counts (`hlo_kernels.op_counts`):

    uv run --group cuda python benchmarks/peer/zoo_kernels.py --networks nnunet_plain --published \\
        --candidates xla,taps,subpixel,fused,conv_nhwc,all --json /tmp/candidates.json
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hlo_kernels  # noqa: E402


ZOO = ("nnunet_plain", "nnunet_resenc", "monai_unet", "segresnet", "mednext", "swin_unetr")
# The kernel candidates by name: the `--set` strings of each (XLA's own ops: `xla`).
CANDIDATES = {
    "xla": [],
    "taps": ["kernels.conv_weight_grad=taps"],
    "taps_unmerged": ["kernels.conv_weight_grad=taps", "kernels.xla_flags=taps_unmerged"],
    "float32_grad": ["kernels.conv_weight_grad=float32"],
    "subpixel": ["kernels.conv_transpose=subpixel"],
    "padded": ["kernels.conv_transpose=padded"],
    "fused": ["kernels.norm=fused"],
    "conv_nhwc": ["kernels.xla_flags=conv_nhwc"],
    "cudnn_fusion": ["kernels.xla_flags=cudnn_fusion"],
    "exhaustive_gemm": ["kernels.xla_flags=exhaustive_gemm"],
    "cublas_gemm": ["kernels.xla_flags=cublas_gemm"],
    "conv_nhwc_fusion": ["kernels.xla_flags=conv_nhwc_fusion"],
    "all3": ["kernels.conv_weight_grad=taps", "kernels.conv_transpose=subpixel", "kernels.norm=fused"],
    "all": ["kernels.conv_weight_grad=taps", "kernels.conv_transpose=subpixel", "kernels.norm=fused",
            "kernels.xla_flags=conv_nhwc"],
}


def candidate_sets(names: str) -> list[tuple[str, list[str]]]:
    """[(name, its --set strings)] of comma-separated `CANDIDATES` names; an unknown name is refused."""
    found = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in CANDIDATES:
            raise ValueError(f"--candidates: {name!r} is not a candidate; use names of {', '.join(CANDIDATES)}")
        found.append((name, list(CANDIDATES[name])))
    return found


def with_deltas(rows: list[dict]) -> list[dict]:
    """Each row's per-device bytes ÷ the `xla` candidate's row of the same network and precision (`bytes_vs_xla`)."""
    base = {(r["network"], r["precision"]): r.get("bytes_per_device") for r in rows if r.get("candidate") == "xla"}
    for row in rows:
        reference = base.get((row["network"], row["precision"]))
        if reference and row.get("bytes_per_device"):
            row["bytes_vs_xla"] = round(row["bytes_per_device"] / reference, 4)
    return rows


ENTRY_OVERHEAD = ("parameter", "get-tuple-element", "bitcast", "tuple", "constant")


def kernels_per_kind(table: dict) -> dict:
    """{layer kind: entry instructions that launch work (fusions, custom calls, copies, ...)}."""
    return dict(collections.Counter(r["kind"] for r in table["instructions"].values() if r["op"] not in ENTRY_OVERHEAD))


def compile_zoo(network: str, precision: str, size: int, published: bool, sets: list[str], target: str) -> dict:
    """The zoo network's training step (`fullres train`'s, batch 1) compiled for `target`; its classification."""
    from common import parsing
    from trainer.plan import compiled_step, target_compile, targets

    config = compiled_step.plan_config(f"tests/trainer/zoo/{network}.py:{'build' if published else 'tiny'}", "default",
                                       {"precision": precision, "augmentation": "none", **parsing.parse_settings(sets)})
    builder = compiled_step.StepBuilder(config, compiled_step.example_shape(config, (size,) * 3))
    devices = targets.devices(targets.parse(target))[:1]
    started = time.perf_counter()
    with target_compile.compile_only(target != "cpu"):
        compiled, _ = builder.compile_layout((1,) * 5, devices)
    seconds = round(time.perf_counter() - started, 1)
    text = compiled.as_text()
    memory = compiled.memory_analysis()
    total = None if memory is None else int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                            + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    table = hlo_kernels.classify(text, hlo_kernels.layer_classes(builder.model))
    return {"network": network, "precision": precision, "size": size, "sets": sets, "target": target,
            "compile_seconds": seconds, "bytes_per_device": total,
            "temp_bytes": None if memory is None else int(memory.temp_size_in_bytes), "ops": hlo_kernels.op_counts(text),
            "convolutions": table["convolutions"], "kernels_per_kind": kernels_per_kind(table)}


def markdown(result: dict) -> str:
    """One table per network and precision: convolutions by kind, direction and how the GPU runs them."""
    lines = []
    for entry in result["rows"]:
        title = f"{label(entry)} {entry['precision']} {entry['size']}³ {' '.join(entry['sets'])}".rstrip()
        if entry.get("error"):
            lines += ["", f"{title}: not compiled: {entry['error']}"]
            continue
        lines += ["", title, "",
                  "| layer kind | direction | runs as | count | layout changes: activations / weights | "
                  "converts: activations / weights |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['kind']} | {r['direction']} | {r['implementation']} | {r['count']} | "
                  f"{r['activation_layout_changes']} / {r['weight_layout_changes']} | {r['activation_converts']} / "
                  f"{r['weight_converts']} |" for r in entry["convolutions"]]
        lines.append("kernels per layer kind: " + ", ".join(f"{k} {n}" for k, n in
                                                            sorted(entry["kernels_per_kind"].items(), key=lambda x: -x[1])))
    return "\n".join(lines)


def label(entry: dict) -> str:
    """'nnunet_plain', or 'nnunet_plain taps' for a `--candidates` row."""
    return f"{entry['network']} {entry['candidate']}" if entry.get("candidate") else entry["network"]


def summary(result: dict) -> str:
    """One line per network and precision: convolutions by direction and by how they run, what sits beside them."""
    lines = ["| network | precision | convolutions: forward / input grad / weight grad | cuDNN calls | XLA-native "
             "(convolution or fusion) | layout changes beside: activations / weights | converts beside: activations "
             "/ weights | kernels: convolution layers / normalization / all | bytes per device (÷ xla) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for entry in result["rows"]:
        if entry.get("error"):
            lines.append(f"| {label(entry)} | {entry['precision']} | {entry['error'][:150]} | | | | | | |")
            continue
        rows = entry["convolutions"]

        def total(field, keep=lambda r: True, rows=rows):
            return sum(r[field] for r in rows if keep(r))

        directions = " / ".join(str(total("count", lambda r, d=d: r["direction"] == d))
                                for d in ("forward", "input gradient", "weight gradient"))
        kinds = entry["kernels_per_kind"]
        convolution = sum(n for k, n in kinds.items() if k.startswith("Conv"))
        norm = sum(n for k, n in kinds.items() if "Normalization" in k)
        ratio = f" ({entry['bytes_vs_xla']:.3f})" if entry.get("bytes_vs_xla") else ""
        mib = f"{entry['bytes_per_device'] / 2**20:.1f} MiB{ratio}" if entry.get("bytes_per_device") else ""
        lines.append(f"| {label(entry)} | {entry['precision']} | {directions} | "
                     f"{total('count', lambda r: r['implementation'].startswith('cuDNN'))} | "
                     f"{total('count', lambda r: r['implementation'].startswith('XLA'))} | "
                     f"{total('activation_layout_changes')} / {total('weight_layout_changes')} | "
                     f"{total('activation_converts')} / {total('weight_converts')} | "
                     f"{convolution} / {norm} / {sum(kinds.values())} | {mib} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="h100x1", help="a GPU target of `fullres plan --target` (or cpu)")
    parser.add_argument("--networks", default=",".join(ZOO), help="zoo networks (tests/trainer/zoo/)")
    parser.add_argument("--precisions", default="float32,bfloat16")
    parser.add_argument("--size", type=int, default=32, help="voxels a side (batch 1)")
    parser.add_argument("--published", action="store_true", help="the published configurations, not `tiny`")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="a training setting, e.g. kernels.norm=fused")
    parser.add_argument("--candidates", help=f"names of the kernel candidates, comma-separated: {', '.join(CANDIDATES)}")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    try:
        candidates = candidate_sets(args.candidates) if args.candidates else [(None, [])]
    except ValueError as error:
        parser.error(str(error))
    if os.path.exists(args.json) and "hlo_kernels" not in open(args.json, encoding="utf-8").read(200):
        parser.error(f"--json {args.json} exists and is not this tool's result; name a new file")
    repository = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, repository)
    os.chdir(repository)  # the zoo's sources are given relative to the checkout
    import jax

    jax.config.update("jax_platforms", "cpu")  # the target's devices come from its topology, not this machine
    import trainer  # noqa: F401  (Keras on JAX)

    rows = []
    for network in args.networks.split(","):
        for precision in args.precisions.split(","):
            for candidate, extra in candidates:
                sets = [*args.sets, *extra]
                try:
                    row = compile_zoo(network, precision, args.size, args.published, sets, args.target)
                except Exception as error:  # noqa: BLE001  (an unknown setting, a size the network cannot take, the
                    # target compiler failing on the network: the row says which, and the next one compiles)
                    first = (str(error).strip().splitlines() or [""])[0][:400]
                    row = {"network": network, "precision": precision, "size": args.size, "sets": sets,
                           "error": f"{type(error).__name__}: {first}", "convolutions": [], "kernels_per_kind": {}}
                rows.append({**row, **({"candidate": candidate} if candidate else {})})
                print(markdown({"rows": rows[-1:]}), flush=True)
                with open(args.json, "w", encoding="utf-8") as file:  # after every row: a stopped run keeps its rows
                    json.dump({"about": "hlo_kernels: convolutions by how the GPU compiler runs them",
                               "target": args.target, "rows": with_deltas(rows)}, file, indent=1)
    print(summary({"rows": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
