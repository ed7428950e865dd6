"""Compiling for a target's own compiler: the refusal that becomes a "needs X of Y" row, and the compile-only rules.

The step is the one `fullres train` compiles (`compiled_step.StepBuilder`: the
same `config.resolve`, `engine.program.build_model` and `jit_step`); only the
devices differ (`targets.devices`). The TPU compiler checks the program
against the chip's HBM while compiling and stops with RESOURCE_EXHAUSTED when
it does not fit: `layout_search.measure` turns that layout into a `Refusal` with the
bytes it needs and the bytes there are, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from common import sizes
from trainer.plan import targets


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A layout the target's compiler refused for memory (bytes per device, from the compiler's message)."""

    partitions: int
    input_partition_dims: tuple[int, ...]
    needed_bytes: int
    available_bytes: int
    compile_seconds: float = 0.0

    def describe(self) -> str:
        """'needs 17.25 GiB of 15.75 GiB per device', for the plan's table."""
        return f"needs {sizes.human_bytes(self.needed_bytes)} of {sizes.human_bytes(self.available_bytes)} per device"

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values["input_partition_dims"] = list(self.input_partition_dims)
        values["fits"] = False
        return values


def refusal(error: Exception, dims: tuple[int, ...], seconds: float) -> Refusal | None:
    """The `Refusal` a compiler error means, or None when it is not the compiler running out of memory."""
    found = targets.out_of_memory(str(error))
    return None if found is None else Refusal(math.prod(dims), tuple(dims), *found, round(seconds, 2))


@contextlib.contextmanager
def compile_only(active: bool = True):
    """While compiling for a target's devices (not this process's), JAX's persistent compilation cache is off.

    It would store executables no process here can load: reading one back
    fails with "PjRtCompiler must be constructed with a Client".
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if not active:
        yield
        return
    cached = jax.config.jax_enable_compilation_cache
    # JAX decides once per process whether to use the cache; resetting makes it decide again, now and after.
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)
        compilation_cache.reset_cache()
