"""Where a training step's time goes, per layer kind: its convolutions in the GPU compiler's optimized HLO.

For every convolution of the step (forward, input gradient, weight gradient) the compiled program says how the GPU
runs it: a cuDNN call (`custom-call` to `__cudnn$convForward`, `convBiasActivationForward`, `convBackwardInput`,
`convBackwardFilter`), a cuDNN or XLA fusion that holds a `convolution`, or XLA's own `convolution`. Around each,
what the compiler added to feed it: layout changes (a `transpose` or `copy`, alone or inside the fusion producing an
operand or consuming the result) and precision changes (`convert`, bfloat16 ↔ float32).

Direction: JAX writes `transpose(jvp(LAYER))` into the metadata of the backward pass; a backward convolution whose
result has the layer's kernel's dimensions (in any order) is its weight gradient, the other its input gradient. cuDNN's own
names are not the direction: a transposed convolution's forward pass is `convBackwardInput` and both of its
gradients are `convForward`. Layer kinds are the Keras classes (Conv3D, Conv3DTranspose, ...) of the model.

`benchmarks/peer/zoo_kernels.py` compiles the zoo's networks for a GPU without one and prints this classification per
network and precision; on a GPU `peer_rows.py` joins it with JAX's profiler trace (`kernel_times`): the time of
each kind.
"""

from __future__ import annotations

import collections
import gzip
import json
import re


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


_CUDNN_CALL = re.compile(r'custom_call_target="__cudnn\$(conv[A-Za-z]*)"')


def op_counts(text: str) -> dict:
    """Counts over the whole optimized HLO (fusions' insides included) of what says how a step computes its
    convolutions and products: cuDNN calls by kind, XLA's own `convolution`s, cuBLAS calls, Triton GEMM fusions,
    `dot`s, `concatenate`s (XLA's dot merger lays the per-tap products of `kernels.conv_weight_grad=taps` side by
    side over an im2col), transposes, converts, fusions and all-gathers."""
    def count(op):
        return len(re.findall(rf"= \S+ {op}\(", text))

    cudnn = collections.Counter(_CUDNN_CALL.findall(text))
    return {"cudnn": dict(sorted(cudnn.items())), "xla_convolutions": count("convolution"),
            "cublas_gemms": len(re.findall(r'custom_call_target="__cublas\$', text)),
            "triton_gemm_fusions": len(re.findall(r'"kind":"__triton\w*gemm\w*"', text)),
            "dots": count("dot"), "concatenates": count("concatenate"), "transposes": count("transpose"),
            "converts": count("convert"), "fusions": count("fusion"), "all_gathers": count(r"all-gather(?:-start)?")}


def kernel_times(trace_path: str, table: dict) -> dict:
    """Device time per (kind, direction, implementation) from JAX's perfetto trace of some steps.

    On a GPU the trace has, per device, lines ("threads") for its streams, whose events are kernels (their HLO op in
    `args.hlo_op`), and an "XLA Ops" line whose events are named by the HLO op. Kernels on the streams are summed
    where they name their op, else the "XLA Ops" line; every line's name is kept in the result (`lines`), so that a
    trace of another shape can be read by hand. Time the table cannot place is `unmatched_seconds`.
    """
    with gzip.open(trace_path, "rt", encoding="utf-8") as file:
        events = json.load(file)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    processes = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    devices = {pid for pid, name in processes.items() if "/device:" in name and "CPU" not in name}
    threads = {(e["pid"], e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in devices}
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid") in devices]
    streams = [e for e in spans if threads.get((e["pid"], e.get("tid")), "").lower().startswith("stream")]
    if streams and any(e.get("args", {}).get("hlo_op") for e in streams):
        timed = [(str(e["args"].get("hlo_op", "")), e) for e in streams]
    else:
        timed = [(str(e.get("name", "")), e) for e in spans if threads.get((e["pid"], e.get("tid"))) == "XLA Ops"]
    by_kind, by_kernel, total, unmatched = collections.Counter(), collections.Counter(), 0.0, 0.0
    for op, event in timed:
        seconds = float(event.get("dur", 0)) * 1e-6  # microseconds
        row = table["instructions"].get(op.split(" ")[0].lstrip("%"))
        total += seconds
        by_kernel[str(event.get("name", "?"))[:120]] += seconds
        if row is None:
            unmatched += seconds
            continue
        by_kind[" · ".join([row["kind"], row.get("direction") or row["op"], row.get("implementation") or ""])] += seconds
    return {"device_seconds": total, "unmatched_seconds": unmatched, "lines": sorted(set(threads.values())),
            "by_kind": [{"what": k, "seconds": s} for k, s in by_kind.most_common()],
            "top_kernels": [{"kernel": k, "seconds": s} for k, s in by_kernel.most_common(25)]}

