"""The hardware a plan is for, and that hardware's devices for its own compiler, with no accelerator present.

A target is named the way users rent it: `cpu` (this machine's CPU as
virtual devices, today's plan), a Cloud TPU slice by generation and topology
(`v5e:2x2`, `v4:2x2x1`, `v5p:2x2x4`, `v6e:4x4`, `tpu7x:2x2x1`), or NVIDIA GPUs by
model, GPUs per host and hosts (`h100x8`, `h100x8x2`; a100, h100, h200, b200).

`devices` returns the target's JAX devices for ahead-of-time compilation only
(`jax.experimental.topologies.get_topology_desc`): for a TPU slice, libtpu
(the TPU compiler; `uv sync --group tpu`) lays it out; for GPUs, JAX's CUDA
plug-in (`uv sync --group cuda`) reads a GPU target description from
`gpu_specs/`. A step lowered and compiled for them reports that compiler's
`memory_analysis()`, which is what the rented machine will need.

`hardware` gives each device's published memory, peak FLOP/s, memory and
interconnect bandwidth (`hardware.json`, with sources); `out_of_memory`
reads the TPU compiler's refusal ("... exceeds available HBM (15.75G)").
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import re
from pathlib import Path

from common import sizes

HERE = Path(__file__).parent
GPU_SPECS = HERE / "gpu_specs"


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """How libtpu names and lays out one TPU generation, and the slices Cloud TPU rents of it.

    `slices` are the shapes Cloud TPU offers: every one for the 2-D generations (v5e, v6e: a 2-D torus of up
    to 16x16); for the 3-D ones (v4, v5p, tpu7x) those below a 4x4x4 cube, above which a slice is AxBxC with
    A <= B <= C, each a multiple of 4 (cloud.google.com/tpu/docs/v5e, /v6e, /v4, /v5p, /tpu7x "Configurations").
    """

    topology_rank: int  # chips per dimension: 2 (v5e 4x4) or 3 (v5p 2x2x4)
    chip_config_name: str  # "megacore": one JAX device per chip of two TensorCores (v4, v5p)
    accelerator_type: str  # TPU_ACCELERATOR_TYPE for libtpu's start-up (a single-host slice of the generation)
    slices: tuple[str, ...] = ()


_SLICES_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_SLICES_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")  # and the cubes' multiples from 4x4x4 (`has_slice`)
TPU_GENERATIONS = {
    "v4": TpuGeneration(3, "megacore", "v4-8", _SLICES_3D),
    "v5e": TpuGeneration(2, "default", "v5litepod-4", _SLICES_2D),
    "v5p": TpuGeneration(3, "megacore", "v5p-8", _SLICES_3D),
    "v6e": TpuGeneration(2, "default", "v6e-4", _SLICES_2D),
    "tpu7x": TpuGeneration(3, "default", "tpu7x-8", _SLICES_3D),  # two JAX devices per chip (one per TensorCore)
}
DEFAULT_PARTITIONS = (1, 2, 4, 8, 16)  # `fullres plan`'s core counts when --partitions is not given
GPU_MODELS = ("a100", "h100", "h200", "b200")
_TPU_NAME = re.compile(r"(?P<generation>[a-z0-9]+):(?P<topology>[0-9]+(?:x[0-9]+)*)")
_GPU_NAME = re.compile(r"(?P<model>[a-z][a-z0-9]*?)x(?P<per_host>[0-9]+)(?:x(?P<hosts>[0-9]+))?")
KNOWN = ("cpu; a TPU slice as GENERATION:TOPOLOGY, e.g. v5e:2x2, v4:2x2x1, v5p:2x2x4, v6e:4x4 or tpu7x:2x2x1 "
         f"({', '.join(TPU_GENERATIONS)}); or NVIDIA GPUs as MODELxGPUS[xHOSTS], e.g. h100x8 or h100x8x2 "
         f"({', '.join(GPU_MODELS)})")


class MissingCompiler(RuntimeError):
    """The target's compiler (libtpu, or JAX's CUDA plug-in) is not installed; the message says how to install it."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One target by name (`parse`).

    Example:
        >>> target = parse("v5p:2x2x4")
        >>> target.platform, target.kind, target.shape, target.device_count
        ('tpu', 'v5p', (2, 2, 4), 16)
        >>> parse("h100x8x2").device_count, parse("h100x8x2").hosts
        (16, 2)
    """

    name: str
    platform: str  # "cpu", "tpu" or "cuda"
    kind: str  # "cpu", a TPU generation ("v5e") or a GPU model ("h100")
    shape: tuple[int, ...] = ()  # TPU: chips per dimension; GPU: (GPUs per host, hosts)

    @property
    def device_count(self) -> int | None:
        """JAX devices of the whole target (None for `cpu`: as many virtual devices as the plan needs)."""
        if self.platform == "tpu":
            return math.prod(self.shape) * hardware(self.kind)["devices_per_chip"]
        return math.prod(self.shape) if self.platform == "cuda" else None

    @property
    def hosts(self) -> int | None:
        """GPU hosts (None for TPU slices and the CPU)."""
        return self.shape[1] if self.platform == "cuda" else None


def parse(name: str) -> Target:
    """`cpu`, `v5e:2x2`, `h100x8x2`, ... -> `Target`; anything else raises ValueError naming the forms that work."""
    text = name.strip().lower()
    if text == "cpu":
        return Target("cpu", "cpu", "cpu")
    tpu = _TPU_NAME.fullmatch(text)
    if tpu and tpu["generation"] in TPU_GENERATIONS:
        generation = TPU_GENERATIONS[tpu["generation"]]
        shape = tuple(int(n) for n in tpu["topology"].split("x"))
        if len(shape) != generation.topology_rank or min(shape) < 1:
            example = "x".join(["2"] * generation.topology_rank)
            raise ValueError(f"--target {name!r}: a {tpu['generation']} topology has {generation.topology_rank} "
                             f"dimensions of at least 1 chip, e.g. {tpu['generation']}:{example}.")
        check_slice(tpu["generation"], shape, f"--target {name!r}")
        return Target(text, "tpu", tpu["generation"], shape)
    gpu = _GPU_NAME.fullmatch(text)
    if gpu and gpu["model"] in GPU_MODELS:
        per_host, hosts = int(gpu["per_host"]), int(gpu["hosts"] or 1)
        if not 1 <= per_host <= 8 or hosts < 1:
            raise ValueError(f"--target {name!r}: a host has 1 to 8 {gpu['model']} GPUs and there is at least one "
                             f"host, e.g. {gpu['model']}x8 or {gpu['model']}x8x2.")
        return Target(text, "cuda", gpu["model"], (per_host, hosts))
    raise ValueError(f"--target {name!r} is not known; use {KNOWN}.")


def has_slice(generation: str, shape: tuple[int, ...]) -> bool:
    """Whether Cloud TPU rents a slice of `generation` with `shape` chips per dimension (`TpuGeneration.slices`)."""
    spec = TPU_GENERATIONS[generation]
    if "x".join(map(str, shape)) in spec.slices:
        return True
    return (spec.topology_rank == 3 and len(shape) == 3 and list(shape) == sorted(shape) and shape[0] >= 4
            and all(n % 4 == 0 for n in shape))


def check_slice(generation: str, shape: tuple[int, ...], what: str) -> None:
    """Refuses a slice shape `generation` does not come in, naming the ones it does (`what` names the value).

    Example:
        >>> check_slice("v5e", (3, 3), "--target 'v5e:3x3'")
        Traceback (most recent call last):
        ValueError: --target 'v5e:3x3': v5e has no 3x3 slice; its slices are 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16 and 16x16.
    """
    if has_slice(generation, shape):
        return
    spec = TPU_GENERATIONS[generation]
    listed = f"{', '.join(spec.slices[:-1])} and {spec.slices[-1]}"
    if spec.topology_rank == 3:
        listed = (f"{', '.join(spec.slices)} and, from 4x4x4 up, AxBxC with A <= B <= C each a multiple of 4 "
                  "(4x4x8, 4x8x8, 8x8x8, ...)")
    raise ValueError(f"{what}: {generation} has no {'x'.join(map(str, shape))} slice; its slices are {listed}.")


def check_devices(target: Target, partitions, input_partition_dims: tuple[int, ...] | None = None) -> None:
    """Refuses core counts beyond the target's devices, naming the option the user typed: the one layout
    (`--input-partition-dims`) where given, else `--partitions`.

    Example:
        >>> check_devices(parse("h100x1"), [2], (1, 2, 1, 1, 1))
        Traceback (most recent call last):
        ValueError: --target h100x1 has 1 device; --input-partition-dims 1,2,1,1,1 splits each example over 2 devices: choose a larger slice or more GPUs, or dims whose product is at most 1.
    """
    too_many = max((n for n in partitions if n > target.device_count), default=None)
    if too_many is None:
        return
    count = target.device_count
    if input_partition_dims:
        asked = (f"--input-partition-dims {','.join(map(str, input_partition_dims))} splits each example over "
                 f"{too_many} devices: choose a larger slice or more GPUs, or dims whose product is at most {count}")
    else:
        asked = f"--partitions {too_many} needs more: choose a larger slice or more GPUs, or counts of at most {count}"
    raise ValueError(f"--target {target.name} has {count} device{'s' if count > 1 else ''}; {asked}.")


def default_partitions(target: Target) -> tuple[int, ...]:
    """The core counts `fullres plan` compares when --partitions is not given: `DEFAULT_PARTITIONS`, on a TPU slice
    or GPUs those that divide its devices (a plan for 16 cores of a 4-device slice has nothing to launch)."""
    count = target.device_count
    if count is None:
        return DEFAULT_PARTITIONS
    return tuple(n for n in DEFAULT_PARTITIONS if n <= count and count % n == 0)


@functools.cache
def _table() -> dict:
    return json.loads((HERE / "hardware.json").read_text(encoding="utf-8"))["devices"]


def hardware(kind: str) -> dict:
    """Per-device figures of a TPU generation or GPU model (`hardware.json`): memory_bytes, peak_bf16_flops, ..."""
    return _table()[kind]


def memory_per_device(target: Target) -> int | None:
    """Bytes one device offers a program: the TPU compiler's own figure; of a GPU's published memory, the share JAX's
    allocator may use as fullres runs it (`device_bytes.usable_bytes`); None for `cpu`.

    Raises:
        ValueError: on a GPU, a XLA_PYTHON_CLIENT_MEM_FRACTION that is no share (`device_bytes.allocator_fraction`).
    """
    from trainer.plan import device_bytes

    if target.platform == "cpu":
        return None
    figures = hardware(target.kind)
    return figures["tpu_compiler_hbm_bytes"] or device_bytes.usable_bytes(figures["memory_bytes"], target.platform)


def memory_words(target: Target, given_bytes: int | None = None) -> str:
    """A TPU or GPU's memory for the plan's header, and on a GPU apart from it the share a program may use: '80.00 GiB
    per device, of which JAX's allocator may take 95 % (76.00 GiB), as fullres sets it'; `given_bytes` (the user's
    --device-memory) as they are."""
    from trainer.plan import device_bytes

    usable = sizes.human_bytes(given_bytes or memory_per_device(target))
    if target.platform != "cuda" or given_bytes:
        return f"{usable} per device"
    fraction = device_bytes.allocator_fraction()
    return (f"{sizes.human_bytes(hardware(target.kind)['memory_bytes'])} per device, of which JAX's allocator may take "
            f"{fraction:.0%} ({usable}), {device_bytes.fraction_source(fraction)}")


# ---------------------------------------------------------------- the compilers


def _locked_libtpu() -> str:
    """The libtpu requirement jax[tpu] states for the installed JAX, e.g. 'libtpu==0.0.42.*'."""
    for requirement in importlib.metadata.requires("jax") or []:
        if requirement.startswith("libtpu") and 'extra == "tpu"' in requirement:
            return requirement.split(";")[0].strip()
    return "libtpu"


def _install_hint(group: str, extra: str) -> str:
    version = importlib.metadata.version("jax")
    return f"`uv sync --group {group}` (or `pip install 'jax[{extra}]=={version}'`)"


def _check_libtpu(target: Target) -> None:
    wanted = _locked_libtpu()
    if importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"):
        raise MissingCompiler(f"--target {target.name} compiles with the TPU compiler, libtpu ({wanted} for JAX "
                              f"{importlib.metadata.version('jax')}), which is not installed; install it with "
                              f"{_install_hint('tpu', 'tpu')}.")
    match = re.fullmatch(r"libtpu==([0-9.]+?)(\.\*)?", wanted)
    if match and importlib.util.find_spec("libtpu") is not None:
        installed = importlib.metadata.version("libtpu")
        if not (installed.startswith(match[1] + ".") if match[2] else installed == match[1]):
            raise MissingCompiler(f"--target {target.name}: libtpu {installed} is installed, but JAX "
                                  f"{importlib.metadata.version('jax')} needs {wanted}; install it with "
                                  f"{_install_hint('tpu', 'tpu')}.")


def _check_cuda_plugin(target: Target) -> None:
    try:
        found = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ModuleNotFoundError:  # no `jax_plugins` package at all (neither plug-in group installed)
        found = None
    if found is None:
        raise MissingCompiler(f"--target {target.name} compiles with JAX's CUDA 12 plug-in, which is not installed; "
                              f"install it with {_install_hint('cuda', 'cuda12-local')}.")


def devices(target: Target) -> list:
    """The target's JAX devices, for compiling only (`lower(...).compile()`; nothing can run on them).

    `cpu` gives this process's devices. A TPU slice needs libtpu, GPUs JAX's
    CUDA plug-in; without it, `MissingCompiler` says in one sentence how to
    install it.
    """
    import jax

    if target.platform == "cpu":
        return jax.devices()
    from jax.experimental import topologies

    if target.platform == "tpu":
        _check_libtpu(target)
        generation = TPU_GENERATIONS[target.kind]
        shape = target.shape
        # libtpu's start-up looks for the TPU VM it runs on and logs several lines when there is none; the first
        # two name a single-host slice of the generation (they describe the attached hardware, of which there is
        # none; the topology asked for below is what the compiler lays out). libtpu also takes a machine-wide
        # lock (/tmp/libtpu_lockfile) that keeps a second process from starting it, which only matters for
        # real chips: planning processes (parallel tests, two plans at once) compile side by side.
        quiet = {"TPU_ACCELERATOR_TYPE": generation.accelerator_type, "TPU_WORKER_HOSTNAMES": "localhost",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
        added = {k: v for k, v in quiet.items() if k not in os.environ}
        os.environ.update(added)
        try:
            topology = topologies.get_topology_desc(
                platform="tpu", topology_name=f"{target.kind}:{'x'.join(map(str, shape))}",
                chip_config_name=generation.chip_config_name,
                # Chips per host only decide which process owns which device; memory per device does not depend
                # on it. Up to 2x2x1 chips of a slice per host, as MaxText lays slices out for its AOT compiles.
                chips_per_host_bounds=(min(2, shape[0]), min(2, shape[1]), 1),
                num_slices=1)
        except jax.errors.JaxRuntimeError as error:
            first = str(error).splitlines()[0].rstrip(".")
            if first.startswith("INVALID_ARGUMENT"):
                raise ValueError(f"--target {target.name}: libtpu has no such slice ({first}).") from None
            raise ValueError(f"--target {target.name}: libtpu could not start ({first}).") from None
        finally:
            for key in added:
                os.environ.pop(key, None)
        return list(topology.devices)
    _check_cuda_plugin(target)
    per_host, hosts = target.shape
    topology = topologies.get_topology_desc(
        platform="cuda", target_config=(GPU_SPECS / f"{target.kind}.txtpb").read_text(encoding="utf-8"),
        topology=f"1x{hosts}x{per_host}")  # slices x hosts per slice x GPUs per host
    return list(topology.devices)


# ---------------------------------------------------------------- the compiler's refusal

_SIZE = r"([0-9.]+)\s*([KMGT]?)i?B?"
# libtpu: "Ran out of memory on HBM, the total memory required for HLO temporaries (17.25G) exceeds available HBM (15.75G)."
_EXCEEDS = re.compile(rf"\({_SIZE}\)\s*exceeds available HBM\s*\({_SIZE}\)")
# libtpu, other passes: "Ran out of memory in memory space hbm. Used 17.25G of 15.75G hbm."
_USED_OF = re.compile(rf"Used\s+{_SIZE}\s+of\s+{_SIZE}\s+hbm", re.IGNORECASE)


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * 1024 ** " KMGT".index(unit or " "))


def out_of_memory(message: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) from a compiler's RESOURCE_EXHAUSTED message; None for any other message.

    The TPU compiler writes sizes in binary units to two decimals ("15.75G" is
    15.75 GiB), so both figures are good to about 5 MiB.

    Example:
        >>> out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        ...               "temporaries (17.25G) exceeds available HBM (15.75G).")
        (18522046464, 16911433728)
        >>> out_of_memory("INVALID_ARGUMENT: bad layout") is None
        True
    """
    if "RESOURCE_EXHAUSTED" not in message and "out of memory" not in message.lower():
        return None
    match = _EXCEEDS.search(message) or _USED_OF.search(message)
    if not match:
        return None
    return _bytes(match[1], match[2]), _bytes(match[3], match[4])
