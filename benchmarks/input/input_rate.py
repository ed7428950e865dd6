"""The training input's rate on this host: 128³ and 256³, GZIP and uncompressed, cache on and off, a whole example
against one process's share, 1 core against 2; tf.data on the same records, and numpy copying examples in memory (the
cache's ceiling), beside it.

Every cell is the rate `fullres train` gets from its input (`trainer.data.ct_input.CtBatches`: read the slabs,
check their CRCs, decode into the batch buffers the step takes), one example per step, measured by
`trainer.data.input_rate.measure` in a fresh process pinned with `taskset` to 1 or 2 cores. The cells of one
size run round by round, interleaved, so a busy machine slows them alike; each figure is the median over the
rounds. "share" is one process's part of the seed layout: 1,16,1,1,1 on 4 processes (4 devices each) holds a
quarter of the depth. The records are synthetic CT (`demo_ct.synthetic_case`: smooth organs, noise), written by
the project's own encoder, so GZIP compresses them as it would real scans.

    uv run python benchmarks/input/input_rate.py [--sizes 128,256] [--examples 8] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED_LAYOUT, SEED_PROCESSES = (1, 16, 1, 1, 1), 4  # "share": what process 0 of this layout reads, depths [0, D/4)


def write_records(folder: str, size: int, count: int, compress: bool) -> str:
    """`count` synthetic CT cases of size³ in two shards; returns the pattern."""
    import numpy as np

    from preprocessing.ct import demo_ct, intensity
    from preprocessing.records import tfrecord_files, tfrecord_schema

    rng = np.random.default_rng(size)
    encoded = []
    for index in range(count):
        volume, label = demo_ct.synthetic_case(rng, (size, size, size))
        record = tfrecord_schema.CtRecord(f"case{index}", "synthetic", intensity.window_and_scale(volume, (-1000, 1000)),
                                          label)
        encoded.append(tfrecord_schema.encode_ct_example(record))
    os.makedirs(folder, exist_ok=True)
    suffix = ".tfrecord.gz" if compress else ".tfrecord"
    for shard, part in enumerate((encoded[: count // 2], encoded[count // 2:])):
        tfrecord_files.write_records(os.path.join(folder, f"data-{shard:05d}-of-00002{suffix}"), part)
    return os.path.join(folder, "data-*")


def _measure_here(pattern: str, cached: bool, share: bool, reader: str) -> dict:
    """One cell, in this (pinned) process."""
    from trainer.data import ct_input, input_rate

    if reader == "tf.data":
        return _tf_data_rate(pattern)
    if reader == "memory copy":
        return _copy_rate(pattern)
    records = ct_input.CtRecords(pattern)
    depth = None
    if share:  # process 0 of the seed layout: 1,16,1,1,1 over 16 devices on 4 processes
        from trainer.plan import input_plan

        depth = input_plan.placed_share(SEED_LAYOUT, (1, *records.shape, 1), 16, SEED_PROCESSES).depth
    return input_rate.measure(records, depth, cached=cached).to_json()


def _tf_data_rate(pattern: str, min_seconds: float = 2.0) -> dict:
    """tf.data on the same records: parallel interleave of the shards, parallel parse (every slab), batches of 1."""
    import time

    import tensorflow as tf

    from preprocessing.records import dataset_files, tfrecord_schema
    from trainer.data import batches, ct_input

    tf.config.set_visible_devices([], "GPU")
    files = ct_input.list_files(pattern)
    cores = batches.usable_cores()
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=dataset_files.compression(files)),
        cycle_length=len(files), num_parallel_calls=cores, deterministic=True)
    dataset = dataset.map(tfrecord_schema.parse_ct_example, num_parallel_calls=cores).map(
        lambda e: (e["image"], e["label"])).batch(1).repeat().prefetch(2)
    iterator = dataset.as_numpy_iterator()
    image, _ = next(iterator)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_seconds:
        next(iterator)
        count += 1
    seconds = time.perf_counter() - started
    example = image.size * 4 + image.size * 4  # float32 image and int32 label, as parse_ct_example makes them
    return {"examples_per_second": round(count / seconds, 2), "mib_per_second": round(count * example / 2**20 / seconds, 1),
            "cores": cores, "cached": False}


def _copy_rate(pattern: str, min_seconds: float = 2.0) -> dict:
    """The ceiling for the cache: numpy copying whole examples (int16 image, uint8 label) between arrays in memory,
    one thread per usable core, each into its own buffers, nothing else."""
    import threading
    import time

    import numpy as np

    from trainer.data import batches, ct_input

    records = ct_input.CtRecords(pattern)
    shape, count, cores = records.shape, len(records), batches.usable_cores()
    records.close()
    sources = [(np.full(shape, k, np.int16), np.full(shape, k, np.uint8)) for k in range(count)]
    copied = [0] * cores
    started = time.perf_counter()

    def copy(thread: int) -> None:
        image, label = np.empty(shape, np.int16), np.empty(shape, np.uint8)
        while time.perf_counter() - started < min_seconds:
            source_image, source_label = sources[(copied[thread] + thread) % count]
            image[...], label[...] = source_image, source_label
            copied[thread] += 1

    threads = [threading.Thread(target=copy, args=(thread,)) for thread in range(cores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    example = int(np.prod(shape)) * 3
    return {"examples_per_second": round(sum(copied) / seconds, 2),
            "mib_per_second": round(sum(copied) * example / 2**20 / seconds, 1), "cores": cores, "cached": True}


def machine() -> dict:
    """What the figures were taken on: the CPU model, the cores this process may use, the memory."""
    import platform

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    memory = next((int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:")),
                  None) if os.path.exists("/proc/meminfo") else None
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(memory / 2**30, 1) if memory else None,
            "kernel": platform.release()}


def measure(pattern: str, cores: int, cached: bool, share: bool, reader: str = "fullres") -> dict:
    """One cell in a fresh process pinned to `cores` cores (`taskset`)."""
    code = ("import json, sys; sys.path.insert(0, %r); from benchmarks.input import input_rate; "
            "print(json.dumps(input_rate._measure_here(%r, %r, %r, %r)))" % (REPOSITORY, pattern, cached, share, reader))
    environment = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(["taskset", "-c", ",".join(map(str, range(cores))), sys.executable, "-c", code],
                            capture_output=True, text=True, env=environment, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


CELLS = [  # (name, records, cores, cached, share, reader)
    ("whole, records, 2 cores", "plain", 2, False, False, "fullres"),
    ("whole, records, 1 core", "plain", 1, False, False, "fullres"),
    ("whole, cache, 2 cores", "plain", 2, True, False, "fullres"),
    ("whole, cache, 1 core", "plain", 1, True, False, "fullres"),
    ("share, records, 2 cores", "plain", 2, False, True, "fullres"),
    ("share, cache, 2 cores", "plain", 2, True, True, "fullres"),
    ("whole, GZIP records, 2 cores", "gzip", 2, False, False, "fullres"),
    ("whole, GZIP, cache, 2 cores", "gzip", 2, True, False, "fullres"),
    ("share, GZIP records, 2 cores", "gzip", 2, False, True, "fullres"),
    ("whole, tf.data on the records, 2 cores", "plain", 2, False, False, "tf.data"),
    ("memory copy of an example, 2 threads", "plain", 2, True, False, "memory copy"),
    ("memory copy of an example, 1 thread", "plain", 1, True, False, "memory copy"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256")
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = {}
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            patterns = {kind: write_records(os.path.join(scratch, f"{size}-{kind}"), size, args.examples,
                                            kind == "gzip") for kind in ("plain", "gzip")}
            rates = {name: [] for name, *_ in CELLS}
            for round_number in range(args.rounds):
                for name, kind, cores, cached, share, reader in CELLS:
                    rates[name].append(measure(patterns[kind], cores, cached, share, reader))
                    print(f"{size}³ round {round_number + 1}: {name:40s} "
                          f"{rates[name][-1]['examples_per_second']:8.2f} examples/s", flush=True)
            results[size] = {name: {key: statistics.median(r[key] for r in cells)
                                    for key in ("examples_per_second", "mib_per_second")}
                             for name, cells in rates.items()}
    for size, cells in results.items():
        whole = cells["whole, records, 2 cores"]["examples_per_second"]
        print(f"\n{size}³, {args.examples} examples, median of {args.rounds} rounds; ratio to 'whole, records, 2 cores'")
        for name, cell in cells.items():
            print(f"  {name:40s} {cell['examples_per_second']:8.2f}/s {cell['mib_per_second']:8.0f} MiB/s "
                  f"{cell['examples_per_second'] / whole:6.2f}x")
        print(f"  2 cores / 1 core: records {whole / cells['whole, records, 1 core']['examples_per_second']:.2f}x, "
              f"cache {cells['whole, cache, 2 cores']['examples_per_second'] / cells['whole, cache, 1 core']['examples_per_second']:.2f}x, "
              f"memory copy {cells['memory copy of an example, 2 threads']['examples_per_second'] / cells['memory copy of an example, 1 thread']['examples_per_second']:.2f}x; "
              f"share / whole: {cells['share, records, 2 cores']['examples_per_second'] / whole:.2f}x")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine(), "examples": args.examples, "rounds": args.rounds, "share": {"input_partition_dims": SEED_LAYOUT,
                                                                                  "processes": SEED_PROCESSES},
                       "results": {str(size): cells for size, cells in results.items()}}, file, indent=2)


if __name__ == "__main__":
    main()
