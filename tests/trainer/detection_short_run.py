"""The short detection run whose per-step losses the suite compares with stored golden numbers.

MONAI's `integration_answers.py` idea: a real training run, a few steps long,
whose losses are written down once (`golden/detection_losses.json`) and checked
on every test run at a stated tolerance. Whether the detector *learns* (mAP@0.5
after 300 steps) is a measurement, not a test: `benchmarks/learning/detection_learning.py`.

To take the golden numbers again (prints them as JSON; `--devices 1` for the
unpartitioned spread):

    uv run python -m tests.trainer.detection_short_run /tmp/short-run --devices 8
"""

import argparse
import json
import os
import sys

STEPS = 8
# The test's own settings: a cosine schedule over 8 steps after 2 of warm-up, so the run moves the weights (the
# preset's 100 warm-up steps would leave the learning rate near 0 for the whole run).
SETTINGS = dict(steps=STEPS, warmup_steps=2, log_every=1, checkpoint_every=STEPS)
NUM_TRAIN, NUM_EVAL, DATA_SEED = 64, 32, 3


def write_shapes(directory: str) -> dict:
    """The synthetic shapes (256², seed 3): 64 training images (the 8 steps' batches of 8), 32 held out."""
    from preprocessing.images import demo_images

    return demo_images.write_demo_tfrecords(directory, num_train=NUM_TRAIN, num_eval=NUM_EVAL, seed=DATA_SEED)


def make_config(shapes: dict, output_dir: str):
    """The detection demo preset (RetinaNet, 256², batch 8, unpartitioned replicas), `SETTINGS` steps."""
    from trainer import presets

    return presets.detection_demo(train_data=shapes["train"], eval_data=shapes["eval"], output_dir=output_dir,
                                     **SETTINGS)


def run(directory: str) -> dict:
    """Writes the shapes and trains the short run under `directory`; returns train.train's results."""
    from trainer import train

    shapes = write_shapes(os.path.join(directory, "shapes"))
    return train.train(make_config(shapes, os.path.join(directory, "run")), log=lambda line: None,
                       export_saved_model=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="a new directory for the shapes and the run")
    parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices (the tests use 8)")
    arguments = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={arguments.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["KERAS_BACKEND"] = "jax"
    import trainer  # noqa: F401  (chooses the Keras backend before TensorFlow loads)

    results = run(arguments.directory)
    json.dump({"devices": arguments.devices, "losses": [loss for _, loss in results["loss_history"]],
               "mAP@0.5": results["mAP@0.5"]}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
