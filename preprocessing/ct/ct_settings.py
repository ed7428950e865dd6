"""The CT grid settings as text (`--spacing 1.5,1.5,2`, `--param window=-160,240`): one reader for every caller.

`fullres preprocess ct`, the KFP preprocess component and the pipelines'
parameter check read spacing, window and shape with `grid_from_text`, and
`ct_transforms.CtPreprocessConfig` checks the values with `check_grid`: a bad
value gets the same sentence wherever it is given, naming it as its caller
names it (`--spacing` on the command line, `--param spacing` for a pipeline).
No imaging library is imported here, so a typo is refused before they load.

Example:
    >>> grid_from_text("1.5,1.5,2", "-160,240", None)
    {'spacing': (1.5, 1.5, 2.0), 'window': (-160.0, 240.0), 'shape': None}
    >>> grid_from_text("1,2", "-160,240", None, name=parameter_name)
    Traceback (most recent call last):
    ValueError: --param spacing '1,2' is not valid; write it like 1.0,1.0,2.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from common import parsing

EXAMPLES = {"spacing": "1.0,1.0,2.5", "window": "-160,240", "shape": "128,256,256"}
COUNTS = {"spacing": 3, "window": 2, "shape": 3}
KINDS = {"spacing": float, "window": float, "shape": int}


def option_name(field: str) -> str:
    """How the command line names a setting: `--spacing`."""
    return f"--{field.replace('_', '-')}"


def parameter_name(field: str) -> str:
    """How a pipeline run names a setting: `--param spacing`."""
    return f"--param {field}"


def parse(text: str | None, field: str, name: Callable[[str], str] = option_name) -> tuple | None:
    """`text` as the numbers of `field` (spacing, window or shape); None, "" or "none" -> None.

    Raises:
        ValueError: not that many numbers: one sentence with an example.
    """
    if text is None or text.strip().lower() in ("", "none"):
        return None
    try:
        values = parsing.parse_list(text, KINDS[field], name(field)) or ()
    except ValueError:
        values = ()
    if len(values) != COUNTS[field]:
        raise ValueError(f"{name(field)} {text!r} is not valid; write it like {EXAMPLES[field]}.")
    return values


def check(field: str, values, name: Callable[[str], str] = option_name) -> None:
    """The rule of one setting's values: positive finite spacing (x, y, z mm), a window LOW < HIGH (HU, always
    given), positive sizes (D, H, W); spacing and shape may be None (each case keeps its own).

    Raises:
        ValueError: one sentence naming the setting as `name` does.
    """
    shown = None if values is None else tuple(values)
    if field == "spacing" and values is not None and (
            len(values) != 3 or not all(math.isfinite(s) and s > 0 for s in values)):
        raise ValueError(f"{name(field)} needs three positive values X,Y,Z in mm, got {shown}.")
    if field == "window" and (values is None or len(values) != 2 or not values[0] < values[1]):
        raise ValueError(f"{name(field)} needs LOW,HIGH with LOW < HIGH, got {shown}.")
    if field == "shape" and values is not None and (len(values) != 3 or min(values) < 1):
        raise ValueError(f"{name(field)} needs three positive sizes D,H,W, got {shown}.")


def read(field: str, text: str | None, name: Callable[[str], str] = option_name) -> tuple | None:
    """One setting from its text, checked (`parse`, then `check`)."""
    values = parse(text, field, name)
    check(field, values, name)
    return values


def check_grid(spacing, window, shape, name: Callable[[str], str] = option_name) -> None:
    """`check` of each setting (what `CtPreprocessConfig` applies to its values)."""
    for field, values in (("spacing", spacing), ("window", window), ("shape", shape)):
        check(field, values, name)


def grid_from_text(spacing: str | None, window: str | None, shape: str | None,
                   name: Callable[[str], str] = option_name) -> dict:
    """`{"spacing", "window", "shape"}` read and checked (`CtPreprocessConfig` takes them as they are).

    Raises:
        ValueError: one sentence naming the setting as `name` does.
    """
    return {field: read(field, text, name) for field, text in (("spacing", spacing), ("window", window),
                                                                ("shape", shape))}
