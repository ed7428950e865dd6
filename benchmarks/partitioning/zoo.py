"""The zoo of public segmentation networks (tests/trainer/zoo/): parity, all-gathers, per-device memory and fit.

For each network, in its `tiny` configuration (the published configuration's layer kinds and structure at test
widths and depths; the published ones are each file's `build`; docs/zoo.md says which is which):

- parity (float32) and parity-float64: one training step (softmax cross-entropy, `tests/trainer/zoo/step.py`)
  split 2-way (1,2,1,1,1), 4-way (1,4,1,1,1) and 2×2 (1,2,2,1,1) through `fullres.SpatialParallel` against one
  device, at 32×32×16, in that precision (float64: every value of the step, `step.precision`): the loss's
  relative difference, the largest relative gradient difference over the weights, the activation all-gathers
  and the f32 values of each compiled step;
- memory: `fullres plan --model FILE.py:tiny --image-size 128,128,128 --partitions 1,4` on this CPU (fullres's
  own training step, Dice + cross-entropy, Adam): per-device bytes at N=1 and N=4, their ratio to total(1)/4
  (the floor the issue sets is 1.25), and the N=4 step's activation all-gathers;
- fit: the same plan at N=4 with `--target v5e:2x2` and `--target h100x4`, each compiled by that target's own
  compiler (`uv sync --group tpu --group cuda`): per-device bytes and whether they fit.

Resumable: what `--json` already holds is kept, each part written as it finishes.

    nice -n 10 uv run --group tpu --group cuda python benchmarks/partitioning/zoo.py --json benchmarks/results/zoo.json \\
        [--networks nnunet_plain,...] [--parts parity,parity-float64,memory,v5e:2x2,h100x4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETWORKS = ("nnunet_plain", "nnunet_resenc", "monai_unet", "segresnet", "mednext", "swin_unetr")
PARTS = ("parity", "parity-float64", "memory", "v5e:2x2", "h100x4")
PRECISIONS = {"parity": "float32", "parity-float64": "float64"}
PARITY_SIZE = (32, 32, 16)
PLAN_SIZE = "128,128,128"


def source(network: str) -> str:
    return os.path.join("tests", "trainer", "zoo", f"{network}.py") + ":tiny"


def parity(network: str, dtype: str) -> dict:
    """One step split 2, 4 and 2×2 ways against one device in `dtype`, in a process of its own (8 virtual CPU
    devices)."""
    code = f"""
import json, os, time
import trainer  # noqa: F401  (Keras's JAX backend first)
import importlib
from tests.trainer.zoo import step
function = importlib.import_module("tests.trainer.zoo.{network}").tiny
images, labels = step.example({PARITY_SIZE!r})
reference = step.run(function, (1, 1, 1, 1, 1), images, labels, dtype={dtype!r})
rows = {{}}
for name, dims in step.SPLITS.items():
    started = time.perf_counter()
    split = step.run(function, dims, images, labels, dtype={dtype!r})
    rows[name] = {{"loss": abs(split.loss - reference.loss) / abs(reference.loss),
                  "gradient": step.worst_gradient(split, reference), "gathers": len(split.gathered),
                  "gathered": [[g.layer, g.describe()] for g in split.gathered], "permutes": split.permutes,
                  "float32_values": [reference.float32_values, split.float32_values],
                  "seconds": round(time.perf_counter() - started, 1)}}
print("RESULT" + json.dumps(rows))
"""
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
                   "KERAS_BACKEND": "jax"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                            cwd=REPOSITORY)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    if result.returncode or not lines:
        return {"error": result.stderr[-2000:]}
    return {"size": list(PARITY_SIZE), "dtype": dtype, "splits": json.loads(lines[-1][len("RESULT"):])}


def plan(network: str, partitions: str, target: str) -> dict:
    """`fullres plan --json` for the network's tiny configuration at 128³, as a user runs it."""
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    if target == "cpu":
        environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    command = [sys.executable, "-m", "pipelines.cli", "plan", "--model", source(network), "--image-size",
               PLAN_SIZE, "--partitions", partitions, "--json", "--target", target]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=REPOSITORY)
    if result.returncode:
        return {"error": (result.stderr or result.stdout)[-2000:]}
    rows = json.loads(result.stdout)["rows"]
    return {"rows": [{key: row.get(key) for key in ("input_partition_dims", "total_bytes", "fits",
                                                     "activation_all_gathers", "gathered", "halo_bytes",
                                                     "compiler_options")}
                     for row in rows]}


def memory(network: str) -> dict:
    found = plan(network, "1,4", "cpu")
    if "error" in found:
        return found
    one, four = (next(r for r in found["rows"] if r["input_partition_dims"][1] == n) for n in (1, 4))
    return {**found, "ratio": four["total_bytes"] / (one["total_bytes"] / 4)}


def _mib(count) -> str:
    return "—" if count is None else f"{count / 2**20:,.0f} MiB"


def table(results: dict) -> list[str]:
    """The docs' table (docs/zoo.md) from the results."""
    lines = ["| network | parity float64 2 / 4 / 2×2 | parity float32 2 / 4 / 2×2 | gathers 2 / 4 / 2×2 (4-way 128³) "
             "| per device at 4-way 128³ (total/4) | ratio | v5e:2x2 | h100x4 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for network, entry in results.items():
        parities = []
        for part in ("parity-float64", "parity"):
            found = entry.get(part, {}).get("splits", {})
            parities.append(" / ".join(f"{found[k]['gradient']:.1e}" if k in found else "—" for k in ("2", "4", "2x2")))
        splits = entry.get("parity", {}).get("splits") or entry.get("parity-float64", {}).get("splits", {})
        gathered = " / ".join(str(splits[k]["gathers"]) if k in splits else "—" for k in ("2", "4", "2x2"))
        rows = entry.get("memory", {}).get("rows", [])
        one = next((r for r in rows if r["input_partition_dims"][1] == 1), None)
        four = next((r for r in rows if r["input_partition_dims"][1] == 4), None)
        ratio = entry.get("memory", {}).get("ratio")
        fits = []
        for target in ("v5e:2x2", "h100x4"):
            row = (entry.get(target, {}).get("rows") or [None])[0]
            fits.append("not measured" if row is None else
                        f"{'fits' if row['fits'] else 'does not fit'}, {_mib(row['total_bytes'])}"
                        + (" (without Triton GEMMs)" if row.get("compiler_options") else ""))
        lines.append(f"| {network} | {parities[0]} | {parities[1]} | {gathered} ({four['activation_all_gathers'] if four else '—'}) | "
                     f"{_mib(four and four['total_bytes'])} ({_mib(one and one['total_bytes'] / 4)}) | "
                     f"{'—' if ratio is None else f'{ratio:.2f}'} | {fits[0]} | {fits[1]} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="the results file (kept and extended)")
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--table", action="store_true", help="print docs/zoo.md's table from --json and stop")
    arguments = parser.parse_args()
    results = json.load(open(arguments.json)) if os.path.exists(arguments.json) else {}
    if arguments.table:
        print("\n".join(table(results)))
        return
    for part in arguments.parts.split(","):
        for network in arguments.networks.split(","):
            entry = results.setdefault(network, {"source": source(network)})
            if part in entry and "error" not in entry[part]:
                continue
            started = time.perf_counter()
            entry[part] = parity(network, PRECISIONS[part]) if part in PRECISIONS else memory(network) if part == "memory" else \
                plan(network, "4", part)
            entry[part]["seconds"] = round(time.perf_counter() - started, 1)
            print(network, part, json.dumps(entry[part])[:400], flush=True)
            with open(arguments.json, "w") as file:
                json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
