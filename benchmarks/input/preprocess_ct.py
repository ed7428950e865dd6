"""CT preprocessing throughput: Beam DirectRunner (1 and 2 workers) next to a plain loop.

All three do the same conversion of the same synthetic NIfTI cases (read, orient,
resample, window, crop/pad, encode, write TFRecords), interleaved round by round
in one run, so a busy machine slows them alike. Reports cases/s, input MB/s
(uncompressed HU voxels) and output MB/s, median over rounds, and the ratio to
the plain loop.

    uv run python benchmarks/input/preprocess_ct.py [--cases 40] [--shape 128,256,256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np  # noqa: E402
import SimpleITK as sitk  # noqa: E402
import tensorflow as tf  # noqa: E402

from common import parsing
from preprocessing.beam import ct_pipeline
from preprocessing.ct import ct_transforms, demo_ct, label_pairing, volume_discovery
from preprocessing.records import tfrecord_schema  # first: sets TF's env

CONFIG = ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 1.5), window=(-200.0, 300.0), shape=(128, 192, 192))


def make_cases(directory: str, count: int, shape, seed: int = 0) -> int:
    """Writes `count` NIfTI cases with labels; returns the uncompressed input bytes (float32 HU)."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(directory, "images"))
    os.makedirs(os.path.join(directory, "labels"))
    for index in range(count):
        volume, label = demo_ct.synthetic_case(rng, shape)
        image = sitk.GetImageFromArray(volume)
        image.SetSpacing((0.75, 0.75, 2.0))
        labels = sitk.GetImageFromArray(label)
        labels.CopyInformation(image)
        sitk.WriteImage(image, os.path.join(directory, "images", f"case{index:03d}.nii.gz"))
        sitk.WriteImage(labels, os.path.join(directory, "labels", f"case{index:03d}.nii.gz"))
    return count * int(np.prod(shape)) * 4


def plain_loop(data: str, output: str) -> int:
    """The same conversion in one process, no Beam; returns bytes written."""
    images, _ = volume_discovery.discover(os.path.join(data, "images"))
    cases, _ = label_pairing.pair_with_labels(images, os.path.join(data, "labels"))
    os.makedirs(output)
    path = os.path.join(output, "data-00000-of-00001.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for case in cases:
            writer.write(tfrecord_schema.encode_ct_example(ct_transforms.preprocess_case(case, CONFIG)))
    return os.path.getsize(path)


def beam(data: str, output: str, workers: int) -> int:
    args = ["--runner=DirectRunner", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    summary = ct_pipeline.run(os.path.join(data, "images"), output, labels=os.path.join(data, "labels"), config=CONFIG,
                              pipeline_args=args, log=lambda line: None)
    assert summary["ok"] > 0 and summary["failed"] == 0, summary
    return summary["bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--shape", default="128,256,256", help="input D,H,W of each synthetic case")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    shape = parsing.parse_list(args.shape, int, "--shape")
    modes = {"plain loop": lambda d, o: plain_loop(d, o),
             "Beam, 1 worker": lambda d, o: beam(d, o, 1),
             "Beam, 2 workers": lambda d, o: beam(d, o, 2)}
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "data")
        input_bytes = make_cases(data, args.cases, shape)
        seconds = {mode: [] for mode in modes}
        written = {}
        for round_number in range(args.rounds):
            for mode, function in modes.items():
                output = os.path.join(scratch, f"out-{round_number}-{mode.replace(' ', '').replace(',', '')}")
                start = time.perf_counter()
                written[mode] = function(data, output)
                seconds[mode].append(time.perf_counter() - start)
                print(f"round {round_number + 1}: {mode:16s} {seconds[mode][-1]:6.2f} s", flush=True)
    plain = statistics.median(seconds["plain loop"])
    results = []
    print(f"\n{args.cases} cases of {shape} -> {CONFIG.shape}, median of {args.rounds} rounds, {os.cpu_count()} cores")
    print(f"{'mode':16s} {'seconds':>8s} {'cases/s':>8s} {'in MB/s':>8s} {'out MB/s':>9s} {'vs loop':>8s}")
    for mode in modes:
        median = statistics.median(seconds[mode])
        row = {"mode": mode, "seconds": round(median, 2), "cases_per_second": round(args.cases / median, 3),
               "input_mb_per_second": round(input_bytes / 1e6 / median, 1),
               "output_mb_per_second": round(written[mode] / 1e6 / median, 1), "speed_vs_plain_loop": round(plain / median, 3)}
        results.append(row)
        print(f"{mode:16s} {median:8.2f} {row['cases_per_second']:8.2f} {row['input_mb_per_second']:8.1f} "
              f"{row['output_mb_per_second']:9.1f} {row['speed_vs_plain_loop']:7.2f}x")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"cases": args.cases, "shape": shape, "target_shape": CONFIG.shape, "rounds": args.rounds,
                       "results": results}, file, indent=2)


if __name__ == "__main__":
    main()
