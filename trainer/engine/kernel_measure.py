"""Timing one layer's kernel candidates on the run's device: its op's forward pass and VJP, compiled alone.

For a `kernel_layers.Signature` and each candidate value of its kind (`kernels.candidates`), the op is traced as
the step traces it (Keras's JAX backend, the candidate set by `kernels.using`, the split's formulation by
`split_ops.splitting`) on one device's block of the input (`Signature.per_device_shape`), compiled, run `WARMUP`
times and then timed `REPEATS` times (`seconds`); its time is the median. Candidates whose programs are the same text (a
candidate that does not apply to this op, e.g. the per-tap weight gradient of a grouped convolution) share one
timing. A candidate that does not compile is left out, with why. The clock is `Budget`'s: no candidate starts
after its deadline. `signature_times` and `flag_sets` read a signature's times from the cache (`kernel_cache`) or
measure them into it; `compare_steps` times the whole step with the choice against the fixed kernels.

Example:
    >>> import time
    >>> from trainer.parallel import kernel_layers
    >>> signature = kernel_layers.Signature("normalization", (1, 8, 8, 4), (), "float32", "",
    ...                                     (("axes", (1, 2)), ("keepdims", True)), (1, 1))
    >>> times = measure(signature, ("xla", "fused"), 1, Budget(time.perf_counter() + 60))
    >>> sorted(times)
    ['fused', 'xla']
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from trainer.engine import kernel_cache

if TYPE_CHECKING:
    from trainer.parallel import kernels

WARMUP = 2
REPEATS = 5
SAMPLE_SECONDS = 0.01


@dataclasses.dataclass
class Budget:
    """The measuring's deadline (a `time.perf_counter()` value) and how many candidates it timed."""

    deadline: float
    timings: int = 0

    def left(self) -> bool:
        return time.perf_counter() < self.deadline


def _operation(signature):
    """`f(*inputs)`: the op of `signature` through Keras's JAX backend (which the installed kernels route)."""
    from keras.src.backend.jax import nn

    options = dict(signature.options)
    if signature.kind == "convolution":
        return lambda x, w: nn.conv(x, w, options["strides"], options["padding"], options["data_format"],
                                    options["dilation_rate"])
    if signature.kind == "transposed convolution":
        return lambda x, w: nn.conv_transpose(x, w, options["strides"], options["padding"],
                                              options["output_padding"], options["data_format"],
                                              options["dilation_rate"])
    return lambda x: nn.moments(x, options["axes"], options["keepdims"])


def _inputs(signature, replicas: int) -> list:
    """Random inputs of one device's block (the kernel whole), in the op's dtypes."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    shapes = [(signature.per_device_shape(replicas), signature.dtype)]
    if signature.kernel:
        shapes.append((signature.kernel, signature.kernel_dtype))
    return [jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype=dtype) for shape, dtype in shapes]


def lower(signature, field: str, value: str, replicas: int):
    """(the lowered forward + VJP of `signature`'s op with `kernels.FIELD=value`, its arguments)."""
    import jax
    import jax.numpy as jnp

    from trainer.parallel import kernels, split_ops

    operation = _operation(signature)
    inputs = _inputs(signature, replicas)
    split = (1, *signature.split, 1)  # the op's own split, so its formulation is the step's (spatial_parts)

    def forward_and_vjp(*arguments):  # a new function for every value: jit's trace cache knows no context
        *arrays, cotangent = arguments
        value_out, pullback = jax.vjp(operation, *arrays)
        return value_out, pullback(cotangent)

    with kernels.using(kernels.KernelsConfig(**{field: value})), split_ops.splitting(split):
        outputs = jax.eval_shape(operation, *inputs)
        rng = np.random.default_rng(1)
        cotangent = jax.tree_util.tree_map(
            lambda out: jnp.asarray(rng.normal(size=out.shape).astype(np.float32), dtype=out.dtype), outputs)
        arguments = (*inputs, cotangent)
        return jax.jit(forward_and_vjp).lower(*arguments), arguments


def seconds(compiled, arguments, repeats: int = REPEATS) -> float:
    """The median of `repeats` timed samples of `compiled` after `WARMUP` untimed runs; a sample is the mean of as
    many runs as fill `SAMPLE_SECONDS` (one, for a program that long), so that a program of microseconds is not
    timed by the host's scheduler."""
    import jax

    started = time.perf_counter()
    for _ in range(WARMUP):
        jax.block_until_ready(compiled(*arguments))
    runs = max(1, min(1000, int(SAMPLE_SECONDS / max((time.perf_counter() - started) / WARMUP, 1e-9))))
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(runs):
            jax.block_until_ready(compiled(*arguments))
        samples.append((time.perf_counter() - started) / runs)
    return statistics.median(samples)


def measure(signature, values, replicas: int, budget: Budget, compiler_options: dict | None = None,
            notes: dict | None = None) -> dict[str, float] | None:
    """{value: seconds} for each candidate `values` of `signature`'s kind; None where the budget ran out first.

    Args:
        compiler_options: XLA options every candidate is compiled with (a flag set: `kernels.FLAG_SETS`).
        notes: {value: why} gets each candidate that did not compile (left out of the result).
    """
    import jax

    from trainer.parallel import kernels

    field = kernels.KINDS[signature.kind]
    times, programs = {}, {}  # programs: program text -> the value timed with it
    for value in values:
        if not budget.left():
            return None
        try:
            lowered, arguments = lower(signature, field, value, replicas)
            text = lowered.as_text()
            if text in programs:  # the same program as a value timed already
                times[value] = times[programs[text]]
                continue
            compiled = (lowered.compile(compiler_options=dict(compiler_options)) if compiler_options
                        else lowered.compile())
        except (jax.errors.JaxRuntimeError, ValueError, NotImplementedError) as error:
            if notes is not None:
                notes[value] = f"{type(error).__name__}: {str(error)[:200]}"
            continue
        times[value] = seconds(compiled, arguments)
        programs[text] = value
        budget.timings += 1
    return times


def fastest(times: dict[str, float], fallback: str) -> str:
    """The value of least time (`fallback`, the field's, on a tie or where nothing was timed)."""
    if not times:
        return fallback
    best = min(times.values())
    return fallback if times.get(fallback) == best else min(times, key=times.get)


def flag_set(totals: dict[str, float]) -> str:
    """The flag set of least summed time ("none", XLA's defaults, on a tie or where nothing was timed)."""
    return fastest(totals, "none")


def entry_key(signature, replicas: int) -> str:
    """The cache's key (`kernel_cache`) of a signature's times at `replicas` replicas."""
    return f"replicas={replicas} {signature.key}"


def signature_times(signature, values, default: str, replicas: int, cache, budget: Budget, notes: dict) -> dict:
    """{"times": {value: seconds}, "choice", "cached"} for one signature's candidate `values` (`kernels.candidates`),
    from the cache (`kernel_cache.KernelCache`) or measured; `default`: the field's value, kept where nothing is
    timed."""
    key = entry_key(signature, replicas)
    cached = cache.entries["signatures"].get(key) or {}
    times = cached.get("times")
    served = isinstance(times, dict) and set(values) <= set(times)
    if not served:
        noted = {}
        times = measure(signature, values, replicas, budget, notes=noted)
        if noted:
            notes[signature.key] = noted
        if times is None:  # the time bound came first: the field's value
            return {"times": {}, "choice": default, "reached": False}
        cache.entries["signatures"][key] = {**cached, "times": times}
    times = {value: times[value] for value in values if value in times}
    return {"times": {value: round(t, 7) for value, t in times.items()},
            "choice": fastest(times, default), "reached": True, "cached": served}


def flag_sets(signatures, layers, rows, platform, replicas, cache, budget) -> dict[str, float]:
    """{flag set: seconds summed over the step's layers} for the sets timed on every signature; {} off a GPU (the
    sets are XLA GPU options, which other compilers ignore) or where no signature was reached."""
    from trainer.parallel import kernels

    reached = [key for key, row in rows.items() if row["times"]]
    if platform not in ("gpu", "cuda", "rocm") or not reached:
        return {}
    totals = {"none": sum(rows[key]["times"][rows[key]["choice"]] * len(layers[key]) for key in reached)}
    for name, options in kernels.FLAG_SETS.items():
        if name == "none":
            continue
        total = 0.0
        for key in reached:
            signature, value = signatures[key], rows[key]["choice"]
            entry = cache.entries["signatures"].setdefault(entry_key(signature, replicas), {})
            flagged = entry.setdefault("flag_times", {}).get(f"{name} {value}")
            if flagged is None:
                timed = measure(signature, (value,), replicas, budget, compiler_options=options)
                if not timed:  # out of time, or the set does not compile here: not compared
                    break
                flagged = entry["flag_times"][f"{name} {value}"] = timed[value]
            total += flagged * len(layers[key])
        else:
            totals[name] = round(total, 7)
    return totals


def compare_steps(config, measured, table, layers, replicas, cache, budget, time_step) -> dict:
    """The whole step with the choice against the fixed kernels: {"measured_seconds", "fixed_seconds", "kept",
    "cached"}; "kept" is "fixed" where the choice is the fixed kernels' program."""
    from trainer.parallel import kernel_layers, kernels

    if not table and measured.xla_flags == config.xla_flags:
        return {"kept": "fixed", "why": "every layer's fastest is the fixed kernels'"}
    step_key = hashlib.sha256(json.dumps(
        [sorted((entry_key(kernel_layers.Signature.from_key(key), replicas), len(names))
                for key, names in layers.items()), sorted(table.items()), measured.xla_flags,
         [getattr(config, name) for name in kernels.OP_FIELDS]]).encode()).hexdigest()
    cached = cache.entries["steps"].get(step_key)
    if isinstance(cached, dict) and cached.get("kept") in ("measured", "fixed"):
        return {**cached, "cached": True}
    fixed_seconds = time_step(config, {})
    measured_seconds = time_step(measured, table)
    budget.timings += 2
    step = {"measured_seconds": round(measured_seconds, 6), "fixed_seconds": round(fixed_seconds, 6),
            "kept": "measured" if measured_seconds < fixed_seconds else "fixed"}
    cache.entries["steps"][step_key] = step
    return {**step, "cached": False}


def summary(record: dict, config: kernels.KernelsConfig) -> str:
    """The log line: how long, from where, what was chosen for how many layers, and the step before -> after."""
    kinds = collections.Counter(row["kind"] for row in record["layers"])
    applied = record["applied"]["layers"]
    picked = collections.Counter((row["kind"], applied[row["signature"]]) for row in record["layers"]
                                 if row["signature"] in applied)
    said = [f"{value} for {count} of {kinds[kind]} {kind} layers" for (kind, value), count in sorted(picked.items())]
    unreached = sum(1 for row in record["layers"] if row.get("reached") is False)
    step = record["step"]
    where = (f"from the cache {config.cache or kernel_cache.default_path()}" if record["served"] == "cache"
             else f"measured ({record['measurements']} timings)")
    timing = (f"step {step['fixed_seconds'] * 1e3:.1f} ms -> "
              f"{min(step['fixed_seconds'], step['measured_seconds']) * 1e3:.1f} ms" if "fixed_seconds" in step
              else "step unchanged")
    return (f"kernels: {record['seconds']:.1f} s, {where}, {len(record['layers'])} layers of "
            f"{len({row['signature'] for row in record['layers']})} signatures: "
            + (", ".join(said) if said else "the fixed kernels everywhere")
            + f"; xla_flags {record['applied']['xla_flags']}; {timing} (kept the {step['kept']} program)"
            + (f"; {unreached} layers not reached in --set kernels.measure_seconds={config.measure_seconds:g} keep "
               "the fixed kernels" if unreached else ""))
