"""The trained detector the border test judges the split lines with, stored in `golden/border_detector/`.

The border test (tests/trainer/test_detection_train.py) needs a detector that
finds the synthetic shapes (150 steps were not enough: mAP@0.5 0.009). Training
it is 300 steps of the detection demo preset on 256 images, about 5.5 minutes
on 2 cores: more than a third of the suite's budget for one fixture. So it is
trained once, by fullres itself, with this script, and its run folder's
`train_config.json`, `model_info.json` and `model.keras` are kept; the test
loads them through `trained_run.load`, as `fullres predict` loads a run.

Train it again (and commit the folder, saying why) when the RetinaNet or the
detection demo preset changes; the test refuses a stored model whose
architecture differs from today's preset:

    uv run python -m tests.trainer.border_detector
"""

import os
import shutil
import sys
import tempfile

STEPS = 300
NUM_TRAIN, NUM_EVAL, DATA_SEED = 256, 32, 3
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "border_detector")
KEPT = ("train_config.json", "model_info.json", "model.keras")


def main() -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from preprocessing.images import demo_images
    from trainer import train
    from trainer import presets

    with tempfile.TemporaryDirectory() as scratch:
        shapes = demo_images.write_demo_tfrecords(os.path.join(scratch, "shapes"), num_train=NUM_TRAIN,
                                                  num_eval=NUM_EVAL, seed=DATA_SEED)
        output = os.path.join(scratch, "run")
        config = presets.detection_demo(train_data=shapes["train"], output_dir=output, steps=STEPS,
                                           log_every=50, checkpoint_every=STEPS)
        train.train(config, log=print, export_saved_model=False)
        os.makedirs(FOLDER, exist_ok=True)
        for name in KEPT:
            shutil.copy(os.path.join(output, name), os.path.join(FOLDER, name))
    print(f"wrote {', '.join(KEPT)} to {FOLDER}")


if __name__ == "__main__":
    main()
