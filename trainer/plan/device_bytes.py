"""What a device holds beyond its compiler's figure, so that the plan's bytes are the device's (DESIGN: the plan is
the device's).

`compiled.memory_analysis()` counts one executable's buffers: its arguments, outputs and temporaries (the
convolutions' cuDNN workspace among them, as each custom call's `u8[N]` scratch). It does not count what the
process holds beside the executable, nor what the compiler allocates while it compiles. Measured on one H200
(JAX 0.11.2, CUDA 13): the allocator's peak was 1.27× the plan (default UNet 128³ float32), 1.37×
(bfloat16) and 1.76× (predict, 256³). The terms, each named in the plan's JSON (`Terms.to_json`):

* workspace: a compile for a GPU without one (`fullres plan --target`) autotunes nothing, so every cuDNN
  convolution gets `u8[0]` of workspace; on the device the autotuner keeps the fastest algorithm, whose workspace
  is part of the temporaries. Only one convolution runs at a time, so the step's peak grows by one convolution's
  workspace. Measured (the device's compiler − the deviceless one): 0.52-1.04× the largest convolution tensor
  (`largest_convolution_bytes`), so `WORKSPACE_PER_CONVOLUTION_TENSOR` = 1.0, bounded by the autotuner's scratch
  limit (`AUTOTUNE_SCRATCH_LIMIT_BYTES`: XLA's `RedzoneAllocator` default, 4 GiB; jax 0.10.2's XLA has no flag
  that changes it: `xla_gpu_redzone_scratch_max_megabytes` is gone, and nothing else bounds library workspace).
* autotuning: while compiling, the autotuner runs each candidate algorithm of a convolution on buffers of its own
  (its operands, its result and a reference copy of the result, XLA's `conv_algorithm_picker`) plus the
  candidate's workspace, beside whatever the process already holds. A peak of its own (`autotuning_peak`).
* held state: `fullres train` builds the model inside the mesh's scope, so the Keras variables (weights, optimizer
  slots) stay on the device beside the copy the step donates (`placement.place_state` copies); predict likewise
  holds the loaded weights beside their placed copy. Not in the step's arguments: counted once more.
* next batch: training keeps the next step in flight, so one more input batch is on the device.
* margin (`GPU_MARGIN`): the rest, set from the measured rows (`MEASURED`), named with why in the plan.

With `--xla_gpu_autotune_level=0` nothing is autotuned: no workspace beyond the deviceless figure, no autotuning
peak, and a fast compile (untuned kernels). `planned` says which it assumed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping

import trainer

AUTOTUNE_SCRATCH_LIMIT_BYTES = 1 << 32  # XLA's RedzoneAllocator memory_limit default: a candidate's workspace at most
WORKSPACE_PER_CONVOLUTION_TENSOR = 1.0  # kept workspace ÷ the largest convolution tensor (measured 0.52-1.04)
GPU_MARGIN = 1.05
# The fraction of a GPU's memory JAX's allocator may use: fullres sets XLA_PYTHON_CLIENT_MEM_FRACTION to this unless
# the user did (trainer/__init__.py); JAX's own default, 0.75, would stop a step the plan says fits at 76-95 %.
GPU_MEMORY_FRACTION = float(trainer.GPU_MEMORY_FRACTION)
MEMORY_FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# Seconds of autotuning per second of the roofline step: the 512³ float32 step (roofline 0.584 s) had not compiled
# after 450 s on an H200, so at least 771 (450 ÷ 0.584, up); a compile on the device takes at least this.
AUTOTUNE_SECONDS_PER_ROOFLINE_SECOND = 771
LONG_COMPILE_SECONDS = 180  # the first step at the largest cube should compile within 3 minutes
MARGIN_WHY = ("covers what the terms do not: the spread of the workspace (0.52-1.04× the largest convolution tensor, "
              "counted at 1.0), the compiler's version (the plan compiles with the locked jax, the device may run "
              "another) and the allocator's rounding; set so that the device's peak ÷ the plan is 0.97-0.98 on the "
              "rows measured on an H200 (`device_bytes.MEASURED`)")

# The rows the terms and the margin were set from: one H200, JAX 0.11.2 with its CUDA 13 plug-in, 2026-11-28
# (benchmarks/device/device_check.py as shipped then). The compiler's figure is the deviceless plan's (jax 0.10.2,
# benchmarks/results/device_plan_h100x1.json); state, weights and convolution tensors are those of the program run.
MEASURED = (
    {"row": "train, default UNet 128³ float32", "program": "train", "compiler_bytes": 2138885880,
     "state_bytes": 260383012, "placed_before_compile_bytes": 0, "largest_convolution_bytes": 268435456,
     "autotuning_convolution_bytes": 671088640, "device_compiler_bytes": 2.28e9, "peak_bytes": 2.72e9},
    {"row": "train, default UNet 128³ bfloat16", "program": "train", "compiler_bytes": 1198727416,
     "state_bytes": 260383012, "placed_before_compile_bytes": 0, "largest_convolution_bytes": 134217728,
     "autotuning_convolution_bytes": 335544320, "device_compiler_bytes": 1.34e9, "peak_bytes": 1.64e9},
    # device_check's predict row then held the whole training state (weights and Adam's slots), twice.
    {"row": "predict, default UNet 256³ float32", "program": "predict", "compiler_bytes": 4650203760,
     "state_bytes": 260383012, "placed_before_compile_bytes": 260383012, "largest_convolution_bytes": 2147483648,
     "autotuning_convolution_bytes": 5368709120, "device_compiler_bytes": 6.80e9, "peak_bytes": 8.19e9},
)


@dataclasses.dataclass(frozen=True)
class Terms:
    """A program's bytes on one device: the compiler's figure and what the device adds (see the module)."""

    compiler_bytes: int
    workspace_bytes: int
    held_state_bytes: int
    next_batch_bytes: int
    autotuning_peak_bytes: int
    margin: float
    autotune: bool

    @property
    def step_peak_bytes(self) -> int:
        return self.compiler_bytes + self.workspace_bytes + self.held_state_bytes + self.next_batch_bytes

    @property
    def total_bytes(self) -> int:
        """The plan's bytes: the larger of the step's and the autotuning's peak, times the margin."""
        return math.ceil(max(self.step_peak_bytes, self.autotuning_peak_bytes) * self.margin)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "step_peak_bytes": self.step_peak_bytes, "total_bytes": self.total_bytes}


def convolution_bytes(windows) -> tuple[int, int]:
    """(the largest tensor a convolution reads or writes, the most one convolution's autotuning allocates: its
    operands, its result and a copy of the result, the result being either side: in + out + max(in, out)), in bytes
    per device, from `halo.windows` (global shapes; divide by the cores a tensor is split over)."""
    largest = autotuning = 0
    for window in windows:
        read = window.batch * math.prod(window.in_spatial) * window.in_channels * window.itemsize
        written = window.batch * math.prod(window.out_spatial) * window.out_channels * window.itemsize
        largest = max(largest, read, written)
        autotuning = max(autotuning, read + written + max(read, written))
    return largest, autotuning


def autotunes(xla_flags: str | None = None) -> bool:
    """Whether the GPU compiler autotunes under `xla_flags` (default: this process's XLA_FLAGS)."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    found = re.findall(r"--xla_gpu_autotune_level=(\d+)", flags)
    return not found or int(found[-1]) != 0


def planned(compiler_bytes: int, platform: str, *, state_bytes: int, largest_convolution_bytes: int = 0,
            autotuning_convolution_bytes: int = 0, placed_before_compile_bytes: int = 0, next_batch_bytes: int = 0,
            autotune: bool = True) -> Terms:
    """The `Terms` of a program with `compiler_bytes` (memory_analysis: temp + arguments + outputs − aliases) per
    device on `platform` ("cuda", "tpu" or "cpu").

    Args:
        state_bytes: what the process holds on each device beside the program's arguments (training: the whole
            `TrainState` the model was built with; predict: the loaded weights).
        largest_convolution_bytes, autotuning_convolution_bytes: per device (`convolution_bytes`).
        placed_before_compile_bytes: arguments already on the device while it compiles (predict places its
            weights first; training compiles before it places its state).
        next_batch_bytes: an input batch per device (training keeps the next step in flight).
        autotune: the GPU compiler autotunes (XLA's default); False under `--xla_gpu_autotune_level=0`.
    """
    gpu = platform == "cuda"
    tuned = gpu and autotune
    workspace = min(AUTOTUNE_SCRATCH_LIMIT_BYTES,
                    math.ceil(WORKSPACE_PER_CONVOLUTION_TENSOR * largest_convolution_bytes)) if tuned else 0
    autotuning = (state_bytes + placed_before_compile_bytes + autotuning_convolution_bytes + workspace) if tuned else 0
    return Terms(int(compiler_bytes), workspace, int(state_bytes), int(next_batch_bytes), autotuning,
                 GPU_MARGIN if gpu else 1.0, tuned)


def allocator_fraction(environment: Mapping[str, str] | None = None) -> float:
    """The share of a GPU's memory JAX's allocator may take in a process with `environment` (default: this one's):
    XLA_PYTHON_CLIENT_MEM_FRACTION where the user set it, else `GPU_MEMORY_FRACTION`, which fullres sets.

    Example:
        >>> allocator_fraction({}), allocator_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
        (0.95, 0.5)
        >>> allocator_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "abc"})
        Traceback (most recent call last):
        ValueError: XLA_PYTHON_CLIENT_MEM_FRACTION='abc' is not a share of the GPU's memory: JAX reads it as a number above 0 and at most 1; set it like XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, or unset it (fullres then lets JAX take 0.95).

    Raises:
        ValueError: the variable is not a number in (0, 1] (JAX itself would stop in its CUDA client with an error
            that never names it).
    """
    text = (os.environ if environment is None else environment).get(MEMORY_FRACTION_VARIABLE, trainer.GPU_MEMORY_FRACTION)
    try:
        fraction = float(text)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:  # nan too
        raise ValueError(f"{MEMORY_FRACTION_VARIABLE}={text!r} is not a share of the GPU's memory: JAX reads it as a "
                         f"number above 0 and at most 1; set it like {MEMORY_FRACTION_VARIABLE}=0.9, or unset it "
                         f"(fullres then lets JAX take {GPU_MEMORY_FRACTION:g}).")
    return fraction


def fraction_source(fraction: float) -> str:
    """Who set the allocator's share, in the plan's words."""
    return "as fullres sets it" if fraction == GPU_MEMORY_FRACTION else f"as {MEMORY_FRACTION_VARIABLE} sets it"


def usable_bytes(memory_bytes: int, platform: str) -> int:
    """Of a device's memory, what a fullres program may use: on a GPU the allocator's share (`allocator_fraction`);
    on a TPU the compiler's own figure is that already.

    Raises:
        ValueError: on a GPU, `allocator_fraction`'s.
    """
    return int(memory_bytes * allocator_fraction()) if platform == "cuda" else int(memory_bytes)


def expected_compile_seconds(roofline_seconds: float | None, platform: str, autotune: bool = True) -> float | None:
    """At least how long the device's compiler will take, autotuning included (None where nothing is known)."""
    if platform != "cuda" or not autotune or not roofline_seconds:
        return None
    return AUTOTUNE_SECONDS_PER_ROOFLINE_SECOND * roofline_seconds


def compile_warning(seconds: float | None) -> str:
    """The plan's sentence where the device's compile will be long ('' where it will not)."""
    if seconds is None or seconds < LONG_COMPILE_SECONDS:
        return ""
    return (f"the GPU's first compile will take at least {seconds / 60:.1f} min (autotuning every convolution: the "
            f"512³ float32 step had not compiled after 450 s on an H200); XLA_FLAGS=--xla_gpu_autotune_level=0 "
            "compiles without autotuning (untuned kernels, no workspace beyond the compiler's figure), and fullres's "
            "compilation cache makes the second run's compile short")


def describe(platform: str, autotune: bool = True) -> str:
    """What a target row's total is, in the plan's words."""
    if platform != "cuda":
        return ("the device's bytes: the compiler's figure, the state training holds beside the step (its Keras "
                "variables) and the next batch in flight")
    tuned = (f"cuDNN workspace ({WORKSPACE_PER_CONVOLUTION_TENSOR:g}× the largest convolution tensor, at most the "
             f"autotuner's {AUTOTUNE_SCRATCH_LIMIT_BYTES / 2**30:g} GiB; or the autotuning's own peak where larger)"
             if autotune else "no workspace (--xla_gpu_autotune_level=0: nothing autotuned)")
    fraction = allocator_fraction()
    return (f"the device's bytes: the compiler's figure + {tuned} + the state training holds beside the step + the "
            f"next batch, × {GPU_MARGIN:g} margin ({MARGIN_WHY}); fits: within {fraction:.0%} of the GPU's memory, "
            f"the share of JAX's allocator {fraction_source(fraction)}")


def plan_json(platform: str, versions: dict, autotune: bool = True) -> dict:
    """The plan JSON's account of its bytes: the compilers it modelled, the terms, the margin and why."""
    gpu = platform == "cuda"
    return {"compiler_versions": versions, "device_bytes": describe(platform, autotune),
            "margin": {"factor": GPU_MARGIN if gpu else 1.0, "why": MARGIN_WHY if gpu else
                       "no margin: no TPU has been measured against its plan yet",
                       "set_from": [{k: m[k] for k in ("row", "peak_bytes", "compiler_bytes")} for m in MEASURED]
                       if gpu else []},
            "autotune": autotune if gpu else None,
            "allocator_fraction": allocator_fraction() if gpu else None,
            "workspace_per_convolution_tensor": WORKSPACE_PER_CONVOLUTION_TENSOR if gpu else None,
            "autotune_scratch_limit_bytes": AUTOTUNE_SCRATCH_LIMIT_BYTES if gpu else None}


def versions_line(versions: dict) -> str:
    """'modelled with jax 0.10.2, jaxlib 0.10.2, jax-cuda12-plugin 0.10.2 (...)' for the plan's table."""
    named = ", ".join(f"{name} {version}" for name, version in versions.items())
    return (f"modelled with {named}: the locked compiler (JAX cannot move past 0.10.2 on Python 3.11); a device "
            "running another lays memory out differently, and benchmarks/device/device_check.py records both")
