"""Global attention in a plan: the ring's traffic apart from the halo, and each device's block of attention scores.

A split step's `collective-permute`s are of two kinds. XLA's SPMD partitioner
inserts halo exchanges for the convolutions, pooling and flips it splits; their
op metadata names the op they serve (`.../conv_general_dilated`, `.../rev`).
`ring_attention` passes keys and values (and, in the backward pass, their
gradients) round the devices that hold the tokens by `jax.lax.ppermute`, whose
metadata ends in that primitive (`.../global_attention/shard_map/ppermute`).
`permute_bytes` counts the two apart, per device per step.

The score bytes are not read from the compiled HLO (XLA fuses the scores into
other ops and their buffers carry no layer): `ring_attention.recording` notes
each ring's block as the step is traced, B · heads · (T/p) · (S/p) · the scores'
bytes a value (docs/layers.md), and `scores` keeps the largest block, which is
what a device holds at once (each block is recomputed in the backward pass).
"""

from __future__ import annotations

import math
import re

from common import parsing

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}

# `%name = f32[1,2,3]{...} collective-permute(` or the async `-start` form, whose result is a tuple.
_PERMUTE = re.compile(r"=\s*\(?([a-z0-9]+)\[([0-9,]*)\][^ ]*\)?.*?\scollective-permute(-start)?\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
RING_PRIMITIVE = "ppermute"  # the last component of a ring permute's op_name


def is_ring(line: str) -> bool:
    """True where an HLO instruction's op metadata ends in `jax.lax.ppermute` (the ring's), not an op XLA split."""
    name = _OP_NAME.search(line)
    return name is not None and name.group(1).rsplit("/", 1)[-1] == RING_PRIMITIVE


def permute_bytes(hlo_text: str) -> tuple[int, int]:
    """(halo bytes, ring bytes) per device per step: every collective-permute's result, by `is_ring`."""
    halo = ring = 0
    for line in hlo_text.splitlines():
        match = _PERMUTE.search(line)
        if match is None:
            continue
        shape = parsing.parse_list(match.group(2), int, "HLO shape") or ()
        size = math.prod(shape) * DTYPE_BYTES.get(match.group(1), 4)
        if is_ring(line):
            ring += size
        else:
            halo += size
    return halo, ring


def scores(blocks: list[dict]) -> tuple[int, int]:
    """(the largest block of scores per device, the same layer's scores unsplit) from `ring_attention.recording`'s
    blocks; (0, 0) without attention split as a ring."""
    if not blocks:
        return 0, 0
    largest = max(blocks, key=lambda block: block["score_bytes"])
    return largest["score_bytes"], largest["unsplit_score_bytes"]


def has_attention(rows) -> bool:
    """True where any row of a plan splits attention as a ring (its table then shows the ring's columns)."""
    return any(row.ring_bytes or row.attention_score_bytes for row in rows)


HEADER = f" {'ring/step':>10} {'scores':>10}"


def cells(row) -> str:
    """The ring's columns of a table row: its traffic per step and the largest block of scores per device."""
    from common import sizes

    return f" {sizes.human_bytes(row.ring_bytes):>10} {sizes.human_bytes(row.attention_score_bytes):>10}"
