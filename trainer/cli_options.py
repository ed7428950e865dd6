"""The commands' option plumbing: virtual CPU devices set before JAX starts, and a command's options as given (for
the processes a `--local-processes` run starts, which must see what the user typed and nothing more).
"""

from __future__ import annotations

import os
import sys

import typer

from common import console


def jax_backend_started() -> bool:
    """True once XLA has created its devices; XLA_FLAGS are read then, not when JAX is imported."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # no public JAX API tells whether the backend has started

    return xla_bridge.backends_are_initialized()


def use_virtual_devices(count: int | None, least: int = 1) -> None:
    """Makes XLA present the CPU as `count` devices (must run before JAX is imported); 0 (where `least` is 0) or None:
    the devices present."""
    if count is not None and count < least:
        console.fail(f"--virtual-devices {count} is not a number of devices; pass {least} or more, or leave it out to "
                     "use the devices present.")
    if not count:
        return
    if jax_backend_started():
        console.fail("--virtual-devices must be applied before JAX starts; pass it on the command line, not from Python.")
    set_host_device_count(count)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def set_host_device_count(count: int) -> None:
    """Sets XLA's CPU device count (read when the backend starts; other platforms ignore it)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])


def options_without(context: typer.Context, *left_out: str) -> list[str]:
    """The command's options as given (defaults left out: a resume takes the run's), except `left_out`."""
    arguments = []
    given = console.given(context)
    for parameter in context.command.params:
        value = context.params.get(parameter.name)
        if parameter.name in left_out or value is None or parameter.name not in given:
            continue
        if parameter.is_flag:  # --a/--no-a as given; a lone flag (--continue-with-changes) only when set
            arguments += [parameter.opts[0]] if value else parameter.secondary_opts[:1]
        elif isinstance(value, (list, tuple)):
            arguments += [part for item in value for part in (parameter.opts[0], str(item))]
        else:
            arguments += [parameter.opts[0], str(value)]
    return arguments
