"""Sizes in bytes, read from people and written for them: one parser, one formatter."""

from __future__ import annotations

import re


def parse_bytes(text: str) -> int:
    """'16GiB', '16 GB', '512MiB', '1e9' -> bytes.

    >>> parse_bytes("16GiB"), parse_bytes("1.5 GB")
    (17179869184, 1500000000)
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?i?B?)?\s*", text)
    if not match:
        raise ValueError(f"--device-memory {text!r} is not a size; write e.g. 16GiB or 32GB.")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    scale = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(number * scale[unit])


def human_bytes(count: int) -> str:
    """Bytes as GiB, MiB or (below 1 MiB, where tiny test volumes live) KiB."""
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"
