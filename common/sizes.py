"""Byte counts for people, and back: `16GiB` on the command line, `1.50 GiB` in a table or a sentence."""

from __future__ import annotations

import re

# Units as people write them, case aside: decimal (kB, MB, GB, TB), binary (KiB, Ki, MiB, Mi, GiB, Gi, ...) and
# the bare letter, which memory sizes mean as binary (`16G` of a GPU is 16 GiB), as `ulimit` and Java's `-Xmx` read it.
_SCALE = {"": 1, "b": 1, "byte": 1, "bytes": 1,
          **{f"{letter}b": 1000**power for power, letter in enumerate("kmgtp", 1)},
          **{f"{letter}{tail}": 1024**power for power, letter in enumerate("kmgtp", 1) for tail in ("", "i", "ib")}}
_SIZE = re.compile(r"\s*(?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*(?P<unit>[a-z]*)\s*",
                   re.IGNORECASE)
LARGEST = 2**63 - 1  # bytes: what a signed 64-bit count (NumPy's, XLA's) holds


def parse_bytes(text: str, name: str = "--device-memory") -> int:
    """'16GiB', '16Gi', '16 GB', '16G', '512MiB', '64kB', '1e9' -> bytes (units in any case; GB is 10^9, GiB, Gi
    and G are 2^30).

    Example:
        >>> parse_bytes("512MiB"), parse_bytes("3Gi"), parse_bytes("2 gb"), parse_bytes("1.5e3")
        (536870912, 3221225472, 2000000000, 1500)
        >>> parse_bytes("1.2.3", "--max-decoded-bytes")
        Traceback (most recent call last):
        ValueError: --max-decoded-bytes '1.2.3' is not a size; write e.g. 16GiB or 32GB.

    Raises:
        ValueError: `text` is not a size, or more bytes than can be counted; the sentence names `name`.
    """
    match = _SIZE.fullmatch(text)
    scale = _SCALE.get(match["unit"].lower()) if match else None
    if scale is None:
        raise ValueError(f"{name} {text!r} is not a size; write e.g. 16GiB or 32GB.")
    count = float(match["number"]) * scale  # inf where the number is beyond a float (1e999)
    if not count <= LARGEST:
        raise ValueError(f"{name} {text!r} is more bytes than any machine has; write e.g. 16GiB or 32GB.")
    return int(count)


def human_bytes(count: int, smallest: str = "KiB") -> str:
    """Bytes as GiB, MiB or, below 1 MiB (where tiny test volumes live), KiB; `smallest="MiB"` never goes below MiB.

    Example:
        >>> human_bytes(3 * 2**29), human_bytes(64 * 2**10), human_bytes(64 * 2**10, smallest="MiB")
        ('1.50 GiB', '64.0 KiB', '0.1 MiB')
    """
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    if count >= 2**20 or smallest == "MiB":
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**10:.1f} KiB"



def cache_over_memory(needed: int, available: int | None) -> str:
    """The warning `--input-cache on` adds where its `needed` bytes are more than the `available` memory, else ''.

    >>> cache_over_memory(3 * 2**30, 2**30)
    '; warning: that is more than the 1.00 GiB of memory available, so the host will swap or the process be killed as the cache fills; pass --input-cache auto, which reads the records every step where they do not fit'
    >>> cache_over_memory(2**20, 2**30), cache_over_memory(2**20, None)
    ('', '')
    """
    if available is None or needed <= available:
        return ""
    return (f"; warning: that is more than the {human_bytes(available)} of memory available, so the host will swap or "
            "the process be killed as the cache fills; pass --input-cache auto, which reads the records every step "
            "where they do not fit")
