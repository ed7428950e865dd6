"""Whether a recipe learns on every seed: the spread of held-out Dice over seeds, whole volumes against patches.

The runs of `benchmarks/learning/context_matters.py` (the demo's data and the context
task at 32³, the demo preset's 3-level UNet, no augmentation, 300 steps,
whole volumes at batch 2 against 16³ patches at batch 16 and 24³ patches at
batch 5: equal steps and nearly equal voxels a step), repeated over seeds and
presets. A preset contributes its recipe (optimizer, learning rate, schedule,
loss, deep supervision) on that network; a preset with deep supervision gets
one level more, which deep supervision needs (docs/recipe.md). Reported per
(data, preset, arm): the median, minimum and maximum of the score over seeds,
and the share of seeds that converged: foreground mean Dice ≥ 0.85 on the
demo's data, look-alike mean Dice ≥ 0.9 on the context task (the learning bars).

    uv run python benchmarks/learning/seed_sweep.py [--seeds 0,1,2,3,4] [--data demo,context] [--arms whole,patch24,patch16]
        [--presets demo,default,nnunet] [--steps 300] [--set KEY=VALUE ...] [--tag NAME]

Runs go one at a time, seed by seed, and the JSON is written after each, so a
sweep cut short keeps its runs and a rerun adds only the missing ones.
`--set` changes the recipe of every run (a candidate fix, e.g. `--set
class_balance=0`); `--tag` names that variant in the table.

Figures: docs/recipe.md ("Every seed"), benchmarks/results/seed_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import context_matters  # noqa: E402  (the data sets, the arms and one run)

CONVERGED = {"demo": ("dice_mean", 0.85), "context": ("look_alike_dice_mean", 0.9)}  # the score and its bar


def summarize(runs: list) -> dict:
    """Per (data, tag, preset, arm): the seeds, each seed's score, median, minimum, maximum, share converged."""
    groups = {}
    for run in runs:
        groups.setdefault(f"{run['data']}/{run['tag']}/{run['preset']}/{run['arm']}", []).append(run)
    table = {}
    for key, rows in sorted(groups.items()):
        field, bar = CONVERGED[rows[0]["data"]]
        scores = [r[field] for r in sorted(rows, key=lambda r: r["seed"])]
        table[key] = {"score": field, "seeds": sorted(r["seed"] for r in rows), "per_seed": scores,
                      "median": round(statistics.median(scores), 4), "minimum": min(scores), "maximum": max(scores),
                      "converged": f"{sum(s >= bar for s in scores)}/{len(scores)}",
                      "train_seconds_median": round(statistics.median(r["train_seconds"] for r in rows), 1)}
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--data", default="demo,context")
    parser.add_argument("--arms", default="whole,patch24,patch16")
    parser.add_argument("--presets", default="demo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tag", default="default recipe")
    parser.add_argument("--work", default=None)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "benchmarks", "results", "seed_sweep.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import trainer  # noqa: F401  (sets Keras's backend before TensorFlow is imported)
    from preprocessing.ct import demo_ct

    settings = dict(item.split("=", 1) for item in args.set)
    work = args.work or tempfile.mkdtemp(prefix="seed_sweep-")
    makers = {"context": (lambda: context_matters.write_context_records(os.path.join(work, "context-data"), 24, 6,
                                                                       seed=7), len(context_matters.CONTEXT_CLASSES)),
              "demo": (lambda: demo_ct.write_demo_tfrecords(os.path.join(work, "demo-data"), 24, 6,
                                                            shape=context_matters.SHAPE, seed=7), 3)}
    previous = json.load(open(args.json)) if os.path.exists(args.json) else {"runs": []}
    runs = previous.get("runs", [])
    done = {(r["data"], r["tag"], r["preset"], r["arm"], r["seed"], r["steps"]) for r in runs}
    made = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in args.data.split(","):
            for preset in args.presets.split(","):
                for arm in args.arms.split(","):
                    if (name, args.tag, preset, arm, seed, args.steps) in done:
                        continue
                    if name not in made:
                        made[name] = makers[name][0]()
                    print(f"[{name} {args.tag} {preset} {arm} seed {seed}] {args.steps} steps", flush=True)
                    run = context_matters.run_arm(made[name], name, arm, seed, args.steps, makers[name][1],
                                                  os.path.join(work, args.tag.replace(" ", "_")), print, preset,
                                                  settings)
                    runs.append({**run, "tag": args.tag})
                    table = summarize(runs)
                    with open(args.json, "w") as file:
                        json.dump({"summary": table, "runs": runs}, file, indent=1)
                    print(json.dumps(table, indent=1), flush=True)


if __name__ == "__main__":
    main()
