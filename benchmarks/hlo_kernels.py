"""Where a training step's time goes, per layer kind: its convolutions in the GPU compiler's optimized HLO (issue 49).

For every convolution of the step (forward, input gradient, weight gradient) the compiled program says how the GPU
runs it: a cuDNN call (`custom-call` to `__cudnn$convForward`, `convBiasActivationForward`, `convBackwardInput`,
`convBackwardFilter`), a cuDNN or XLA fusion that holds a `convolution`, or XLA's own `convolution`. Around each,
what the compiler added to feed it: layout changes (a `transpose` or `copy`, alone or inside the fusion producing an
operand or consuming the result) and precision changes (`convert`, bfloat16 ↔ float32).

Direction: JAX writes `transpose(jvp(LAYER))` into the metadata of the backward pass; a backward convolution whose
result has the layer's kernel's dimensions (in any order) is its weight gradient, the other its input gradient. cuDNN's own
names are not the direction: a transposed convolution's forward pass is `convBackwardInput` and both of its
gradients are `convForward`. Layer kinds are the Keras classes (Conv3D, Conv3DTranspose, ...) of the model.

    uv run --group cuda python benchmarks/hlo_kernels.py --target h100x1 --size 32 --json F [--set kernels.norm=fused]

compiles the zoo's six networks (their `tiny` configuration unless `--published`) for the target, float32 and
bfloat16, without a GPU, and prints one table per network and precision. On a GPU `peer_rows.py` joins the same
classification with JAX's profiler trace (`kernel_times`): the time of each kind.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sys
import time


_COMPUTATION = re.compile(r"^(ENTRY )?%(?P<name>[\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<type>\([^=]*?\)|\S+) (?P<op>[\w\-]+)\((?P<rest>.*)$")
_REFERENCE = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply)=%([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")
_LAYER = re.compile(r"(?:^|[/(])([\w.\-]+)\)*/(?:[^/]*/)*?conv_general_dilated")
LAYOUT_OPS, PRECISION_OPS = ("transpose", "copy"), ("convert",)


def parse(text: str) -> tuple[dict, dict, str]:
    """(instructions by name, instruction names by computation, the entry computation's name) of HLO text."""
    instructions, computations, current, entry = {}, collections.defaultdict(list), None, None
    for line in text.splitlines():
        found = _COMPUTATION.match(line)
        if found:
            current = found["name"]
            entry = current if line.startswith("ENTRY") else entry
            continue
        found = _INSTRUCTION.match(line)
        if found and current is not None:
            rest = found["rest"]
            head = rest.split("metadata=")[0]
            calls = _CALLS.findall(head)
            operands = [r for r in _REFERENCE.findall(head.split(")")[0]) if r not in calls]  # `op(%a, %b), attrs`
            target = _TARGET.search(rest)
            op_name = _OP_NAME.search(rest)
            instructions[found["name"]] = {"op": found["op"], "type": found["type"], "operands": operands,
                                           "calls": calls, "target": target[1] if target else None,
                                           "op_name": op_name[1] if op_name else "", "computation": current,
                                           "kind": "cudnn" if '"__cudnn$fusion"' in rest else None}
            computations[current].append(found["name"])
    return instructions, computations, entry


def _ops_inside(name: str, instructions: dict, computations: dict, seen=None) -> set[str]:
    """Every op in `name`'s called computations (fusions, nested), and its own."""
    seen = set() if seen is None else seen
    found = {instructions[name]["op"]}
    for called in instructions[name]["calls"]:
        if called in seen:
            continue
        seen.add(called)
        for inner in computations.get(called, []):
            found |= _ops_inside(inner, instructions, computations, seen)
    return found


def _dimensions(type_text: str) -> tuple[int, ...]:
    """An instruction's (first) array result's dimensions, sorted (cuDNN's layout orders them its own way)."""
    found = _ARRAY.search(type_text)
    return tuple(sorted(int(d) for d in found[2].split(",") if d)) if found else ()


def layer_of(op_name: str, layers: dict) -> str | None:
    """The model's layer whose name the op's metadata path holds (the innermost), or None."""
    parts = [p for p in re.split(r"[/()]", op_name) if p]
    return next((p for p in reversed(parts) if p in layers), None)


def implementation(name: str, instructions: dict, computations: dict) -> str | None:
    """How an entry instruction runs a convolution: 'cuDNN <call>', 'cuDNN fusion', 'XLA fusion', 'XLA convolution'."""
    instruction = instructions[name]
    if instruction["op"] == "custom-call" and (instruction["target"] or "").startswith("__cudnn$conv"):
        return "cuDNN " + instruction["target"].split("$", 1)[1]
    if instruction["op"] == "convolution":
        return "XLA convolution"
    if instruction["op"] == "fusion" and "convolution" in _ops_inside(name, instructions, computations):
        return "cuDNN fusion" if instruction["kind"] == "cudnn" else "XLA fusion"
    return None


CHANGES = ("activation_layout_changes", "weight_layout_changes", "activation_converts", "weight_converts")
_PASS_THROUGH = ("bitcast", "get-tuple-element")


def around(name: str, kernel, instructions: dict, computations: dict, users: dict) -> dict:
    """The kernels feeding a convolution and those reading its result (through bitcasts and tuple elements) that
    change a layout (`transpose`, `copy`) or a precision (`convert`): of the layer's weights (a kernel-shaped array,
    small) or of an activation (a pass over the full tensor)."""
    feeding, seen = list(instructions[name]["operands"]), set()
    while any(instructions.get(n, {}).get("op") in _PASS_THROUGH for n in feeding):
        feeding = [o for n in feeding for o in (instructions[n]["operands"] if instructions.get(n, {}).get("op")
                                                in _PASS_THROUGH else [n])]
    reading, frontier = [], [name]
    while frontier:
        current = frontier.pop()
        for user in users[current]:
            if user in seen:
                continue
            seen.add(user)
            (frontier if instructions[user]["op"] in _PASS_THROUGH else reading).append(user)
    counts = dict.fromkeys(CHANGES, 0)
    for neighbour in feeding + reading:
        if neighbour not in instructions:
            continue
        ops = _ops_inside(neighbour, instructions, computations)
        what = "weight" if kernel is not None and _dimensions(instructions[neighbour]["type"]) == kernel else "activation"
        counts[f"{what}_layout_changes"] += bool(ops & set(LAYOUT_OPS))
        counts[f"{what}_converts"] += bool(ops & set(PRECISION_OPS))
    return counts


def classify(text: str, layers: dict) -> dict:
    """Every entry instruction of a compiled step's HLO: its layer kind, and for convolutions direction and kernel.

    Args:
        text: `compiled.as_text()` of the step.
        layers: {layer name: (class name, its kernel's sorted dimensions or None)} (`layer_classes`).

    Returns:
        {"instructions": {name: {"kind", "layer", "op", "implementation", "direction", *CHANGES}},
         "convolutions": [rows per (kind, direction, implementation) with counts]}.
    """
    instructions, computations, entry = parse(text)
    users = collections.defaultdict(list)
    for name in computations.get(entry, []):
        for operand in instructions[name]["operands"]:
            users[operand].append(name)
    out = {}
    for name in computations.get(entry, []):
        instruction = instructions[name]
        layer = layer_of(instruction["op_name"], layers)
        kind, kernel = layers[layer] if layer else ("outside layers", None)
        how = implementation(name, instructions, computations)
        row = {"kind": kind, "layer": layer, "implementation": how, "op": instruction["op"]}
        if how:
            backward = "transpose(" in instruction["op_name"]
            weight = instruction["target"] == "__cudnn$convBackwardFilter" or (
                backward and kernel is not None and _dimensions(instruction["type"]) == kernel)
            row["direction"] = "weight gradient" if weight else "input gradient" if backward else "forward"
            row.update(around(name, kernel, instructions, computations, users))
        out[name] = row
    groups = collections.defaultdict(lambda: collections.Counter())
    for row in out.values():
        if row["implementation"]:
            groups[(row["kind"], row["direction"], row["implementation"])].update(
                {"count": 1, **{field: row[field] for field in CHANGES}})
    convolutions = [{"kind": k, "direction": d, "implementation": i, **{f: counts[f] for f in ("count", *CHANGES)}}
                    for (k, d, i), counts in sorted(groups.items())]
    return {"instructions": out, "convolutions": convolutions}


def layer_classes(model) -> dict:
    """{layer name: (Keras class name, its kernel's sorted dimensions or None)} of `model`, nested layers included."""
    found = {}

    def visit(layer):
        kernel = getattr(layer, "kernel", None)
        found[layer.name] = (type(layer).__name__, None if kernel is None else tuple(sorted(kernel.shape)))
        for inner in getattr(layer, "layers", []) or []:
            visit(inner)

    for layer in model.layers:
        visit(layer)
    return found


def kernel_times(trace_path: str, table: dict) -> dict:
    """Device time per (kind, direction, implementation) from a perfetto trace (JAX's profiler), by each kernel's
    `hlo_op`; kernels without one, or of an op the table does not hold, are counted apart."""
    with gzip.open(trace_path, "rt", encoding="utf-8") as file:
        events = json.load(file)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "gpu" in str(e.get("args", {}).get("name", "")).lower()}
    by_kind, by_kernel, total, unmatched = collections.Counter(), collections.Counter(), 0.0, 0.0
    for event in events:
        if event.get("ph") != "X" or event.get("pid") not in devices:
            continue
        seconds = float(event.get("dur", 0)) * 1e-6  # microseconds
        args = event.get("args", {})
        op = str(args.get("hlo_op") or args.get("long_name") or "").split(":")[0].strip().lstrip("%")
        row = table["instructions"].get(op)
        total += seconds
        by_kernel[event.get("name", "?")[:120]] += seconds
        if row is None:
            unmatched += seconds
            continue
        by_kind[" · ".join([row["kind"], row.get("direction") or row["op"], row.get("implementation") or ""])] += seconds
    return {"device_seconds": total, "unmatched_seconds": unmatched,
            "by_kind": [{"what": k, "seconds": s} for k, s in by_kind.most_common()],
            "top_kernels": [{"kernel": k, "seconds": s} for k, s in by_kernel.most_common(25)]}


ZOO = ("nnunet_plain", "nnunet_resenc", "monai_unet", "segresnet", "mednext", "swin_unetr")
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
        compiled, _ = builder.compile((1,) * 5, devices)
    table = classify(compiled.as_text(), layer_classes(builder.model))
    return {"network": network, "precision": precision, "size": size, "sets": sets, "target": target,
            "compile_seconds": round(time.perf_counter() - started, 1), "convolutions": table["convolutions"],
            "kernels_per_kind": kernels_per_kind(table)}


def markdown(result: dict) -> str:
    """One table per network and precision: convolutions by kind, direction and how the GPU runs them."""
    lines = []
    for entry in result["rows"]:
        lines += ["", f"{entry['network']} {entry['precision']} {entry['size']}³ {' '.join(entry['sets'])}".rstrip(), "",
                  "| layer kind | direction | runs as | count | layout changes: activations / weights | "
                  "converts: activations / weights |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['kind']} | {r['direction']} | {r['implementation']} | {r['count']} | "
                  f"{r['activation_layout_changes']} / {r['weight_layout_changes']} | {r['activation_converts']} / "
                  f"{r['weight_converts']} |" for r in entry["convolutions"]]
        lines.append("kernels per layer kind: " + ", ".join(f"{k} {n}" for k, n in
                                                            sorted(entry["kernels_per_kind"].items(), key=lambda x: -x[1])))
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="h100x1", help="a GPU target of `fullres plan --target` (or cpu)")
    parser.add_argument("--networks", default=",".join(ZOO), help="zoo networks (tests/trainer/zoo/)")
    parser.add_argument("--precisions", default="float32,bfloat16")
    parser.add_argument("--size", type=int, default=32, help="voxels a side (batch 1)")
    parser.add_argument("--published", action="store_true", help="the published configurations, not `tiny`")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="a training setting, e.g. kernels.norm=fused")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repository)
    os.chdir(repository)  # the zoo's sources are given relative to the checkout
    import jax

    jax.config.update("jax_platforms", "cpu")  # the target's devices come from its topology, not this machine
    import trainer  # noqa: F401  (Keras on JAX)

    rows = []
    for network in args.networks.split(","):
        for precision in args.precisions.split(","):
            try:
                rows.append(compile_zoo(network, precision, args.size, args.published, args.sets, args.target))
            except ValueError as error:  # a setting this checkout does not know, a size the network cannot take
                rows.append({"network": network, "precision": precision, "size": args.size, "sets": args.sets,
                             "error": str(error), "convolutions": [], "kernels_per_kind": {}})
            print(markdown({"rows": rows[-1:]}), flush=True)
    with open(args.json, "w", encoding="utf-8") as file:
        json.dump({"about": "hlo_kernels: convolutions by how the GPU compiler runs them", "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
