"""An estimated step time from the compiler's counts and the hardware's published peaks: a roofline, an estimate.

A step cannot be faster than its arithmetic at the device's peak FLOP/s, than
its memory traffic at the device's HBM bandwidth, or than its halo exchange at
the interconnect's bandwidth. The estimate is the largest of the three
(`Estimate.seconds`), and which one it was (`bound`). It ignores everything a
real step adds (kernel launch and fusion overheads, padding the counts do not
see, the input pipeline, overlap that is less than perfect), so a real step is
slower; it is kept in the plan's JSON so the first run on the hardware can be
set beside it.

Where the counts come from:
* TPU: the TPU compiler's own `cost_analysis()` (per device: flops, bytes
  accessed), and its own `optimal_seconds`, reported beside ours;
* GPU: JAX's CUDA plug-in gives no cost analysis ahead of time, so the counts
  are XLA:CPU's for the same layout (the plan compiles it on the CPU first);
  flops do not depend on the compiler, bytes accessed do (fusion differs);
* CPU: no estimate (the plan's CPU devices are virtual).

Peaks (`hardware.json`): a TPU runs float32 convolutions at JAX's default
precision as one bfloat16 pass, so its bfloat16 peak applies to both; a GPU
runs them on TF32 tensor cores (JAX's default), so float32 steps use the TF32
peak.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Seconds per step by each limit, the estimate (their maximum) and which limit it is."""

    compute_seconds: float
    memory_seconds: float
    interconnect_seconds: float | None  # None: the interconnect's bandwidth is not in hardware.json
    seconds: float
    bound: str  # "compute", "memory" or "interconnect"

    def to_json(self) -> dict:
        return {key: (None if value is None else (round(value, 9) if isinstance(value, float) else value))
                for key, value in dataclasses.asdict(self).items()}


def peak_flops(figures: dict, precision: str) -> float:
    """The peak FLOP/s a step of `precision` can reach on a device of `figures` (see the module's docstring)."""
    if precision == "float32" and figures["platform"] == "cuda":
        return figures["peak_tf32_flops"]
    return figures["peak_bf16_flops"]


def estimate(flops: float, bytes_accessed: float, halo_bytes: int, figures: dict, precision: str) -> Estimate:
    """The roofline estimate of one step on one device of `figures` (`targets.hardware`).

    Example:
        >>> v5e = {"platform": "tpu", "peak_bf16_flops": 197e12, "hbm_bytes_per_s": 819e9,
        ...        "interconnect_bytes_per_s": 400e9}
        >>> e = estimate(1.97e12, 8.19e9, 0, v5e, "float32")
        >>> round(e.compute_seconds, 3), round(e.memory_seconds, 3), e.bound
        (0.01, 0.01, 'compute')
    """
    compute = flops / peak_flops(figures, precision)
    memory = bytes_accessed / figures["hbm_bytes_per_s"]
    link = figures.get("interconnect_bytes_per_s")
    interconnect = None if not link else halo_bytes / link
    limits = {"compute": compute, "memory": memory, "interconnect": interconnect or 0.0}
    bound = max(limits, key=limits.get)
    return Estimate(compute, memory, interconnect, limits[bound], bound)
