"""One row of `benchmarks/device/device_check.py`, in a process of its own: a training step, predict's pass, or the input path.

`device_check.py` starts `python benchmarks/device/device_check_rows.py ROW_JSON` once per row, so that a row that
runs out of device memory, hangs or crashes takes only itself down, and so that the allocator's peak
(`memory_stats()["peak_bytes_in_use"]`, which JAX cannot reset) is that row's alone. The row's figures come
back as one line on stdout, `ROW_RESULT {...}`. Figures are plain units: bytes, seconds, examples/s.

What each part runs (nothing here is a copy of fullres's code; each calls the code `fullres` runs):

* train: the step `fullres train` runs (`engine.program.build_model` and `engine.step.jit_step`, the config
  resolved by `compiled_step.plan_config` as `fullres plan` resolves it), on one device, on a synthetic batch held on the
  device, so the time is the device's alone. Lowered and compiled ahead, so the compiler's own figures
  (`memory_analysis`, `cost_analysis`) are read before anything runs. With `fit` (the largest cube), sizes are
  compiled from the largest down until the compiler's figure fits the allocator's limit, then run.
* predict: `inference.VolumePredictor.probabilities`, the whole-volume pass `fullres predict` makes per scan
  (its weights untrained: time and memory do not depend on their values; reading and writing the scan files
  are not included).
* input: `ct_batches.CtBatches` reading synthetic CT records (written by the project's own encoder) and feeding
  the same training step, the loop as `train_loop.loop` runs it: the seconds spent waiting for each next batch.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPOSITORY, "benchmarks", "device"))  # its neighbours, however this file is loaded

import device_readings  # noqa: E402
MARK = "ROW_RESULT "
# The two UNets the issue names: fullres's default, and `--stem none --num-levels 4 --base-filters 16`.
MODELS = {"default": {}, "plain16": {"model.stem": "none", "model.num_levels": 4, "model.base_filters": 16},
          # --tiny (the CPU run of the suite): the same code on a model that compiles in seconds.
          "tiny": {"model.stem": "none", "model.num_levels": 2, "model.base_filters": 4}}


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is the device (or its compiler) running out of memory."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "Out of memory" in text


STARTED = time.perf_counter()


def deadline(row: dict) -> float:
    """When this row must be done measuring: a few seconds before `device_check` stops it."""
    return STARTED + row.get("limit_seconds", float("inf")) - 5


def first_line(error: BaseException) -> str:
    """'XlaRuntimeError: RESOURCE_EXHAUSTED: ...', the error's first line, for the row."""
    first = (str(error).strip().splitlines() or [""])[0][:500]
    return f"{type(error).__name__}: {first}"


def make_config(row: dict):
    """The `TrainConfig` of `row`: the default preset with the row's model, precision and augmentation."""
    from trainer.plan import compiled_step

    settings = {"precision": row["precision"], "augmentation": row["augmentation"], **MODELS[row["model"]]}
    return compiled_step.plan_config("unet3d", "default", settings)


class Step:
    """The training step of `row`'s config on one device: built once, compiled per size."""

    def __init__(self, row: dict, config=None):
        import jax

        from trainer.engine import program, step
        from trainer.parallel import device_mesh
        from trainer.tasks import registry

        self.config = config or make_config(row)  # `peer_rows.py` gives a zoo network's config
        self.task = registry.make_task(self.config)
        self.distribution = device_mesh.make_distribution(self.config.partition, jax.devices()[:1])
        with self.distribution.scope():
            self.model, self.optimizer, _, self.state = program.build_model(self.config, self.task, self.config.steps)
        self.jitted = step.jit_step(self.task, self.model, self.optimizer, self.distribution, self.state, 5,
                                    self.config.kernels)

    def compile(self, size: int):
        """(compiled step, its arguments' shapes, image shape, seconds) for size³ examples."""
        from trainer.engine import step
        from trainer.plan import compiled_step

        shape = compiled_step.example_shape(self.config, (size,) * 3)
        image_shape = (self.config.batch_size, *shape)  # (B, D, H, W, 1)
        arguments = step.step_arguments(self.task, self.state, self.distribution, image_shape)
        started = time.perf_counter()
        compiled = self.jitted.lower(*arguments).compile()
        return compiled, arguments, image_shape, time.perf_counter() - started

    def synthetic_batch(self, arguments, image_shape):
        """A batch on the device in the step's own dtypes and layout: int16 images, uint8 labels."""
        import jax
        import numpy as np

        rng = np.random.default_rng(0)
        _, inputs, labels, _ = arguments
        image = rng.integers(-1000, 1000, image_shape, dtype=np.int16)
        scale = np.full(image_shape[:1], 1.0 / 1000, np.float32)
        label = rng.integers(0, self.config.model.num_classes, image_shape[:-1], dtype=np.uint8)
        return ({"image": jax.device_put(image, inputs["image"].sharding),
                 "scale": jax.device_put(scale, inputs["scale"].sharding)}, jax.device_put(label, labels.sharding))


    def timed(self, compiled, arguments, image_shape, warmup: int, steps: int, deadline: float) -> dict:
        """`warmup` + `steps` runs of the compiled step on a synthetic batch held on the device: each measured step's
        seconds (`times`), the first call's, the last `metrics`, and whether a long step near `deadline` (a
        `time.perf_counter()` value) cut the steps short (`cut`). The placed state and batch come back for a trace."""
        import jax
        import numpy as np

        from trainer.engine import placement

        state = placement.place_state(self.state, self.distribution)
        inputs, labels = self.synthetic_batch(arguments, image_shape)
        step_sharding = arguments[3].sharding
        times, first, cut, metrics = [], None, False, None
        for number in range(warmup + steps):
            started = time.perf_counter()
            state, metrics = compiled(state, inputs, labels, jax.device_put(np.int32(number), step_sharding))
            jax.block_until_ready((state, metrics))
            elapsed = time.perf_counter() - started
            first = elapsed if first is None else first
            if number >= warmup:
                times.append(elapsed)
            # A long step near the row's limit: the steps so far, said so, rather than nothing at the kill.
            if len(times) >= 3 and time.perf_counter() + max(times) > deadline:
                cut = len(times) < steps
                break
        return {"times": times, "first": first, "cut": cut, "metrics": metrics, "state": state, "inputs": inputs,
                "labels": labels, "step_sharding": step_sharding}


def train_row(row: dict) -> dict:
    """Median step time over `steps` after `warmup`, the allocator's peak and the compiler's figures."""
    import jax


    device = jax.devices()[0]
    step = Step(row)
    limit = device_readings.device_figures(device)["bytes_limit"] or row.get("memory_limit_bytes")
    sizes = list(row["sizes"])  # one size, or (fit) the candidates from the largest down
    tried = []
    for size in sizes:
        compiled, arguments, image_shape, seconds = step.compile(size)
        figures = device_readings.compiler_figures(compiled)
        tried.append({"size": size, "compiler_bytes": figures["total_bytes"], "compile_seconds": round(seconds, 2)})
        if not row.get("fit") or limit is None or figures["total_bytes"] is None or figures["total_bytes"] <= limit:
            break
        if size == sizes[-1]:
            return {"status": "out_of_memory", "size": size, "tried": tried, "bytes_limit": limit,
                    "error": f"the compiler's figure for every size tried exceeds the allocator's {limit} bytes"}
    # The allocator's peak so far: the weights, and whatever the compiler's autotuning took from the same allocator.
    # Beside the row's peak, it tells a step's own peak from compilation's.
    result = {"size": size, "tried": tried, "fit_limit_bytes": limit if row.get("fit") else None,
              "compile_seconds": round(seconds, 3), "peak_bytes_after_compile": device_readings.device_figures(device)["peak_bytes"],
              "device_compiler": {**figures, "workspace_bytes": device_readings.workspace_bytes(compiled)},
              "device_roofline": device_readings.roofline_seconds(figures, row), "autotune_why": row.get("autotune_why"),
              # The Keras variables the step's state was read from stay on the device, as in `fullres train`.
              **device_readings.term_figures(step.model, step.state, image_shape, step.state)}
    try:
        ran = step.timed(compiled, arguments, image_shape, row["warmup"], row["steps"], deadline(row))
    except Exception as error:  # noqa: BLE001  (the size it ran out at, for device_check to step down from)
        if not out_of_memory(error):
            raise
        return {**result, "status": "out_of_memory", "error": first_line(error), **device_readings.device_figures(device)}
    loss = float(ran["metrics"]["loss"])
    median = statistics.median(ran["times"])
    result.update(status="ok", median_step_seconds=median, steps=len(ran["times"]), warmup_steps=row["warmup"],
                  steps_cut_by_time_limit=ran["cut"],
                  examples_per_second=image_shape[0] / median, batch_size=image_shape[0], loss=loss,
                  **device_readings.device_figures(device))
    return result


def predict_row(row: dict) -> dict:
    """`fullres predict`'s whole-volume pass of one size³ volume: first call (compile + run), then the median."""
    import jax
    import numpy as np

    from trainer.engine import inference, placement
    from trainer.parallel import device_mesh
    from trainer.tasks import registry

    config = make_config(row)
    task = registry.make_task(config)
    devices = jax.devices()[:1]
    # As `fullres predict` holds it (`trained_run.load`): the model built on the devices, its weights alone placed.
    with device_mesh.make_distribution(config.partition, devices).scope():
        model = task.build_model()
    weights = placement.weights_state(model)
    predictor = inference.VolumePredictor(model, weights, config.partition, devices, config.model.downsampling_levels)
    size = row["sizes"][0]
    volume = np.random.default_rng(0).random((size, size, size, 1), dtype=np.float32)  # (D, H, W, 1)
    batch_shape = (1, *predictor.padded_shape(volume.shape[:-1]), 1)
    compiling = time.perf_counter()
    compiled = predictor.compiled(batch_shape)
    compile_seconds = time.perf_counter() - compiling
    after_compile = device_readings.device_figures(devices[0])["peak_bytes"]  # the weights twice, and what autotuning took
    started = time.perf_counter()
    probabilities = predictor.probabilities(volume)
    first = time.perf_counter() - started
    times = []
    for _ in range(row["steps"]):
        started = time.perf_counter()
        predictor.probabilities(volume)
        times.append(time.perf_counter() - started)
    figures = device_readings.compiler_figures(compiled)
    median = statistics.median(times)
    held = device_readings.term_figures(model, weights, batch_shape, weights)
    return {"status": "ok", "size": size, "first_call_seconds": compile_seconds + first, "median_seconds": median,
            "calls": len(times), "compile_seconds": compile_seconds, "peak_bytes_after_compile": after_compile,
            **held, "placed_before_compile_bytes": held["state_bytes"],
            "output_shape": list(probabilities.shape),
            "device_compiler": {**figures, "workspace_bytes": device_readings.workspace_bytes(compiled)},
            "device_roofline": device_readings.roofline_seconds(figures, row), "examples_per_second": 1 / median,
            **device_readings.device_figures(devices[0])}


def write_records(folder: str, size: int, count: int) -> str:
    """`count` synthetic CT cases of size³ (noise in [0, 1], three classes), by the project's own encoder."""
    import numpy as np

    from preprocessing.records import tfrecord_files, tfrecord_schema

    rng = np.random.default_rng(size)
    encoded = [tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
        f"case{index}", "synthetic", rng.random((size, size, size), dtype=np.float32),
        rng.integers(0, 3, (size, size, size), dtype=np.uint8))) for index in range(count)]
    path = os.path.join(folder, "data-00000-of-00001.tfrecord")
    tfrecord_files.write_records(path, encoded, compress=False)
    return path


def input_row(row: dict) -> dict:
    """The input path feeding the training step: seconds waiting for each next batch, after the first (compiling) step."""
    import collections

    import jax
    import numpy as np

    from trainer.data import batches as batches_lib, ct_input
    from trainer.data import ct_batches
    from trainer.engine import placement

    size, total = row["sizes"][0], row["warmup"] + row["steps"]
    step = Step(row)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        pattern = write_records(folder, size, row["examples"])
        written = time.perf_counter() - started
        records = ct_input.CtRecords(pattern)
        state = placement.place_state(step.state, step.distribution)
        feed = ct_batches.CtBatches(records, step.config.batch_size, seed=0, steps=total, cache="off")
        waits, in_flight = [], collections.deque()
        try:
            for number in range(total):
                if number == row["warmup"]:
                    measured_from = time.perf_counter()
                waiting = time.perf_counter()
                batch = next(feed)
                waits.append(time.perf_counter() - waiting)
                inputs, labels = step.task.place(step.distribution, batch, None)
                state, metrics = step.jitted(state, inputs, labels, np.int32(number))
                in_flight.append((batch, metrics))
                while len(in_flight) > 1:  # as train_loop.loop: this step and the next in flight
                    done_batch, done_metrics = in_flight.popleft()
                    jax.block_until_ready(done_metrics)
                    done_batch.release()
            for done_batch, done_metrics in in_flight:
                jax.block_until_ready(done_metrics)
                done_batch.release()
        finally:
            feed.close()
        wall = time.perf_counter() - measured_from
    waited = sum(waits[row["warmup"]:])
    return {"status": "ok", "size": size, "examples": row["examples"], "steps": row["steps"],
            "warmup_steps": row["warmup"], "input_wait_seconds": waited, "measured_seconds": wall,
            "input_wait_fraction": waited / wall, "median_wait_seconds": statistics.median(waits[row["warmup"]:]),
            "examples_per_second": row["steps"] * step.config.batch_size / wall, "cache": feed.cache_reason,
            "reading_threads": batches_lib.usable_cores(), "records_written_seconds": written,
            **device_readings.device_figures(jax.devices()[0])}


def about_here() -> dict:
    """The device and the software this row ran on."""
    import importlib.metadata

    import jax

    device = jax.devices()[0]
    versions = {}
    for name in ("jax", "jaxlib", "keras", "jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda13-pjrt", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"platform": device.platform, "device_kind": device.device_kind, "device_count": jax.device_count(),
            "python": sys.version.split()[0], "versions": versions}


def main() -> None:
    row = json.loads(sys.argv[1])
    # The allocator grows as the row needs instead of taking 75 % up front, up to 95 % of the device: the largest
    # cube is then judged against most of the card, and peak_bytes_in_use is what the row itself used.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    sys.path.insert(0, REPOSITORY)
    import trainer  # noqa: F401  (Keras on JAX, the compilation cache: as every fullres command)
    import jax

    if row["platform"] == "cpu":
        jax.config.update("jax_platforms", "cpu")
    run = {"train": train_row, "predict": predict_row, "input": input_row}[row["part"]]
    try:
        result = run(row)
    except Exception as error:  # noqa: BLE001  (reported in the row; the next row still runs)
        result = {"status": "out_of_memory" if out_of_memory(error) else "failed", "error": first_line(error),
                  **device_readings.device_figures(jax.devices()[0])}
    result["here"] = about_here()
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
