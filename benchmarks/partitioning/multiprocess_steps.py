"""Steps/s of one training run in 2 processes × 4 CPU devices against 1 process × 8, side by side.

Both runs train the same model on the same synthetic CT data with the same
partitioning, one after the other on this machine; each runs `--steps` steps
and the rate is read from the training log after the warm-up (compilation) is
over: steps `warmup+1` to the end.

    uv run python benchmarks/partitioning/multiprocess_steps.py [--steps 40] [--dims 1,8,1,1,1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(train_pattern: str, output: str, steps: int, warmup: int, dims: str, processes: int) -> dict:
    devices = 8 // processes
    command = [sys.executable, "-m", "pipelines.cli", "train", "--train", train_pattern, "--output", output,
               "--preset", "smoke", "--steps", str(steps), "--log-every", str(warmup), "--checkpoint-every",
               str(steps), "--input-partition-dims", dims, "--virtual-devices", str(devices)]
    if processes > 1:
        command += ["--local-processes", str(processes)]
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    started = time.perf_counter()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=REPOSITORY, check=True)
    wall = time.perf_counter() - started
    # "step 40/40  loss ...  1.23 steps/s": the rate over the last logging window (after the warm-up window).
    rates = [float(r) for r in re.findall(r"step \d+/\d+ .* ([\d.]+) steps/s", result.stdout)]
    return {"processes": processes, "devices_per_process": devices, "steps_per_second": rates[-1],
            "wall_seconds": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dims", default="1,8,1,1,1", help="input partition dims of both runs")
    parser.add_argument("--json", help="also write the results here")
    arguments = parser.parse_args()
    warmup = arguments.steps // 2

    from preprocessing.ct import demo_ct

    with tempfile.TemporaryDirectory() as directory:
        data = demo_ct.write_demo_tfrecords(os.path.join(directory, "data"), num_train=6, num_eval=2,
                                            shape=(16, 16, 16), seed=1)
        results = [_run(data["train"], os.path.join(directory, f"run{p}"), arguments.steps, warmup, arguments.dims, p)
                   for p in (1, 2)]
    for result in results:
        print(f"{result['processes']} process(es) × {result['devices_per_process']} devices, dims {arguments.dims}: "
              f"{result['steps_per_second']:.2f} steps/s after warm-up ({result['wall_seconds']} s wall)")
    print(f"2 processes / 1 process: {results[1]['steps_per_second'] / results[0]['steps_per_second']:.2f}×")
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump({"dims": arguments.dims, "steps": arguments.steps, "runs": results}, file, indent=2)


if __name__ == "__main__":
    main()
