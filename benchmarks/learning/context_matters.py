"""Whole volumes against patches where context decides, and where it does not, at equal steps and equal voxels.

**The context task** (synthetic, 32³): a column of three identical blocks
(vertebra-like) labelled 1, 2, 3 by their index from the top, and two identical
spheres (kidney-like) labelled 4 (left) and 5 (right) by their side. The
column's start, the spheres' heights and every position jitter from case to
case, and each structure looks exactly like its look-alikes: only where it
sits tells its class. **The demo's data** (`fullres demo`'s synthetic CT, 32³,
liver- and kidney-like organs told apart by shape and intensity), where
context does not decide.

Each data set trains the same network (the demo preset's 3-level UNet, whose
measured receptive field, 44 voxels a side, covers the 32³ volume) three ways,
two seeds each, at equal optimizer steps and (nearly) equal voxels per step:

* whole volumes, batch 2 (65,536 voxels a step);
* 16³ patches, batch 16 (65,536 voxels);
* 24³ patches, batch 5 (69,120 voxels: 24³ does not divide 2 × 32³);

patches are cut as `fullres train --patch-size` cuts them (a third centred on
foreground) and predicted by the product's sliding window (half overlap,
Gaussian). No augmentation (mirroring would swap left and right). Reported per
run: per-class Dice on held-out cases, the confusion between look-alike classes
(the fraction of each look-alike class's voxels predicted as another), the
receptive field as the training log states it, training time, and inference
time (evaluation of the held-out cases, compilation included).

    uv run python benchmarks/learning/context_matters.py [--steps 300] [--seeds 0,1] [--work DIR] [--data context,demo]

Figures: docs/context.md, benchmarks/results/context_matters.json (`complete: false` while runs are missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPOSITORY)

SHAPE = (32, 32, 32)
ARMS = {"whole": (None, 2), "patch16": ((16, 16, 16), 16), "patch24": ((24, 24, 24), 5)}  # patch, batch
CONTEXT_CLASSES = ["background", "block_1", "block_2", "block_3", "left", "right"]
LOOK_ALIKES = {"context": [[1, 2, 3], [4, 5]], "demo": []}  # groups of classes told apart only by place


def context_case(rng, shape=SHAPE):
    """(image in [0, 1], label) of one context case: three identical blocks, two identical spheres."""
    import numpy as np

    depth, height, width = shape
    image = rng.normal(0.2, 0.05, shape).astype(np.float32)
    label = np.zeros(shape, np.uint8)
    top = int(rng.integers(1, 7))  # blocks of 6 with gaps of 3: 24 voxels from `top`
    y, x = int(rng.integers(13, 17)), int(rng.integers(13, 17))
    for index in range(3):
        z = top + index * 9
        image[z:z + 6, y - 3:y + 3, x - 3:x + 3] = 0.7
        label[z:z + 6, y - 3:y + 3, x - 3:x + 3] = 1 + index
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    for side, centre_x in ((4, x - 10), (5, x + 10)):
        centre = (int(rng.integers(5, depth - 5)), int(rng.integers(height // 2 - 5, height // 2 + 6)),
                  centre_x + int(rng.integers(-1, 2)))
        sphere = np.linalg.norm(grid - np.array(centre), axis=-1) <= 3.5
        image[sphere] = 0.7
        label[sphere] = side
    image += rng.normal(0, 0.03, shape).astype(np.float32)
    return np.clip(image, 0, 1), label


def write_context_records(output_dir: str, num_train: int, num_eval: int, seed: int) -> dict:
    """The context task as CT records and summary.json, as `demo_ct.write_demo_tfrecords` writes the demo's."""
    import numpy as np
    import tensorflow as tf

    from preprocessing.ct import ct_transforms
    from preprocessing.records import dataset_files, tfrecord_schema

    os.makedirs(output_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    patterns, shards, values = {}, [], {}
    window = (-200.0, 300.0)
    for split, count in (("train", num_train), ("eval", num_eval)):
        path = os.path.join(output_dir, f"{split}-00000-of-00001.tfrecord")
        shards.append(os.path.basename(path))
        with tf.io.TFRecordWriter(path) as writer:
            for index in range(count):
                image, label = context_case(rng)
                for value in np.unique(label):
                    values[str(value)] = values.get(str(value), 0) + 1
                writer.write(tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
                    case_id=f"context-{split}-{index:04d}", source_path=f"synthetic://context/{split}/{index}",
                    image=image, label=label, spacing=(1.0, 1.0, 1.0), window=window)))
        patterns[split] = os.path.join(output_dir, f"{split}-*.tfrecord")
    preprocessing = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(
        spacing=(1.0, 1.0, 1.0), window=window, shape=SHAPE, modality="ct"))
    dataset_files.write_summary(output_dir, {
        "ok": num_train + num_eval, "failed": 0, "reasons": {}, "shards": shards,
        "label_values": dict(sorted(values.items(), key=lambda item: int(item[0]))), "modality": "ct",
        "preprocessing": preprocessing})
    return patterns


def confusion(samples, groups) -> dict:
    """For each look-alike class: the fraction of its voxels predicted as each class of its group."""

    found = {}
    for group in groups:
        for true in group:
            total = sum(int((s["label"] == true).sum()) for s in samples)
            found[str(true)] = {str(predicted): round(sum(int(((s["label"] == true) & (s["prediction"] == predicted))
                                                              .sum()) for s in samples) / max(total, 1), 4)
                                for predicted in group}
    return found


def run_arm(data: dict, name: str, arm: str, seed: int, steps: int, num_classes: int, work: str, log,
            preset: str = "demo", settings: dict | None = None) -> dict:
    """One training run and its scores. `preset`'s recipe on the demo preset's network (`benchmarks/learning/seed_sweep.py`
    trains the others); `settings`: more `--set` overrides (`config.resolve`'s keys)."""
    from trainer import train as train_lib, trained_run
    from trainer import config_resolution
    from trainer import presets
    from trainer.models import losses

    patch, batch = ARMS[arm]
    output = os.path.join(work, f"{name}-{preset}-{arm}-seed{seed}")
    model = dataclasses.replace(presets.demo().model, num_classes=num_classes)
    if config_resolution.resolve(preset=preset).model.deep_supervision:  # the demo network has too few levels for it: one more
        model = dataclasses.replace(model, num_levels=model.num_levels + 1, deep_supervision=True)
    config = config_resolution.resolve(preset=preset, train_data=data["train"], output_dir=output, overrides=settings)
    config = dataclasses.replace(config, steps=steps, batch_size=batch, model=model, patch_size=patch, augment=False,
                                 seed=seed, checkpoint_every=steps, log_every=50,
                                 partition=presets.demo().partition)
    lines = []
    results = train_lib.train(config, log=lambda line: (lines.append(line), log(f"  {line}")),
                              export_saved_model=False)
    field = next((line.split(": ", 1)[1] for line in lines if line.startswith("receptive field: ")), None)
    run = trained_run.open_run(output)
    loaded = trained_run.load(run)
    samples = []
    started = time.perf_counter()
    scores = run.task.evaluate(loaded.model, loaded.state, loaded.distribution, lambda line: None,
                               pattern=data["eval"], samples=samples, keep=10**6)
    inference_seconds = time.perf_counter() - started
    groups = LOOK_ALIKES[name]
    look_alike = [scores["dice_per_class"][c] for group in groups for c in group]
    return {"data": name, "arm": arm, "seed": seed, "preset": preset, "settings": settings or {},
            "class_balance": losses.class_balance(config.class_balance, patch is None), "patch_size": list(patch) if patch else None,
            "batch_size": batch, "voxels_per_step": batch * math.prod(patch or SHAPE),
            "steps": steps, "dice_per_class": [None if d is None else round(d, 4) for d in scores["dice_per_class"]],
            "dice_mean": round(scores["dice_mean"], 4),
            "look_alike_dice_mean": round(statistics.mean(look_alike), 4) if look_alike else None,
            "confusion": confusion(samples, groups), "receptive_field": field,
            "train_seconds": results["train_seconds"], "inference_seconds": round(inference_seconds, 2),
            "eval_cases": scores["cases"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--data", default="context,demo")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--train-cases", type=int, default=24)
    parser.add_argument("--eval-cases", type=int, default=6)
    parser.add_argument("--work", default=None)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "benchmarks", "results", "context_matters.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import trainer  # noqa: F401  (sets Keras's backend before TensorFlow is imported)
    from preprocessing.ct import demo_ct

    work = args.work or tempfile.mkdtemp(prefix="context_matters-")
    seeds = [int(s) for s in args.seeds.split(",")]
    data_sets = {"context": (lambda: write_context_records(os.path.join(work, "context-data"), args.train_cases,
                                                           args.eval_cases, seed=7), len(CONTEXT_CLASSES)),
                 "demo": (lambda: demo_ct.write_demo_tfrecords(os.path.join(work, "demo-data"), args.train_cases,
                                                               args.eval_cases, shape=SHAPE, seed=7), 3)}
    # Seed by seed, so that a run cut short has every arm of the first seed.
    planned = [(name, arm, seed) for name in args.data.split(",") for seed in seeds for arm in args.arms.split(",")]
    previous = json.load(open(args.json)) if os.path.exists(args.json) else {"runs": []}
    runs = [r for r in previous.get("runs", []) if r.get("steps") == args.steps]
    done = {(r["data"], r["arm"], r["seed"]) for r in runs}
    made = {}
    for name, arm, seed in planned:
        if (name, arm, seed) in done:
            continue
        if name not in made:
            made[name] = data_sets[name][0]()
        print(f"[{name} {arm} seed {seed}] {args.steps} steps", flush=True)
        runs.append(run_arm(made[name], name, arm, seed, args.steps, data_sets[name][1], work, print))
        write(args.json, runs, args.steps, seeds)
    write(args.json, runs, args.steps, seeds)


def write(path: str, runs: list, steps: int, seeds: list) -> None:
    """The runs so far, a table of means per (data, arm), and whether every planned run is in."""
    table = {}
    for run in runs:
        table.setdefault(f"{run['data']}/{run['arm']}", []).append(run)
    summary = {key: {"seeds": [r["seed"] for r in rows],
                     "dice_mean": round(statistics.mean(r["dice_mean"] for r in rows), 4),
                     **({"look_alike_dice_mean": round(statistics.mean(r["look_alike_dice_mean"] for r in rows), 4)}
                        if rows[0]["look_alike_dice_mean"] is not None else {}),
                     "train_seconds": round(statistics.mean(r["train_seconds"] for r in rows), 1),
                     "inference_seconds": round(statistics.mean(r["inference_seconds"] for r in rows), 2)}
               for key, rows in sorted(table.items())}
    complete = all(len(v["seeds"]) >= len(seeds) for v in summary.values()) and len(summary) == 2 * len(ARMS)
    with open(path, "w") as file:
        json.dump({"steps": steps, "complete": complete, "summary": summary, "runs": runs}, file, indent=1)
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
