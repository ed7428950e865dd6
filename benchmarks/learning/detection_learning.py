"""Does the detector learn? RetinaNet on the synthetic shapes: mAP@0.5 on held-out images after N steps.

The suite's detection tests train 8 steps and compare every step's loss with
stored golden numbers (tests/trainer/test_detection_train.py); whether those
steps lead anywhere is this measurement. It trains the `detection_demo` preset
(256², batch 8, unpartitioned replicas on 8 virtual CPU devices) on 256
synthetic training images (seed 3) and scores 32 held-out ones, printing mAP@0.5
and per-class AP (one run: the learning-rate schedule ends at `--steps`, so a
shorter run is not a point on a longer run's curve). The floor it reports
against is the one the suite held before it moved here: mAP@0.5 >= 0.2 after
300 steps (measured 0.28 then). It exits 1 below the floor.

    uv run python benchmarks/learning/detection_learning.py [--steps 300] [--output DIR]

Figures: docs/measurements.md ("Detection learns").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPOSITORY)

FLOOR = 0.2  # mAP@0.5 after 300 steps: the bar the test suite held until it moved here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output", default=None, help="directory for the data and the run (default: a temporary one)")
    parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices (the test suite's 8)")
    arguments = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={arguments.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["KERAS_BACKEND"] = "jax"
    import trainer  # noqa: F401  (chooses the Keras backend before TensorFlow loads)
    from preprocessing.images import demo_images
    from trainer import train
    from trainer import presets

    root = arguments.output or tempfile.mkdtemp(prefix="detection-learning-")
    shapes = demo_images.write_demo_tfrecords(os.path.join(root, "shapes"), num_train=256, num_eval=32, seed=3)
    started = time.monotonic()
    config = presets.detection_demo(train_data=shapes["train"], eval_data=shapes["eval"],
                                       output_dir=os.path.join(root, "run"), steps=arguments.steps, log_every=50,
                                       checkpoint_every=arguments.steps)
    results = train.train(config, log=print, export_saved_model=False)
    row = {"steps": arguments.steps, "mAP@0.5": round(results["mAP@0.5"], 4),
           "per_class_AP": {k: round(v, 4) for k, v in results["per_class_AP"].items()},
           "loss_first_last": [results["loss_history"][0], results["loss_history"][-1]],
           "seconds": round(time.monotonic() - started), "devices": arguments.devices}
    print(json.dumps(row))
    verdict = "above" if row["mAP@0.5"] >= FLOOR else "BELOW"
    print(f"mAP@0.5 {row['mAP@0.5']:.3f} after {arguments.steps} steps: {verdict} the floor {FLOOR} (run in {root})")
    sys.exit(0 if row["mAP@0.5"] >= FLOOR else 1)


if __name__ == "__main__":
    main()
