"""The layout search on a target's own compiler, kept usable on a 2-core machine.

A TPU compile of a convolutional net takes minutes here, a CPU compile of the
same step seconds. So `search`:

1. prunes the layouts that cannot divide the volume at every resolution level
   (as on the CPU; `layout_search.prune`);
2. compiles every remaining layout for this machine's CPU first: a cheap
   estimate. A layout whose CPU figure, times the least share of it the
   target's compiler has been measured to lay out (`LEAST_SHARE_OF_CPU`),
   still exceeds the target's memory is not compiled for the target (the plan
   names it with its CPU figure and why);
3. compiles the rest for the target, best CPU rank first, one progress line
   each with its time, reading figures compiled before from the plan cache
   (`target_compile.PlanCache`), and starts no compile after `max_minutes`
   (the layouts left are listed, not guessed);
4. ranks what the target's compiler measured (`layout_search.rank_rows`), each
   row with its CPU figure beside it and an estimated step time
   (`roofline.estimate`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from common import sizes
from trainer import config as config_lib
from trainer.parallel import device_mesh, xla_compile
from trainer.plan import device_bytes, layout_measure, layout_search, plan_row, roofline, target_compile, targets


# The least share of a layout's CPU figure (XLA:CPU's bytes) that a target's compiler lays out, per platform: a layout
# is left uncompiled for the target only where its CPU figure times this share exceeds the device's memory. TPU: 1.1
# to 9 times the CPU's bytes for every fullres model measured, never less. GPU (XLA's CUDA compiler, on h100):
# 0.20 to 1.05 times (docs/plan-targets.md, "The GPU's bytes against the CPU's"), the least for bfloat16 at large
# cubes (XLA:CPU lays out more bytes for a bfloat16 step than for the float32 one, XLA's GPU compiler far fewer); a
# tenth, half the least measured, for a margin: it skips only layouts far past the memory.
LEAST_SHARE_OF_CPU = {"tpu": 1.0, "cuda": 0.1}


def _why_not_compiled(target: targets.Target, device_memory: int) -> str:
    """The plan's words for a layout its CPU figure keeps from the target's compiler (`LEAST_SHARE_OF_CPU`)."""
    share = LEAST_SHARE_OF_CPU[target.platform]
    memory = sizes.human_bytes(device_memory)
    if share >= 1:
        return f"already exceeds {memory}"
    return (f"exceeds {1 / share:g} times {memory}, and the GPU's compiler has laid out no less than {2 * share:g} "
            f"times the CPU's bytes for any fullres model measured")


def _with_estimate(row: plan_row.PlanRow, cpu: plan_row.PlanRow, target: targets.Target,
                   precision: str) -> plan_row.PlanRow:
    """`row` with its CPU figure and roofline estimate (GPUs: XLA:CPU's counts, the CUDA compiler gives none)."""
    flops = row.flops if row.flops is not None else cpu.flops
    accessed = row.bytes_accessed if row.bytes_accessed is not None else cpu.bytes_accessed
    estimate = None
    if flops is not None and accessed is not None:
        estimate = roofline.estimate(flops, accessed, row.exchange_bytes + row.all_to_all_bytes, targets.hardware(target.kind),
                                     precision)
        estimate = {**estimate.to_json(), "counts_from": "target compiler" if row.flops is not None else "XLA:CPU"}
    return dataclasses.replace(row, cpu_total_bytes=cpu.total_bytes, flops=flops, bytes_accessed=accessed,
                               estimate=estimate)


def state_bytes(builder) -> int:
    """Bytes of the run's whole `TrainState` (weights, statistics, optimizer slots): replicated, on every device."""
    import jax

    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(builder.state))


def with_device_terms(row: plan_row.PlanRow, builder, target: targets.Target, device_memory: int,
                      autotune: bool | None = None) -> plan_row.PlanRow:
    """`row` with what the device adds to its compiler's figure (`device_bytes.planned`: workspace, autotuning,
    the state training holds beside the step, the next batch, the margin); `total_bytes` and `fits` are then the
    device's, `compiler_total_bytes` the compiler's."""
    autotune = device_bytes.autotunes() if autotune is None else autotune
    largest, tuning = device_bytes.convolution_bytes(builder.windows())
    held = state_bytes(builder)
    terms = device_bytes.planned(row.total_bytes, target.platform, state_bytes=held,
                                 largest_convolution_bytes=largest // row.partitions,
                                 autotuning_convolution_bytes=tuning // row.partitions,
                                 next_batch_bytes=max(0, row.argument_bytes - held), autotune=autotune)
    seconds = device_bytes.expected_compile_seconds((row.estimate or {}).get("seconds"), target.platform, autotune)
    return dataclasses.replace(row, compiler_total_bytes=row.total_bytes, total_bytes=terms.total_bytes,
                               fits=terms.total_bytes <= device_memory, device_terms=terms.to_json(),
                               expected_compile_seconds=None if seconds is None else round(seconds, 1))


def search(config: config_lib.TrainConfig, shape: tuple[int, ...], partitions: Sequence[int], target: targets.Target,
           *, layouts_to_try="default", device_memory: int | None = None, max_minutes: float | None = None,
           cache: target_compile.PlanCache | None = None,
           log: Callable[[str], None] = lambda line: None) -> list[layout_search.Search]:
    """Ranks the layouts of every N in `partitions` by `target`'s compiler (see the module's docstring).

    Args:
        config, shape: the run and one example, channels last (as `layout_search.search`).
        partitions: core counts N (each at most the target's devices).
        target: a TPU slice or GPUs (`targets.parse`; not `cpu`).
        layouts_to_try: "all", "default" or one layout's dims.
        device_memory: bytes per device (default: the target's, `targets.memory_per_device`).
        max_minutes: start no target compile after this long (None: no bound).
        cache: where compiled figures are kept (None: compile everything).
        log: progress lines.

    Raises:
        ValueError: an N exceeds the target's devices, or no layout of any N divides the volume (one that cannot
            beside others that can is a `Search` with its reason, as `layout_search.search` gives it).
        targets.MissingCompiler: the target's compiler is not installed.
    """
    import jax

    device_memory = targets.memory_per_device(target) if device_memory is None else device_memory
    target_devices = targets.devices(target)  # first: a missing compiler is said before anything is compiled
    cpu_devices = jax.devices("cpu")
    for count in partitions:
        device_mesh.require_devices(count, len(target_devices), f"{count} partitions on {target.name}")
        device_mesh.require_devices(count, len(cpu_devices), f"{count} partitions (the CPU estimate)")
    builder = layout_search.lazy_builder(config, shape)
    plans = [(count, layout_search.candidates(layouts_to_try, count, config, shape, builder))
             for count in partitions]
    layout_search.every_count_refused(plans)
    builder = builder()
    layout_search.say_refused_and_replaced(plans, log)
    started = time.perf_counter()
    everything = list(dict.fromkeys(d for _, found in plans for d in found.kept))
    cpu: dict[tuple[int, ...], plan_row.PlanRow] = {}
    for number, dims in enumerate(everything, 1):
        label = ",".join(map(str, dims))
        row = layout_measure.measure(builder, dims, cpu_devices[:math.prod(dims)], device_memory)
        cpu[dims] = row
        log(f"[CPU estimate {number}/{len(everything)}] {label}: {sizes.human_bytes(row.total_bytes)} per device "
            f"({row.compile_seconds:.1f} s)")
    order, over = [], {}
    share = LEAST_SHARE_OF_CPU[target.platform]
    for _, found in plans:
        ranked = layout_search.rank_rows([cpu[d] for d in found.kept], device_memory)
        for row in ranked:
            if row.total_bytes * share > device_memory:
                over[row.input_partition_dims] = row.total_bytes
            elif row.input_partition_dims not in order:
                order.append(row.input_partition_dims)
    why = _why_not_compiled(target, device_memory)
    if over:
        log(f"{len(over)} layout(s) not compiled for {target.name}: their CPU figure per device {why}")
    measured: dict[tuple[int, ...], plan_row.PlanRow | target_compile.Refusal] = {}
    left: list[tuple[int, ...]] = []
    for number, dims in enumerate(order, 1):
        label = ",".join(map(str, dims))
        if max_minutes is not None and time.perf_counter() - started > max_minutes * 60:
            left.append(dims)
            continue
        log(f"[{target.name} {number}/{len(order)}] compiling {label} ...")
        begun = time.perf_counter()
        row = layout_measure.measure(builder, dims, target_devices[:math.prod(dims)], device_memory,
                                    compile_only=True, cache=cache)
        if isinstance(row, plan_row.PlanRow):
            row = with_device_terms(_with_estimate(row, cpu[dims], target, config.precision), builder, target,
                                    device_memory)
            figures = (f"{sizes.human_bytes(row.total_bytes)} per device (its compiler "
                       f"{sizes.human_bytes(row.compiler_total_bytes)}, CPU {sizes.human_bytes(row.cpu_total_bytes)}), "
                       f"halo {sizes.human_bytes(row.halo_bytes)}"
                       + (f", ring attention {sizes.human_bytes(row.ring_bytes)}" if row.ring_bytes else ""))
            figures += f"; {xla_compile.describe(row.compiler_options)}" if row.compiler_options else ""
        else:
            figures = row.describe()
        measured[dims] = row
        log(f"[{target.name} {number}/{len(order)}] {label}: {figures} "
            f"({'from the plan cache' if getattr(row, 'cached', False) else f'{time.perf_counter() - begun:.1f} s'})")
    if left:
        log(f"--max-minutes {max_minutes:g} reached: {len(left)} layout(s) not compiled for {target.name}: "
            + " ".join(",".join(map(str, d)) for d in left))
    reference = (1,) * len(shape[:-1]) + (1, 1)
    base = measured.get(reference)
    results = []
    for count, found in plans:
        kept = found.kept
        rows = [measured[d] for d in kept if isinstance(measured.get(d), plan_row.PlanRow)]
        if isinstance(base, plan_row.PlanRow) and base.temp_bytes:
            rows = [dataclasses.replace(r, efficiency=round(base.temp_bytes / (r.partitions * r.temp_bytes), 4))
                    if r.temp_bytes else r for r in rows]
        refused = [measured[d] for d in kept if isinstance(measured.get(d), target_compile.Refusal)]
        results.append(layout_search.Search(
            count, layout_search.rank_rows(rows, device_memory) if layouts_to_try == "all" else rows,
            found.pruned, round(sum(r.compile_seconds for r in [*rows, *refused] if not getattr(r, "cached", False)),
                                1),
            refused, [(d, over[d]) for d in kept if d in over], [d for d in kept if d in left], found.replaced,
            found.cannot_divide, why if any(d in over for d in kept) else ""))
    return results
