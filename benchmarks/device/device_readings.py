"""What a device-check row reads off the device and its compiler: the allocator's peak, the compiler's bytes and
counts, the cuDNN workspace the autotuner gave each convolution, the terms the plan adds beside the compiler's figure
(`plan.device_bytes`), and the roofline of the compiler's counts. Shared by `device_check_rows.py` and
`peer_rows.py`, so both sides of a comparison read the same figures the same way.
"""

from __future__ import annotations

import re
import resource


def device_figures(device) -> dict:
    """The allocator's statistics where the device keeps them (GPU, TPU); on a CPU the process's peak RSS, marked."""
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001  (a runtime without statistics)
        stats = None
    if stats and "peak_bytes_in_use" in stats:
        return {"peak_bytes": int(stats["peak_bytes_in_use"]), "peak_bytes_source": "allocator peak_bytes_in_use",
                "bytes_limit": int(stats["bytes_limit"]) if stats.get("bytes_limit") else None}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"peak_bytes": int(rss), "bytes_limit": None,
            "peak_bytes_source": f"process peak RSS: {device.platform} keeps no allocator statistics"}


def compiler_figures(compiled) -> dict:
    """The compiler's per-device bytes (`memory_analysis`, as `fullres plan` totals them) and its counts."""
    memory = compiled.memory_analysis()
    total = None if memory is None else int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                            + memory.output_size_in_bytes - memory.alias_size_in_bytes)
    try:
        costs = compiled.cost_analysis()
    except Exception:  # noqa: BLE001  (a compiler without cost analysis)
        costs = None
    costs = (costs[0] if isinstance(costs, (list, tuple)) and costs else costs) or {}
    flops, accessed = costs.get("flops"), costs.get("bytes accessed")
    return {"total_bytes": total, "flops": None if flops is None else float(flops),
            "bytes_accessed": None if accessed is None else float(accessed)}


_SCRATCH = re.compile(r"u8\[(\d+)\]\{0\}\) custom-call\([^\n]*custom_call_target=\"__cudnn\$conv")


def workspace_bytes(compiled) -> int | None:
    """The largest cuDNN workspace the compiled program gives one convolution (each custom call's `u8[N]` scratch, as
    the device's autotuner chose it; 0 where nothing was autotuned), None where the program has no cuDNN call."""
    found = [int(n) for n in _SCRATCH.findall(compiled.as_text())]
    return max(found) if found else None


def term_figures(model, state, image_shape: tuple[int, ...], held, placed_before_compile: int = 0) -> dict:
    """What `plan.device_bytes` counts beside the compiler's figure, for this row's own program: the state held on
    the device beside the program's arguments, its convolutions' tensors, what was placed before compiling, and
    whether the compiler autotunes (`XLA_FLAGS`)."""
    import math

    import jax

    from trainer.parallel import halo
    from trainer.plan import device_bytes

    largest, tuning = device_bytes.convolution_bytes(halo.windows(model, state, image_shape))
    held_bytes = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(held))
    return {"state_bytes": held_bytes, "largest_convolution_bytes": largest, "autotuning_convolution_bytes": tuning,
            "placed_before_compile_bytes": placed_before_compile, "autotune": device_bytes.autotunes()}


def roofline_seconds(figures: dict, row: dict) -> dict | None:
    """The roofline (`plan.roofline.estimate`) of the device compiler's counts on the target's published peaks."""
    from trainer.plan import roofline, targets

    if figures.get("flops") is None or figures.get("bytes_accessed") is None:
        return None
    estimate = roofline.estimate(figures["flops"], figures["bytes_accessed"], 0,
                                 targets.hardware(row["hardware"]), row["precision"])
    return {"step_seconds": estimate.seconds, "bound": estimate.bound}
