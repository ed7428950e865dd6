"""One layout compiled by a target's own compiler: its per-device figures, or what it needs when the compiler refuses.

The step is the one `fullres train` compiles (`memory_plan._Builder`: the
same `config.resolve`, `train.build_model` and `train.jit_step`); only the
devices differ (`targets.devices`). The TPU compiler checks the program
against the chip's HBM while compiling and stops with RESOURCE_EXHAUSTED when
it does not fit: that layout becomes a `Refusal` with the bytes it needs and
the bytes there are, never a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import time

from trainer import memory_plan
from trainer.plan import targets


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A layout the target's compiler refused for memory (bytes per device, from the compiler's message)."""

    partitions: int
    input_partition_dims: tuple[int, ...]
    needed_bytes: int
    available_bytes: int
    compile_seconds: float = 0.0

    def describe(self, target: targets.Target) -> str:
        """'needs 17.25 GiB of 15.75 GiB per device' and the target, for the plan's table."""
        return (f"needs {memory_plan.human(self.needed_bytes)} of {memory_plan.human(self.available_bytes)} per "
                f"device: the {target.kind} compiler refuses it")

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values["input_partition_dims"] = list(self.input_partition_dims)
        values["fits"] = False
        return values


def measure(builder, dims: tuple[int, ...], devices, device_memory: int | None, compile_only: bool = True):
    """Compiles `dims` on `devices`: a `memory_plan.PlanRow`, or a `Refusal` when the compiler runs out of memory.

    `compile_only`: the devices are a target's (`targets.devices`), not this
    process's. JAX's persistent compilation cache is then left out: it would
    store executables that no process here can load (reading one back fails
    with "PjRtCompiler must be constructed with a Client").
    Any other compiler error propagates (it is not a planning answer).
    """
    import jax

    started = time.perf_counter()
    cached = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", cached and not compile_only)
    try:
        return memory_plan._measure(builder, dims, devices, device_memory)
    except jax.errors.JaxRuntimeError as error:
        sizes = targets.out_of_memory(str(error))
        if sizes is None:
            raise
        return Refusal(math.prod(dims), tuple(dims), *sizes, round(time.perf_counter() - started, 2))
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)


def compile_layout(config, shape: tuple[int, ...], target: targets.Target):
    """The row of `config`'s own layout on `target` (its first N devices): a PlanRow or a Refusal.

    Args:
        config: the run (`memory_plan.plan_config`); `config.partition` is the layout, N its product.
        shape: one example, channels last (`memory_plan.example_shape`).
        target: where it is compiled (`targets.parse`).

    Raises:
        targets.MissingCompiler: the target's compiler is not installed (the message says how to install it).
        ValueError: the target has fewer devices than the layout's N.
    """
    dims = tuple(config.partition.input_partition_dims)
    devices = targets.devices(target)
    if math.prod(dims) > len(devices):
        raise ValueError(f"--target {target.name} has {len(devices)} devices, the layout {list(dims)} needs "
                         f"{math.prod(dims)}.")
    builder = memory_plan._Builder(config, tuple(shape))
    return measure(builder, dims, devices[:math.prod(dims)], targets.memory_per_device(target),
                   compile_only=target.platform != "cpu")
