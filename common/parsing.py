"""The one parser for comma lists, which every command, component and setting reads its lists with.

Partition dims (`1,4,1,1,1`), spacings (`1.7,1.7,2.25`), windows, shapes,
image sizes, partition counts and class names are all written the same way, so
they are all read here; a caller that must say more (a fixed length, its own
error type) checks or catches what this returns.
"""

from __future__ import annotations

EXAMPLES = {int: "1,4,1,1,1", float: "1.0,1.0,2.5", str: "liver,kidney"}


def parse_list(text: str | None, kind: type = int, name: str = "value") -> tuple | None:
    """`"1,4,1,1,1"`, `"[1, 4, 1, 1, 1]"` -> a tuple of `kind`; None, `""` or `"none"` -> None.

    Spaces never belong inside a number, so they are dropped from numbers; names
    (`kind=str`) keep their inner spaces and lose the outer ones. Empty parts are
    skipped.

    Example:
        >>> parse_list("[1, 4, 1, 1, 1]")
        (1, 4, 1, 1, 1)
        >>> parse_list("1.7,1.7,2.25", float)
        (1.7, 1.7, 2.25)
        >>> parse_list(" left kidney, liver", str)
        ('left kidney', 'liver')

    Raises:
        ValueError: a part is not a `kind`; the message names `name`.
    """
    if text is None:
        return None
    cleaned = text.strip().strip("[]()")
    if cleaned.lower() in ("", "none"):
        return None
    parts = (part.strip() if kind is str else part.replace(" ", "") for part in cleaned.split(","))
    try:
        return tuple(kind(part) for part in parts if part)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a comma-separated list of {kind.__name__}s; write it like "
                         f"{EXAMPLES.get(kind, EXAMPLES[float])}.") from None
