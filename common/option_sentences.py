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
    """`build(values)`; its `ValueError` about a field the user gave (`given`: key, dotted or not -> as typed) names
    the option.

    >>> def check(values):
    ...     raise ValueError(f"UNetConfig.in_channels must be >= 1, got {values['model']['in_channels']}.")
    >>> built(check, {"model": {"in_channels": 0}}, {"model.in_channels": "--in-channels 0"})
    Traceback (most recent call last):
    ValueError: --in-channels 0: in_channels must be >= 1, got 0.

    Raises:
        ValueError: `build`'s, reworded where `given` says how the field was typed.
    """
    try:
        return build(values)
    except ValueError as error:
        match = _FIELD.fullmatch(str(error))
        field, rest = match.groups() if match else (None, "")
        # The setting by its dotted key (`model.in_channels` for `UNetConfig.in_channels`), where one given ends so.
        keys = [key for key in given if key.rpartition(".")[2] == field]
        if len(keys) != 1:
            raise
        example = parsing.SETTING_EXAMPLES.get(keys[0])
        tail = f"; write it like {example}" if example and "write it like" not in rest else ""
        raise ValueError(f"{given[keys[0]]}: {field} {rest.rstrip('.')}{tail}.") from None
