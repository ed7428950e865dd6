"""Compiling for a target's own compiler: the refusal that becomes a "needs X of Y" row, and the compile-only rules.

The step is the one `fullres train` compiles (`compiled_step.StepBuilder`: the
same `config.resolve`, `engine.program.build_model` and `engine.step.jit_step`); only the
devices differ (`targets.devices`). The TPU compiler checks the program
against the chip's HBM while compiling and stops with RESOURCE_EXHAUSTED when
it does not fit: `layout_measure.measure` turns that layout into a `Refusal` with the
bytes it needs and the bytes there are, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os

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
    cached: bool = False  # read from the plan cache (`PlanCache`), not compiled now

    def describe(self) -> str:
        """'needs 17.25 GiB of 15.75 GiB per device', for the plan's table."""
        return f"needs {sizes.human_bytes(self.needed_bytes)} of {sizes.human_bytes(self.available_bytes)} per device"

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values["input_partition_dims"] = list(self.input_partition_dims)
        values["fits"] = False
        return values

    @classmethod
    def from_json(cls, values: dict) -> Refusal:
        fields = {f.name for f in dataclasses.fields(cls)}
        row = {k: v for k, v in values.items() if k in fields}
        return cls(**{**row, "input_partition_dims": tuple(row["input_partition_dims"])})


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


def default_cache_dir() -> str:
    """$FULLRES_PLAN_CACHE, else ~/.cache/fullres/target-plans (XDG_CACHE_HOME honoured)."""
    if os.environ.get("FULLRES_PLAN_CACHE"):
        return os.environ["FULLRES_PLAN_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fullres", "target-plans")


COMPILER_PACKAGES = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                     "jax-cuda13-pjrt")


def compiler_versions() -> dict[str, str]:
    """The compilers this process plans with, as installed: {"jax": "0.10.2", "jaxlib": ..., "jax-cuda12-plugin": ...}.

    A device running another XLA lays memory out differently, so the plan says which it modelled and
    `benchmarks/device/device_check.py` sets the device's versions beside them.
    """
    versions = {}
    for name in COMPILER_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _compiler_versions() -> str:
    return ";".join(f"{name}={version}" for name, version in compiler_versions().items()
                    if name in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin"))


COMPILER_FLAGS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")  # what XLA and the TPU compiler read from the environment


class PlanCache:
    """A target compiler's figures for a step, kept on disk: a TPU compile takes minutes, reading it back none.

    JAX's own persistent cache cannot serve here: it stores executables, and an
    executable compiled for devices this process does not have cannot be loaded
    back (`compile_only`). The key is the lowered program itself (so any change
    to the model, the optimizer, the shapes or the layout is a new key), the
    target's device kind and count, the compilers' versions and the flags they
    read from the environment (`COMPILER_FLAGS`: a flag can change the memory a
    compile needs); the value is the row's figures as JSON, one file per key.
    """

    def __init__(self, directory: str | None = None):
        self.directory = directory or default_cache_dir()

    def key(self, lowered_text: str, devices) -> str:
        digest = hashlib.sha256()
        flags = ";".join(f"{name}={os.environ.get(name, '')}" for name in COMPILER_FLAGS)
        for part in (lowered_text, getattr(devices[0], "device_kind", "?"), str(len(devices)), _compiler_versions(),
                     flags):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def load(self, key: str) -> dict | None:
        try:
            with open(os.path.join(self.directory, key + ".json"), encoding="utf-8") as file:
                return json.load(file)
        except (OSError, ValueError):
            return None  # not there, or cut short: compile again

    def store(self, key: str, values: dict) -> None:
        """Writes atomically; a cache that cannot be written only costs the next plan a compile."""
        path = os.path.join(self.directory, key + ".json")
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(path + ".tmp", "w", encoding="utf-8") as file:
                json.dump({**values, "cached": False}, file)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
