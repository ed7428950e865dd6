"""Activation all-gathers in a compiled step, each named by the Keras layer it comes from, with its bytes per device.

XLA's SPMD partitioner splits every layer it can. One it cannot (a layer that
flattens the spatial axes into a dense one, a transposed convolution's
gradient, ...) it computes on the whole activation, gathered onto every device
of the replica: the run still works, but each device then holds what the split
was meant to divide, and the plan's memory was a promise the run breaks. In the
compiled HLO such an op is an `all-gather` whose result is an activation: the
per-replica batch in front, rank 2 or more, and not the shape of a weight (XLA
may gather a weight or its optimizer state when it splits their update; those
are replicated anyway). JAX writes the Keras layer path into each op's metadata
(`op_name="jit(train_step)/transpose(jvp(my_net))/up1/conv_general_dilated"`),
so every gather is reported by the layer that causes it.

`fullres train` reads the step it compiles and refuses to start on any gather
unless `--allow-gathers` is given; `fullres plan` lists them per layout.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

from common import sizes

_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8,
                "s16": 2, "u16": 2}
_INSTRUCTION = re.compile(r"=\s*(?P<result>.*?)\s+all-gather(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_WRAPPER = re.compile(r"[A-Za-z_]+\((.*)\)")  # jvp(...), transpose(...), remat(...), vmap(...)


@dataclasses.dataclass(frozen=True)
class Gather:
    """One all-gather of an activation in a compiled step."""

    layer: str  # the Keras layer path, e.g. "res_net_backbone/conv1_pad"; "" where the op lies outside every layer
    shape: tuple[int, ...]  # the gathered (whole) array, which every device of the group holds
    dtype: str
    bytes: int  # per device
    op_name: str  # the HLO op's metadata, for the curious

    def describe(self) -> str:
        """'f32[1,32,32,8], 32.0 KiB per device'."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}], {sizes.human_bytes(self.bytes)} per device"


def layer_path(op_name: str) -> str:
    """The Keras layer path in an HLO op's `op_name`: transformations unwrapped, jitted functions and the primitive
    dropped.

    >>> layer_path("jit(train_step)/transpose(jvp(res_net_backbone))/conv1_pad/jit(_pad)/pad")
    'res_net_backbone/conv1_pad'
    >>> layer_path("jit(train_step)/jvp(dense)/dot_general")
    'dense'
    """
    names = []
    for part in _top_level_parts(op_name):
        if part.startswith("jit(") or part.startswith("pjit("):
            continue  # a jitted function's boundary (the step itself, a helper), not a layer
        while (wrapped := _WRAPPER.fullmatch(part)) is not None:
            part = wrapped.group(1)
        names.extend(name for name in _top_level_parts(part) if name)
    return "/".join(names[:-1])  # the last name is the primitive (reshape, dot_general, conv_general_dilated, ...)


def _top_level_parts(text: str) -> list[str]:
    """`text` split at the slashes outside parentheses."""
    parts, depth, current = [], 0, ""
    for character in text:
        depth += (character == "(") - (character == ")")
        if character == "/" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    return [*parts, current]


def all_gathers(hlo_text: str) -> list[Gather]:
    """Every all-gather in a compiled module's HLO text, with the array it gathers and its layer."""
    found = []
    for line in hlo_text.splitlines():
        instruction = _INSTRUCTION.search(line)
        if instruction is None:
            continue
        arrays = _ARRAY.findall(instruction.group("result"))
        if instruction.group("start"):  # async: (operands..., results...)
            arrays = arrays[len(arrays) // 2:]
        op_name = _OP_NAME.search(line)
        name = op_name.group(1) if op_name else ""
        for dtype, dims in arrays:
            shape = tuple(int(d) for d in dims.split(",") if d)
            found.append(Gather(layer_path(name) if name else "", shape, dtype,
                                math.prod(shape) * _DTYPE_BYTES.get(dtype, 4), name))
    return found


def activation_gathers(hlo_text: str, replica_batch: int, weight_shapes: Iterable[Sequence[int]] = ()) -> list[Gather]:
    """The all-gathers of activations: the per-replica batch in front, rank 2 or more, not a weight's shape.

    Args:
        hlo_text: the compiled step's HLO (`compiled.as_text()`).
        replica_batch: examples per replica (the global batch / replicas).
        weight_shapes: the shapes of the step's weights and optimizer state (`weight_shapes`).
    """
    weights = {tuple(shape) for shape in weight_shapes}
    return [g for g in all_gathers(hlo_text)
            if len(g.shape) >= 2 and g.shape[0] == replica_batch and g.shape not in weights]


def of_step(lowered, compiled, replica_batch: int, weight_shapes: Iterable[Sequence[int]] = ()) -> list[Gather]:
    """`activation_gathers` of a compiled step, named by the layers of the program `lowered` holds.

    JAX's persistent compilation cache keys a program without its op metadata (unless
    `jax_compilation_cache_include_metadata_in_key`), so an executable it serves carries the layer names of
    whichever program of the same structure compiled first. Where gathers are found, the step is compiled once
    more, with the cache off and an explicit compiler option (which also passes JAX's in-memory caches), and the
    gathers are named from that.
    """
    from trainer.plan import target_compile

    found = activation_gathers(compiled.as_text(), replica_batch, weight_shapes)
    if found:
        with target_compile.compile_only():  # the persistent cache off while it compiles
            fresh = lowered.compile(compiler_options={"xla_embed_ir_in_executable": False})  # XLA's default value
        found = activation_gathers(fresh.as_text(), replica_batch, weight_shapes)
    return found


def weight_shapes(state) -> set[tuple[int, ...]]:
    """The shapes of every array of a `TrainState` (or its `jax.ShapeDtypeStruct`s)."""
    import jax

    return {tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(state)}


def by_layer(found: Sequence[Gather]) -> list[tuple[str, int, Gather]]:
    """(layer, how many gathers, the largest) per layer, the largest first."""
    layers: dict[str, list[Gather]] = {}
    for gather in found:
        layers.setdefault(gather.layer, []).append(gather)
    rows = [(layer, len(items), max(items, key=lambda g: g.bytes)) for layer, items in layers.items()]
    return sorted(rows, key=lambda row: -row[2].bytes)


def summary(found: Sequence[Gather]) -> str:
    """'layer up1 (2 all-gathers, the largest f32[1,32,32,8], 32.0 KiB per device); layer ...'."""
    return "; ".join(f"{f'layer {layer}' if layer else 'outside any layer'} ({count} all-gather"
                     f"{'s' if count > 1 else ''}, {'the largest ' if count > 1 else ''}{largest.describe()})"
                     for layer, count, largest in by_layer(found))


class GathersRefused(ValueError):
    """The compiled step all-gathers activations and the run did not allow it; the message names the layers."""


def refuse(found: Sequence[Gather], dims: Sequence[int]) -> None:
    """Refuses to train a step that gathers activations, naming each layer and its bytes per device.

    Raises:
        GathersRefused: `found` is not empty.
    """
    if found:
        raise GathersRefused(
            f"the training step split {','.join(map(str, dims))} all-gathers whole activations onto every device, "
            f"which the split was meant to divide: {summary(found)}; rewrite those layers to work on each device's "
            "block of the volume (as convolutions, pooling and elementwise ops do), or pass --allow-gathers to train "
            "anyway (fullres plan lists the gathers of every layout).")
