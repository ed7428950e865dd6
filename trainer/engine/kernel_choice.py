"""A run's kernels, measured on its own device (`--set kernels.choose=measure`, the default on a GPU).

At a run's first compile:

1. the step is traced once to find each distinct op signature of the kinds `kernels.KINDS` names (convolution,
   transposed convolution, normalization: `kernel_layers.recording`), with the layers that have it;
2. each signature's candidates (`kernels.candidates`, the values the setting allows) are timed on the device, forward
   pass and VJP (`kernel_measure`); each layer keeps its signature's fastest. Signatures with the most work first:
   those `kernels.measure_seconds` does not reach keep the fields' values;
3. on a GPU, each XLA flag set (`kernels.FLAG_SETS`) is timed per signature the same way, and the one set of least
   time summed over the step's layers is kept;
4. the whole step is compiled with that choice and with the fields' (`fixed`), a few steps of each are timed, and the
   faster program is kept: the choice is never slower than the fixed kernels on that device.

Every time is remembered in the cache (`kernel_cache`): a second run on the same device kind and software measures
nothing. The choice, every candidate's time per layer and the step comparison go into `run_record.json`
("kernel_choice"); a resume keeps the run's recorded choice. One log line says what it cost and what it chose.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable

from trainer.engine import kernel_cache, kernel_measure
from trainer.parallel import kernels

RECORD_KEY = "kernel_choice"  # run_record.json's


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the run's step is traced and compiled with: `kernels` (its `xla_flags` the chosen set) and `layers`
    ({signature key: value}, {} where the fields hold everywhere); `record` is run_record.json's entry (None under
    `fixed`)."""

    kernels: kernels.KernelsConfig
    layers: dict
    record: dict | None = None


def choose(config: kernels.KernelsConfig, device, replicas: int, discover: Callable[[], list],
           time_step: Callable[[kernels.KernelsConfig, dict], float], recorded: dict | None,
           log: Callable[[str], None], processes: int = 1) -> Choice:
    """The run's kernels under `config.choose` (see the module).

    Args:
        device: one of the run's devices (its kind and platform key the cache).
        replicas: the run's data-parallel replicas (a device's block of the batch).
        discover: `() -> [(layer, kernel_layers.Signature)]` of the step as traced under the fields.
        time_step: `(kernels, layers) -> seconds` of a step compiled with them (the median of a few).
        recorded: run_record.json's "kernel_choice" of the run being resumed, or None.
        processes: the run's process count; a multi-process run keeps the fixed kernels (each process would
            measure on its own and could choose otherwise).
    """
    if config.resolved_choose(device.platform) == "fixed":
        return Choice(config, {})
    if recorded:
        applied = recorded.get("applied") or {}
        log(f"kernels: the run's recorded choice ({len(applied.get('layers') or {})} signatures not the fields', "
            f"xla_flags {applied.get('xla_flags', config.xla_flags)}; run_record.json)")
        return Choice(dataclasses.replace(config, xla_flags=applied.get("xla_flags", config.xla_flags)),
                      dict(applied.get("layers") or {}), recorded)
    if processes > 1:
        log("kernels: measure runs in one process only; this multi-process run keeps the fixed kernels "
            "(--set kernels.choose=fixed says so)")
        return Choice(config, {})
    started = time.perf_counter()
    layers = collections.defaultdict(list)  # signature key -> the layers that have it, in the order traced
    signatures = {}
    for layer, signature in discover():
        if layer not in layers[signature.key]:
            layers[signature.key].append(layer)
        signatures[signature.key] = signature
    discovered = time.perf_counter()
    values = {kind: kernels.candidates(kind, device.platform) for kind in {s.kind for s in signatures.values()}}
    cache = kernel_cache.KernelCache.open(config.cache or kernel_cache.default_path(), kernel_cache.device_key(device),
                                          log)
    budget = kernel_measure.Budget(started + config.measure_seconds)
    rows, notes = {}, {}
    # The most work first (a device's elements × the layers that have it): what the bound cuts is what costs least.
    order = sorted(signatures, key=lambda key: -math.prod(signatures[key].per_device_shape(replicas)) * len(layers[key]))
    for key in order:
        signature = signatures[key]
        rows[key] = kernel_measure.signature_times(signature, values[signature.kind],
                                                   getattr(config, kernels.KINDS[signature.kind]), replicas, cache,
                                                   budget, notes)
    flags = kernel_measure.flag_sets(signatures, layers, rows, device.platform, replicas, cache, budget)
    chosen_flags = kernel_measure.flag_set(flags) if flags else config.xla_flags
    table = {key: row["choice"] for key, row in rows.items()
             if row["choice"] != getattr(config, kernels.KINDS[signatures[key].kind])}
    measured = dataclasses.replace(config, xla_flags=chosen_flags)
    timed = time.perf_counter()
    step = kernel_measure.compare_steps(config, measured, table, layers, replicas, cache, budget, time_step)
    cache.save(log)
    kept = step["kept"] == "measured"
    choice = Choice(measured if kept else config, table if kept else {})
    seconds = round(time.perf_counter() - started, 3)
    phases = {"trace": discovered - started, "candidates": timed - discovered, "step_comparison": time.perf_counter()
              - timed}  # the bound (measure_seconds) counts from the start and stops candidates, not the comparison
    record = {"choose": "measure", "device": cache.key, "seconds": seconds, "measurements": budget.timings,
              "phase_seconds": {name: round(value, 3) for name, value in phases.items()},
              "served": "cache" if rows and all(row.get("cached") for row in rows.values()) and (
                  step.get("cached") is not False) else "measured",
              "measure_seconds": config.measure_seconds,
              "layers": [{"layer": layer, "kind": signatures[key].kind, "signature": key,
                          "per_device_shape": list(signatures[key].per_device_shape(replicas)), **rows[key],
                          **({"notes": notes[key]} if key in notes else {})}
                         for key in signatures for layer in layers[key]],
              "xla_flags": {"seconds_summed": flags, "choice": chosen_flags}, "step": step,
              "applied": {"xla_flags": choice.kernels.xla_flags, "layers": choice.layers}}
    log(kernel_measure.summary(record, config))
    return dataclasses.replace(choice, record=record)


def step_seconds(compiled, arguments, state, steps: int = 3) -> float:
    """The median of `steps` timed runs of the compiled train step (after one untimed) on `state` (placed, a copy:
    the step donates it) and a batch of zeros laid out as `arguments` (`step.step_arguments`) say."""
    import jax
    import numpy as np

    _, inputs, labels, number = jax.tree_util.tree_map(
        lambda spec: jax.device_put(np.zeros(spec.shape, spec.dtype), spec.sharding), arguments)
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        state, metrics = compiled(state, inputs, labels, number)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2]
