"""Compiling one layout and reading what its compiler says: per-device bytes, halo, gathers, or a refusal.

`measure` compiles a layout of a `compiled_step.StepBuilder` on some devices (this machine's, or a target's for
compiling only) and turns the compiler's `memory_analysis()`, `cost_analysis()` and HLO into a
`plan_row.PlanRow`, or, where a target's compiler runs out of memory, a `target_compile.Refusal`;
`compile_layout` does it for a config's own layout. `layout_search` enumerates and ranks the layouts.

The halo a row measures is set beside the least any correct step must exchange for its layout (`lower_bound`, from
the network's windows, nothing compiled): a layer that exchanges more than it must shows as a ratio well above 1.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from trainer.parallel import halo, ring_attention, xla_compile
from trainer.plan import compiled_step, gathers, ring_traffic, target_compile, targets
from trainer.plan.plan_row import PlanRow


def measure(builder: compiled_step.StepBuilder, dims: tuple[int, ...], devices, device_memory: int | None,
            compile_only: bool = False, cache: target_compile.PlanCache | None = None) -> PlanRow | target_compile.Refusal:
    """Compiles `dims` on `devices` and reads the compiler's figures; a `Refusal` where it runs out of memory.

    `dims` are checked already (`StepBuilder.check_layout`, or pruned by `layout_search.prune`).
    `compile_only`: the devices are a target's (`targets.devices`), not this process's.
    `cache`: figures of a step compiled before (the same lowered program for the same compiler) are read back.
    """
    import jax

    started = time.perf_counter()
    with target_compile.compile_only(compile_only):
        with ring_attention.recording() as blocks:
            lowered, distribution = builder.lower_layout(dims, devices)
        score_bytes, unsplit_score_bytes = ring_traffic.scores(blocks)
        key = None if cache is None else cache.key(lowered.as_text(), devices)
        found = None if cache is None else cache.load(key)
        if found is not None:
            found = (target_compile.Refusal.from_json(found) if "needed_bytes" in found else PlanRow.from_json(found))
            if isinstance(found, PlanRow):
                found = dataclasses.replace(found, fits=None if device_memory is None else
                                            found.total_bytes <= device_memory)
            if isinstance(found, PlanRow):
                found = dataclasses.replace(found, attention_score_bytes=score_bytes,
                                            unsplit_score_bytes=unsplit_score_bytes)
            return dataclasses.replace(found, cached=True)
        try:
            compiled, options = xla_compile.compile(lowered)
        except jax.errors.JaxRuntimeError as error:
            refused = target_compile.refusal(error, dims, time.perf_counter() - started)
            if refused is None:  # not out of memory: the compiler's own first line, not XLA's traceback
                first = str(error).strip().splitlines()[0][:400]
                raise ValueError(f"the {devices[0].platform} compiler failed on input_partition_dims "
                                 f"{','.join(map(str, dims))}: {first} (fullres --verbose plan ... shows all it "
                                 f"said).") from error
            if cache is not None:
                cache.store(key, refused.to_json())
            return refused
    memory = compiled.memory_analysis()
    replica_batch = builder.config.batch_size // distribution.num_replicas
    hlo_text = compiled.as_text()  # the whole program as text: made once, read for each kind of collective
    weight_shapes = gathers.weight_shapes(builder.state)
    # What `compiled_step.communication` reads, with ring attention's permutes (which the halo leaves out) from the
    # same pass over the text.
    halo_bytes, ring_bytes = ring_traffic.permute_bytes(hlo_text)
    found = gathers.activation_gathers(hlo_text, replica_batch, weight_shapes)
    if found and not compile_only:
        found = gathers.of_step(lowered, compiled, replica_batch, weight_shapes)
    gathered = tuple((layer, largest.bytes) for layer, _, largest in gathers.by_layer(found))
    all_to_all = compiled_step.all_to_all_bytes(hlo_text)
    windows = builder.windows()
    bound = lower_bound(windows, dims, distribution.num_replicas)
    total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes \
        - memory.alias_size_in_bytes
    costs = compiled.cost_analysis()
    costs = (costs[0] if isinstance(costs, (list, tuple)) and costs else costs) or {}
    row = PlanRow(math.prod(dims), tuple(dims), memory.temp_size_in_bytes, memory.argument_size_in_bytes, total,
                  None, len(found), halo_bytes, None if device_memory is None else total <= device_memory, bound,
                  compile_seconds=round(time.perf_counter() - started, 2), flops=costs.get("flops"),
                  bytes_accessed=costs.get("bytes accessed"),
                  compiler_seconds=costs.get("optimal_seconds") if compile_only else None,
                  gathered=gathered, all_to_all_bytes=all_to_all,
                  compiler_options=", ".join(f"{k}={str(v).lower()}" for k, v in options.items()),
                  ring_bytes=ring_bytes, attention_score_bytes=score_bytes,
                  unsplit_score_bytes=unsplit_score_bytes)
    if cache is not None:
        cache.store(key, row.to_json())
    return row

def compile_layout(config, shape: tuple[int, ...], target: targets.Target):
    """The row of `config`'s own layout on `target` (its first N devices): a `PlanRow` or a `target_compile.Refusal`.

    Args:
        config: the run (`compiled_step.plan_config`); `config.partition` is the layout, N its product.
        shape: one example, channels last (`compiled_step.example_shape`).
        target: where it is compiled (`targets.parse`).

    Raises:
        targets.MissingCompiler: the target's compiler is not installed (the message says how to install it).
        ValueError: the target has fewer devices than the layout's N.
    """
    dims = tuple(config.partition.input_partition_dims)
    devices = targets.devices(target)
    if math.prod(dims) > len(devices):
        raise ValueError(f"--target {target.name} has {len(devices)} devices; the layout {list(dims)} needs "
                         f"{math.prod(dims)}.")
    builder = compiled_step.StepBuilder(config, tuple(shape))
    builder.check_layout(dims, math.prod(dims))
    return measure(builder, dims, devices[:math.prod(dims)], targets.memory_per_device(target),
                   compile_only=target.platform != "cpu")


def _extension(low: int, high: int, parts: int) -> int:
    """Rows a shard must receive along one axis: none unsplit; one side's worth for 2 parts; both sides for more."""
    if parts == 1:
        return 0
    return max(low, high) if parts == 2 else low + high


def _halo_volume(shard: Sequence[int], sides: Sequence[tuple[int, int]], parts: Sequence[int]) -> int:
    """Elements a shard needs from its neighbours: its extended box minus itself (faces, edges and corners)."""
    extended = math.prod(s + _extension(low, high, p) for s, (low, high), p in zip(shard, sides, parts))
    return extended - math.prod(shard)


def lower_bound(windows: Sequence[halo.Window], dims: Sequence[int], replicas: int = 1) -> int:
    """Bytes per device that any correct partitioned training step must exchange with neighbours, for `dims`.

    Per windowed op (convolution, pooling window): the forward pass needs, at
    the op's input, the shard's face area times the window's reach on each
    split side (plus edges and corners where two or more axes are split) for
    every input channel; the backward pass needs the same of the output
    gradient, per output channel, to form the input gradient (not for the
    image, which has none). Shards are those of the worst-placed device: an
    interior one receives both sides, with 2 parts each receives one.
    Gradients of the weights need no further halo (the forward halo can be kept).

    Args:
        windows: `halo.windows(...)` of the model (global shapes, batch of one replica group).
        dims: input_partition_dims, batch first and channels last.
        replicas: data-parallel replicas sharing the batch.
    """
    parts = tuple(dims[1:-1])
    total = 0
    for op in windows:
        if len(op.in_spatial) != len(parts):
            continue
        batch = op.batch // replicas
        shard_in = [s // p for s, p in zip(op.in_spatial, parts)]
        forward = [(low, max(0, window - stride - low)) for window, stride, low in zip(op.window, op.strides, op.low)]
        total += _halo_volume(shard_in, forward, parts) * batch * op.in_channels * op.itemsize
        if op.needs_gradient:
            shard_out = [s // p for s, p in zip(op.out_spatial, parts)]
            backward = [((window - 1 - low) // stride, (low - 1) // stride + 1 if low > 0 else 0)
                        for window, stride, low in zip(op.window, op.strides, op.low)]
            total += _halo_volume(shard_out, backward, parts) * batch * op.out_channels * op.itemsize
    return total
