"""One row of `benchmarks/peer/peer_bench.py`, in a process of its own: a PyTorch step or fullres's training step.

`peer_bench.py` starts `python benchmarks/peer/peer_rows.py ROW_JSON` per row, so that each row's allocator peak is its
own (neither JAX's `peak_bytes_in_use` nor a process's RSS can be reset), a row that runs out of memory or hangs
takes only itself down, and torch and JAX never share a process. The figures come back as one line on stdout,
`ROW_RESULT {...}`, in plain units (bytes, seconds).

fullres's side is the step `fullres train` runs (`engine.program.build_model` and `jit_step`, through
`device_check_rows.Step`, as `device_check.py` compiles it) for the zoo's port of the network
(`tests/trainer/zoo/NETWORK.py:build`, or `:tiny`), on one device, on a synthetic batch held there; the row's
`sets` (`--set` strings, e.g. `kernels.norm=fused`) are applied as `fullres train --set` applies them. With
`trace`, three more steps run under JAX's profiler and the per-kernel times are summed by the layer kind and
direction of the convolution each kernel computes (`hlo_kernels.py` reads the same compiled program).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
MARK = "ROW_RESULT "
STARTED = time.perf_counter()


def fullres_config(row: dict):
    """The `TrainConfig` of a fullres row: the zoo network as a user's `--model`, the row's precision, batch and sets."""
    from common import parsing
    from trainer.plan import compiled_step

    import peer_torch

    source = f"{peer_torch.ZOO[row['network']]}:{'tiny' if row['tiny'] else 'build'}"
    settings = {"precision": row["precision"], "augmentation": "none", "batch_size": row["batch_size"],
                **parsing.parse_settings(row.get("sets", [])),
                **({"kernels.cache": row["kernel_cache"]} if row.get("kernel_cache") else {})}
    return compiled_step.plan_config(source, "default", settings)


def fullres_row(row: dict) -> dict:
    """Median step time, the allocator's peak, compile seconds and the compiler's figures of fullres's step."""
    import jax
    import numpy as np

    import device_check_rows
    import device_readings
    from trainer.models import losses

    try:
        config = fullres_config(row)
    except ValueError as error:  # a `--set` this checkout does not know (a candidate not yet built): not run
        return {"status": "not_run", "error": str(error)}
    device = jax.devices()[0]
    step = device_check_rows.Step(row, config)
    # A `kernels.choose=measure` row measures as `fullres train` does at its first compile; the others (the baseline
    # rows: "auto") keep the fields' kernels, as `jit_step` compiles them.
    chosen = measured_kernels(step, config, row) if config.kernels.choose == "measure" else None
    compiled, arguments, image_shape, seconds = step.compile(row["size"])
    figures = device_readings.compiler_figures(compiled)
    ran = step.timed(compiled, arguments, image_shape, row["warmup"], row["steps"], STARTED + row["limit_seconds"] - 5)
    times = ran["times"]
    result = {"status": "ok", "median_step_seconds": statistics.median(times), "steps": len(times),
              "warmup_steps": row["warmup"], "compile_seconds": seconds, "first_step_seconds": ran["first"],
              "loss": float(ran["metrics"]["loss"]), "class_balance": losses.class_balance(config.class_balance, True),
              "parameters": int(sum(np.prod(v.shape) for v in step.model.trainable_variables)),
              "device_compiler": figures, "device": device.device_kind, "versions": versions(),
              **device_readings.device_figures(device)}
    if chosen is not None:
        result["kernel_choice"] = chosen
    if row.get("trace_dir"):
        result["kernels"] = traced_kernels(row, step.model, compiled, ran["state"], ran["inputs"], ran["labels"],
                                           ran["step_sharding"])
    return result


def measured_kernels(step, config, row: dict) -> dict:
    """The row's kernels measured on its device (`step.choose_kernels`, as `fullres train` measures them), set
    into `step`'s jitted step; what they cost and what they chose, per layer kind."""
    import collections

    from trainer.engine import step as step_lib
    from trainer.plan import compiled_step

    image_shape = (config.batch_size, *compiled_step.example_shape(config, (row["size"],) * 3))
    said = []
    choice, step.jitted, _ = step_lib.choose_kernels(config, step.task, step.model, step.optimizer,
                                                     step.distribution, step.state, image_shape, said.append)
    record = choice.record
    by_kind = collections.defaultdict(collections.Counter)  # kind -> {value: layers}
    for layer in record["layers"]:
        by_kind[layer["kind"]][choice.layers.get(layer["signature"], "fixed")] += 1
    return {"seconds": record["seconds"], "served": record["served"], "measurements": record["measurements"],
            "by_kind": {kind: dict(counts) for kind, counts in by_kind.items()},
            "xla_flags": choice.kernels.xla_flags, "step": record["step"],
            "not_reached": sum(1 for layer in record["layers"] if not layer["reached"]), "log": said}


def traced_kernels(row: dict, model, compiled, state, inputs, labels, step_sharding) -> dict:
    """Three steps under JAX's profiler; the device kernels' time summed per convolution kind (`hlo_kernels`)."""
    import jax
    import numpy as np

    import hlo_kernels

    folder = os.path.join(row["trace_dir"], row["name"].replace(" ", "_"))
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        for number in range(3):
            state, metrics = compiled(state, inputs, labels, jax.device_put(np.int32(number), step_sharding))
            jax.block_until_ready((state, metrics))
    found = sorted(glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True))
    if not found:
        return {"error": f"the profiler wrote no perfetto trace under {folder}"}
    table = hlo_kernels.classify(compiled.as_text(), hlo_kernels.layer_classes(model))
    times = hlo_kernels.kernel_times(found[-1], table)
    for raw in glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True):
        os.remove(raw)  # the profiler's own format, large; the perfetto trace beside it stays
    return {"trace": os.path.relpath(found[-1], row["trace_dir"]), "steps": 3, **times}


def versions() -> dict:
    import importlib.metadata

    found = {}
    for name in ("jax", "jaxlib", "keras", "jax-cuda12-plugin", "jax-cuda13-plugin", "torch", "monai",
                 "dynamic-network-architectures"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main() -> None:
    row = json.loads(sys.argv[1])
    sys.path.insert(0, REPOSITORY)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "device"))  # device_readings: both sides read alike
    if row["side"] == "torch":
        import importlib.util

        import peer_torch

        # fullres's loss module alone (jax.numpy, no Keras, no device): its class balance for whole volumes (0.5).
        spec = importlib.util.spec_from_file_location("losses", os.path.join(REPOSITORY, "trainer/models/losses.py"))
        losses = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(losses)
        row["deadline"] = STARTED + row["limit_seconds"] - 5
        balance = losses.class_balance(None, whole_volumes=True)
        try:
            result = {**peer_torch.run(row, balance), "class_balance": balance, "versions": versions()}
        except Exception as error:  # noqa: BLE001  (reported in the row; the next row still runs)
            result = {"status": "failed", "error": f"{type(error).__name__}: {str(error).splitlines()[0][:500]}"}
    else:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the peak is what the row used
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "")  # compile seconds are the compiler's, not a cache read
        import trainer  # noqa: F401  (Keras on JAX, as every fullres command)
        import jax

        if row["platform"] == "cpu":
            jax.config.update("jax_platforms", "cpu")
        try:
            result = fullres_row(row)
        except Exception as error:  # noqa: BLE001
            text = str(error)
            oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
            result = {"status": "out_of_memory" if oom else "failed",
                      "error": f"{type(error).__name__}: {(text.strip().splitlines() or [''])[0][:500]}"}
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
