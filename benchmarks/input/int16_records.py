"""What int16 records lose: the rounding of each normalization, and whether a trained model's masks change.

CT records store a volume as int16 steps of its largest magnitude / 32767 (`tfrecord_schema.quantize`). This
measures, on synthetic CT cases (`demo_ct.synthetic_case`, HU with noise): the largest error in HU of the demo's
window (-200, 300) and of a wide window (-1000, 1000), and in standard deviations of the same scans z-scored as
MR; and, given a trained run (`--model`, e.g. the model folder `fullres demo` names in its summary.json), the share
of voxels whose predicted class changes and the foreground Dice, fed float32 against int16 (each case's own grid,
as the model was trained at).

    uv run python benchmarks/input/int16_records.py [--cases 8] [--shape 32,32,32] [--model RUN] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

# A run trained split over N virtual CPU devices needs N to load: present 8 (before JAX starts), as the tests do.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from common import parsing  # noqa: E402
from preprocessing.ct import demo_ct, intensity  # noqa: E402
from preprocessing.records import tfrecord_schema  # noqa: E402


def _error(volume: np.ndarray) -> float:
    """The largest |stored - float32| of `volume` through int16."""
    return float(np.abs(tfrecord_schema.dequantize(*tfrecord_schema.quantize(volume)) - volume).max())


def rounding(cases: list[np.ndarray]) -> dict:
    """Largest errors over the cases, in the normalization's own unit."""
    windows = {"demo window (-200, 300)": (-200.0, 300.0), "wide window (-1000, 1000)": (-1000.0, 1000.0)}
    result = {}
    for name, (low, high) in windows.items():
        result[f"{name}, HU"] = max(_error(intensity.window_and_scale(c, (low, high))) for c in cases) * (high - low)
    zscored = [intensity.zscore(c)[0] for c in cases]
    result["z-score (as MR), standard deviations"] = max(_error(z) for z in zscored)
    result["z-score largest magnitude"] = max(float(np.abs(z).max()) for z in zscored)
    return result


def model_change(model_dir: str, cases: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Predicted class changes and foreground Dice, float32 against int16 input, for a trained run."""
    from trainer import trained_run
    from trainer.engine import inference, placement
    from trainer.tasks import metrics

    loaded = trained_run.load(model_dir)
    config, model, state, distribution = loaded.config, loaded.model, loaded.state, loaded.distribution
    window = tuple(config_window(model_dir))
    forward = inference.make_forward(model, distribution, state, 5, "class_ids")
    changed, total = 0, 0
    dice = {"float32": metrics.DiceAccumulator(config.model.num_classes),
            "int16": metrics.DiceAccumulator(config.model.num_classes)}
    for volume, label in cases:
        image = intensity.window_and_scale(volume, window)
        stored = tfrecord_schema.dequantize(*tfrecord_schema.quantize(image))
        predictions = {}
        for name, fed in (("float32", image), ("int16", stored)):
            batch = np.repeat(fed[None, ..., None], config.batch_size, axis=0)  # (B, D, H, W, 1)
            predictions[name] = placement.to_host(forward(state, placement.place_batch(distribution, batch)))[:1]
            dice[name].update(predictions[name], label[None].astype(np.int32))
        changed += int(np.count_nonzero(predictions["float32"] != predictions["int16"]))
        total += label.size
    return {"voxels_changed": changed, "voxels": total, "dice_float32": dice["float32"].foreground_mean(),
            "dice_int16": dice["int16"].foreground_mean()}


def config_window(model_dir: str):
    from trainer.engine import run_files

    return run_files.read_model_info(model_dir)["preprocessing"]["window"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--shape", default="32,32,32", help="D,H,W of each synthetic case (the model's, with --model)")
    parser.add_argument("--model", help="a trained run to feed float32 and int16 volumes")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    shape = tuple(parsing.parse_list(args.shape, int, "--shape"))
    rng = np.random.default_rng(7)
    cases = [demo_ct.synthetic_case(rng, shape) for _ in range(args.cases)]
    results = {"cases": args.cases, "shape": list(shape), "largest_error": rounding([v for v, _ in cases])}
    if args.model:
        results["model"] = {"run": args.model, **model_change(args.model, cases)}
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
