"""A config check's sentence as the user can act on it: naming the option they typed, not the dataclass field.

A config dataclass checks its fields in `__post_init__` and names them as fields
(`TrainConfig.patch_size must be 3 positive sizes ...`), which is right for
the Python API. On the command line the user typed `--patch-size 0,1` or
`--set patch_size=0,1`: `trainer.config.resolve` builds the config through
`built`, which names that instead, and adds a list setting's own example
(`parsing.SETTING_EXAMPLES`).

Example:
    >>> def check(values):
    ...     raise ValueError(f"TrainConfig.patch_size must be 3 positive sizes, got {values['patch_size']}.")
    >>> built(check, {"patch_size": [0, 1]}, {"patch_size": "--patch-size 0,1"})
    Traceback (most recent call last):
    ValueError: --patch-size 0,1: patch_size must be 3 positive sizes, got [0, 1]; write it like 128,128,128.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from common import parsing

_FIELD = re.compile(r"[A-Z]\w*Config\.(\w+) (.*)", re.S)  # `TrainConfig.patch_size must ...`


def built(build: Callable[[dict], object], values: dict, given: Mapping[str, str]):
    """`build(values)`; its `ValueError` about a field the user gave (`given`: key -> as typed) names the option.

    Raises:
        ValueError: `build`'s, reworded where `given` says how the field was typed.
    """
    try:
        return build(values)
    except ValueError as error:
        match = _FIELD.fullmatch(str(error))
        if match is None or match.group(1) not in given:
            raise
        key, rest = match.groups()
        example = parsing.SETTING_EXAMPLES.get(key)
        tail = f"; write it like {example}" if example and "write it like" not in rest else ""
        raise ValueError(f"{given[key]}: {key} {rest.rstrip('.')}{tail}.") from None
