"""`fullres plan --target v5e` (a generation, no topology) or `--target h100` (GPUs, no count): the smallest slice
of that generation that trains `--image-size` whole, with its layout, and the next larger slice.

The slices are those the generation is rented in (`targets.TpuGeneration.slices`, the 3-D generations' cubes from
4x4x4 up; GPUs 1, 2, 4 and 8 per host, then hosts of 8), up to `MAX_DEVICES` devices, in order of their devices.
One replica spans each slice's devices; whether the volume fits there is `largest_volume.SizeProbe`'s answer, and
`edge_search.find_edge` walks the slices from the smallest up (more devices never need more bytes per device for the
same volume).
"""

from __future__ import annotations

import re

from trainer.plan import targets

MAX_DEVICES = 256  # the largest slice searched (the CPU pre-filter poses as that many devices)
_CUBES = ("4x4x4", "4x4x8", "4x8x8", "8x8x8")


def generation(name: str) -> str | None:
    """The generation or GPU model `name` names alone (`v5e`, `h100`), or None where `name` is a whole target
    (`v5e:2x2`, `h100x8`, `cpu`), which `targets.parse` reads.

    Raises:
        ValueError: `name` is neither a whole target's form nor a generation fullres knows (one sentence).

    Example:
        >>> generation("v5e"), generation("H100"), generation("v5e:2x2"), generation("h100x8")
        ('v5e', 'h100', None, None)
    """
    text = name.strip().lower()
    if text == "cpu" or ":" in text or re.fullmatch(r"[a-z][a-z0-9]*?x[0-9]+(x[0-9]+)?", text):
        return None
    if text in targets.TPU_GENERATIONS or text in targets.GPU_MODELS:
        return text
    raise ValueError(f"--target {name!r} is not a generation fullres knows; name one ("
                     f"{', '.join([*targets.TPU_GENERATIONS, *targets.GPU_MODELS])}) to find its smallest slice, or "
                     f"a whole target: {targets.KNOWN}.")


def slices(kind: str) -> list[targets.Target]:
    """The slices of a TPU generation or the GPU counts of a model, fewest devices first, up to `MAX_DEVICES`.

    Example:
        >>> [t.name for t in slices("h100")]
        ['h100x1', 'h100x2', 'h100x4', 'h100x8', 'h100x8x2', 'h100x8x4', 'h100x8x8', 'h100x8x16', 'h100x8x32']
        >>> [t.name for t in slices("v5p")][:6]
        ['v5p:2x2x1', 'v5p:2x2x2', 'v5p:2x2x4', 'v5p:2x4x4', 'v5p:4x4x4', 'v5p:4x4x8']
    """
    if kind in targets.GPU_MODELS:
        names = [f"{kind}x{n}" for n in (1, 2, 4, 8)] + [f"{kind}x8x{h}" for h in (2, 4, 8, 16, 32)]
    else:
        spec = targets.TPU_GENERATIONS[kind]
        names = [f"{kind}:{shape}" for shape in (*spec.slices, *(_CUBES if spec.topology_rank == 3 else ()))]
    found = [targets.parse(name) for name in names]
    return sorted((t for t in found if t.device_count <= MAX_DEVICES), key=lambda t: t.device_count)
