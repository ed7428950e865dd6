"""Timing one layer's kernel candidates on the run's device: its op's forward pass and VJP, compiled alone.

For a `kernel_layers.Signature` and each candidate value of its kind (`kernels.candidates`), the op is traced as
the step traces it (Keras's JAX backend, the candidate set by `kernels.using`, the split's formulation by
`split_ops.splitting`) on one device's block of the input (`Signature.per_device_shape`), compiled, run `WARMUP`
times and then timed `REPEATS` times (`seconds`); its time is the median. Candidates whose programs are the same text (a
candidate that does not apply to this op, e.g. the per-tap weight gradient of a grouped convolution) share one
timing. A candidate that does not compile is left out, with why. The clock is `Budget`'s: no candidate starts
after its deadline.

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

import dataclasses
import statistics
import time

import numpy as np

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
            compiled = lowered.compile(compiler_options=dict(compiler_options)) if compiler_options else \
                lowered.compile()
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
