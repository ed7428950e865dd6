"""The one parser for comma lists, which every command, component and setting reads its lists with, and for
settings given as text (`--set key=value`) or as KFP's numbers, read as the type their dataclass declares.

Partition dims (`1,4,1,1,1`), spacings (`1.7,1.7,2.25`), windows, shapes,
image sizes, partition counts and class names are all written the same way, so
they are all read here; a caller that must say more (a fixed length, its own
error type) checks or catches what this returns.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterable, Mapping

EXAMPLES = {int: "1,4,1,1,1", float: "1.0,1.0,2.5", str: "liver,kidney"}
# The shape of each list setting, for the sentence that shows how to write it (else its kind's `EXAMPLES`).
SETTING_EXAMPLES = {"patch_size": "128,128,128", "partition.input_partition_dims": "1,4,1,1,1",
                    "partition.label_partition_dims": "1,4,1,1,1", "augmentation.mirror_axes": "0,1,2",
                    "image_size": "512,512"}


def parse_list(text: str | None, kind: type = int, name: str = "value", example: str | None = None) -> tuple | None:
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
        ValueError: a part is not a `kind`; the message names `name` (the option as the user typed it) and shows
            `example` (a list of the option's own shape; default: one of `kind`).
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
                         f"{example or EXAMPLES.get(kind, EXAMPLES[float])}.") from None


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """`["model.num_levels=5", "steps=100"]` (`--set` flags) -> `{"model.num_levels": "5", "steps": "100"}`."""
    settings = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"--set {pair!r} is not key=value; write it like --set model.num_levels=5.")
        settings[key.strip()] = value.strip()
    return settings


def flatten(settings: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested mappings as dotted keys: `{"model": {"num_levels": 5}}` -> `{"model.num_levels": 5}`."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def typed(value, hint, name: str, what: str = "train override", given: str | None = None):
    """`value` (text, or a number as KFP passes it) as the type `hint` declares; None, "none" -> None if allowed.

    A text setting that cannot be None (`model.stem`, `model.normalization`) keeps "none" as its value. Errors
    name the setting as `{what} {name}`, or, with `given` (the option as the user typed it), `{given}: {name}`.

    >>> typed("nan", float, "learning_rate", given="--set learning_rate=nan")
    Traceback (most recent call last):
    ValueError: --set learning_rate=nan: learning_rate must be a finite number, got 'nan'; give a number such as 0.5.
    """
    setting = f"{given}: {name}" if given else f"{what} {name}"
    is_union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    options = [o for o in (typing.get_args(hint) if is_union else (hint,)) if o is not type(None)]
    optional = is_union and type(None) in typing.get_args(hint)
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        if optional:
            return None
        if not (value.strip() and options == [str]):  # a text setting's "none" is a choice: model.stem=none
            raise ValueError(f"{setting} needs a value.")
    kind = options[0] if options else str
    if typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        item = args[0] if args else int
        typed_as = given and (given.partition("=")[0] if given.startswith("--set ") else given.partition(" ")[0])
        parsed = parse_list(value, item, typed_as or name, SETTING_EXAMPLES.get(name)) if isinstance(value, str) \
            else tuple(value)
        return [typed(v, item, f"{name}[{i}]", what, given) for i, v in enumerate(parsed)]
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{setting} is true or false, got {value!r}.")
    if kind is int:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{setting} must be a whole number, got {value!r}.") from None
        if not math.isfinite(number):  # round(nan) would raise from inside the sentence below
            raise ValueError(f"{setting} must be a whole number, got {value!r}.")
        if not number.is_integer():
            raise ValueError(f"{setting} must be a whole number, got {value}; write it like {round(number)}.")
        return int(number)
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{setting} must be a number, got {value!r}.") from None
        if not math.isfinite(number):  # nan passes every `<` a range check makes, and inf overflows what it scales
            raise ValueError(f"{setting} must be a finite number, got {value!r}; give a number such as 0.5.")
        return number
    return value if not isinstance(value, str) else value.strip()
