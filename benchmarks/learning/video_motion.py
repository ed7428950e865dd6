"""Where only motion tells the classes apart: a whole-clip model split over time against a per-frame model.

**The motion task** (`fullres demo-data video`): two identical grey squares
on a textured background, one moving right (class 1), one left (class 2), at 1
pixel a frame. A single frame shows two identical squares; only the frames
around it tell which is which. The videos are written as H.264 MP4 files with
palette PNG masks and converted by `fullres preprocess video` (Beam) into clip
records of 16 frames at 32×32 — the product's path end to end.

Two networks train on the same clip records, at equal steps, batch and split
(`1,2,1,1,1`: every clip split over time between 2 devices), seed by seed:

* **whole clip**: the `video` preset's 3D UNet (3×3×3 convolutions, 3 levels of
  8–32 filters), whose receptive field (as the training log states it) spans
  every frame of the clip;
* **per frame**: `benchmarks/learning/video_networks.py:frame_unet`, a 2D UNet applied to
  each frame alone (1×3×3 convolutions, 3 levels of 14–56 filters: about the
  same parameters), as a user's `--model`; its receptive field is 1 frame.

No augmentation (mirroring left-right, or playing backwards, swaps the
classes). Reported per run: per-class Dice on held-out videos, the look-alike
Dice (mean of the two moving classes), the fraction of each class's pixels
predicted as the other, parameters, the receptive field, training time.

    nice -n 10 uv run python benchmarks/learning/video_motion.py [--steps 300] [--seeds 0] [--work DIR]

Figures: docs/video.md, benchmarks/results/video_motion.json.
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

SIZE, FRAMES, DIMS = (32, 32), 16, "1,2,1,1,1"
ARMS = {"whole_clip": None, "per_frame": os.path.join(REPOSITORY, "benchmarks", "learning", "video_networks.py") + ":frame_unet"}


def make_data(work: str, train_videos: int, eval_videos: int) -> dict:
    """Demo videos (MP4 + masks) converted into clip records, train and eval apart."""
    from preprocessing.beam import local_workers, video_pipeline
    from preprocessing.video import demo_video, video_clips

    config = video_clips.VideoPreprocessConfig(clip_length=FRAMES, size=SIZE)
    patterns = {}
    for split, count, seed in (("train", train_videos, 1), ("eval", eval_videos, 2)):
        videos = os.path.join(work, f"{split}-videos")
        demo_video.write_demo_videos(videos, count, FRAMES, SIZE, fps=24, seed=seed)
        patterns[split] = os.path.join(work, f"{split}-clips")
        video_pipeline.run(os.path.join(videos, "videos"), patterns[split], config=config,
                           pipeline_args=[f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1",
                                          "--direct_running_mode=in_memory"], log=print)
    return patterns


def confusion(samples) -> dict:
    """The fraction of each moving class's pixels predicted as each moving class."""
    found = {}
    for true in (1, 2):
        total = sum(int((s["label"] == true).sum()) for s in samples)
        found[str(true)] = {str(p): round(sum(int(((s["label"] == true) & (s["prediction"] == p)).sum())
                                              for s in samples) / max(total, 1), 4) for p in (1, 2)}
    return found


def run_arm(data: dict, arm: str, seed: int, steps: int, work: str) -> dict:
    from trainer import train as train_lib, trained_run
    from trainer import config_resolution

    output = os.path.join(work, f"{arm}-seed{seed}")
    overrides = {"steps": steps, "seed": seed, "augment": False, "checkpoint_every": steps, "log_every": 50,
                 "partition.input_partition_dims": DIMS, "learning_rate": 3e-3}
    config = config_resolution.resolve("segmentation", "video", data["train"], output, overrides=overrides,
                                model_source=ARMS[arm])
    lines = []
    results = train_lib.train(config, log=lambda line: (lines.append(line), print(f"  {line}", flush=True)),
                              export_saved_model=False)
    field = next((line.split(": ", 1)[1] for line in lines if line.startswith("receptive field: ")), None)
    run = trained_run.open_run(output)
    loaded = trained_run.load(run)
    samples = []
    scores = run.task.evaluate(loaded.model, loaded.state, loaded.distribution, lambda line: None,
                               pattern=data["eval"], samples=samples, keep=10**6)
    look_alike = [scores["dice_per_class"][c] or 0.0 for c in (1, 2)]
    return {"arm": arm, "seed": seed, "steps": steps, "partition": DIMS, "parameters": loaded.model.count_params(),
            "dice_per_class": [None if d is None else round(d, 4) for d in scores["dice_per_class"]],
            "look_alike_dice_mean": round(statistics.mean(look_alike), 4), "confusion": confusion(samples),
            "receptive_field": field, "train_seconds": results["train_seconds"], "eval_clips": scores["cases"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--train-videos", type=int, default=32)
    parser.add_argument("--eval-videos", type=int, default=8)
    parser.add_argument("--work", default=None)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "benchmarks", "results", "video_motion.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    import trainer  # noqa: F401  (sets Keras's backend before TensorFlow is imported)

    work = args.work or tempfile.mkdtemp(prefix="video_motion-")
    data = make_data(work, args.train_videos, args.eval_videos)
    previous = json.load(open(args.json)) if os.path.exists(args.json) else {"runs": []}
    runs = [r for r in previous["runs"] if r["steps"] == args.steps]  # earlier seeds of the same length stay
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            if any((r["arm"], r["seed"]) == (arm, seed) for r in runs):
                continue
            print(f"[{arm} seed {seed}] {args.steps} steps", flush=True)
            runs.append(run_arm(data, arm, seed, args.steps, work))
            summary = {name: round(statistics.mean(r["look_alike_dice_mean"] for r in runs if r["arm"] == name), 4)
                       for name in ARMS if any(r["arm"] == name for r in runs)}
            with open(args.json, "w") as file:
                json.dump({"steps": args.steps, "look_alike_dice_mean": summary, "runs": runs}, file, indent=1)
            print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
