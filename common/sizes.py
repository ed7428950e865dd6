"""Byte counts for people, and back: `16GiB` on the command line, `1.50 GiB` in a table or a sentence."""

from __future__ import annotations

import re

_SCALE = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str, name: str = "--device-memory") -> int:
    """'16GiB', '16 GB', '512MiB', '1e9' -> bytes.

    Example:
        >>> parse_bytes("512MiB")
        536870912

    Raises:
        ValueError: `text` is not a size; the sentence names `name`.
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?i?B?)?\s*", text)
    if not match:
        raise ValueError(f"{name} {text!r} is not a size; write e.g. 16GiB or 32GB.")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    return int(number * _SCALE[unit])


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
