"""Detection training end to end: `fullres train --task detection`, learning, and objects on partition borders.

One short training run (module fixture) on the synthetic shapes is shared by
the tests: it is the "faster test with a lower floor" of issue 4; the full
run with the issue's mAP@0.5 ≥ 0.6 bar is in the README and measured by
`benchmarks/detection_demo.py`.
"""

import json
import os

import jax
import keras
import numpy as np
import pytest

from preprocessing import demo_images
from trainer import config as config_lib, partitioning, step, tasks, train

STEPS = 150
FAST_FLOOR = 0.3  # mAP@0.5 after STEPS steps; the full demo run reaches the 0.6
SIZE = 256


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return demo_images.write_demo_tfrecords(str(tmp_path_factory.mktemp("shapes")), num_train=160, num_eval=32, seed=3)


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("detector"))
    config = config_lib.detection_demo(train_data=shapes["train"], eval_data=shapes["eval"], output_dir=output,
                                       steps=STEPS, log_every=50, checkpoint_every=STEPS)
    results = train.train(config, log=lambda line: None)
    return config, results


def test_detector_learns_the_shapes(trained):
    config, results = trained
    assert results["task"] == "detection"
    assert results["mAP@0.5"] >= FAST_FLOOR, results
    assert set(results["per_class_AP"]) == {"circle", "square", "triangle"}
    with open(os.path.join(config.output_dir, "metrics.json")) as file:
        written = json.load(file)
    assert written["mAP@0.5"] == results["mAP@0.5"] and written["images"] == 32
    assert written["loss_history"][-1][1] < written["loss_history"][0][1]


def _border_images(rng, count: int):
    """Images with one shape centred on a split line of (1, 4, 2, 1) and one far from every line."""
    lines_y, lines_x = (64, 128, 192), (128,)
    images, truths = [], []
    for index in range(count):
        radius = rng.uniform(16, 26)
        if index % 2:
            border = (rng.choice(lines_y), rng.uniform(radius + 4, SIZE - radius - 4))
        else:
            border = (rng.uniform(radius + 4, SIZE - radius - 4), lines_x[0])
        # Away from every line: centred in a cell of the 4×2 grid, in the opposite half from the border object.
        cell_y = 32 + 64 * int(rng.integers(0, 4))
        cell_x = 64 if border[1] >= 128 else 192
        far = (cell_y, cell_x)
        objects = [(int(rng.integers(1, 4)), border, radius), (int(rng.integers(1, 4)), far, min(radius, 22))]
        image, boxes, categories = demo_images.synthetic_image(rng, (SIZE, SIZE), objects=objects)
        images.append(image.astype(np.float32) / 255)
        yxyx = np.array([[y, x, y + h, x + w] for x, y, w, h in boxes], np.float32)
        truths.append({"boxes": yxyx, "classes": np.array(categories) - 1, "on_border": np.array([True, False])})
    return np.stack(images), truths


def _iou(a, b):
    y0, x0 = np.maximum(a[0], b[0]), np.maximum(a[1], b[1])
    y1, x1 = np.minimum(a[2], b[2]), np.minimum(a[3], b[3])
    inter = max(y1 - y0, 0) * max(x1 - x0, 0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _recall(truths, detections, on_border: bool, score: float = 0.3) -> float:
    found = total = 0
    for truth, detected in zip(truths, detections):
        for box, label, border in zip(truth["boxes"], truth["classes"], truth["on_border"]):
            if border != on_border:
                continue
            total += 1
            found += any(c == label and s >= score and _iou(box, d) >= 0.5
                         for d, s, c in zip(detected["boxes"], detected["scores"], detected["classes"]))
    return found / total


def _detect(model, state, config, distribution, images, tiles: bool = False):
    """Decoded detections of `images` under `distribution`; `tiles` runs every shard alone (no halo exchange)."""
    from trainer import detection_eval

    forward = jax.jit(lambda s, x: model.stateless_call(s.trainable, s.non_trainable, x, training=False)[0])
    if tiles:  # the naive alternative: cut the image into 4×2 tiles, run each alone, stitch the maps
        rows = []
        for tile_row in np.split(images, 4, axis=1):
            columns = [forward(state, tile) for tile in np.split(tile_row, 2, axis=2)]
            rows.append({k: np.concatenate([np.asarray(c[k]) for c in columns], axis=2) for k in columns[0]})
        outputs = {k: np.concatenate([r[k] for r in rows], axis=1) for k in rows[0]}
    else:
        placed_state = step.place_state(state, distribution)
        outputs = forward(placed_state, step.place_batch(distribution, images))
        outputs = {k: np.asarray(v) for k, v in outputs.items()}
    found = detection_eval.decode_detections(outputs, (SIZE, SIZE), config.model)
    return [{"boxes": found["boxes"][i][:n], "scores": found["confidence"][i][:n], "classes": found["classes"][i][:n]}
            for i, n in enumerate(found["num_detections"])]


def test_objects_on_partition_borders_are_found_like_the_others(trained):
    config, _ = trained
    model = keras.saving.load_model(os.path.join(config.output_dir, "model.keras"))
    state = step.TrainState([v.value for v in model.trainable_variables],
                            [v.value for v in model.non_trainable_variables], [])
    rng = np.random.default_rng(11)
    images, truths = _border_images(rng, 32)
    distribution = partitioning.make_distribution(partitioning.PartitionConfig((1, 4, 2, 1)), jax.devices()[:8])
    partitioned = _detect(model, state, config, distribution, images)
    border, elsewhere = _recall(truths, partitioned, True), _recall(truths, partitioned, False)
    print(f"recall on borders {border:.3f}, elsewhere {elsewhere:.3f}")
    assert elsewhere >= 0.5, "the detector must work before its borders can be judged"
    assert border >= elsewhere - 0.1

    # The same check catches a partitioning without halo exchange: tiles run alone lose the border objects.
    tiled = _detect(model, state, config, distribution, images, tiles=True)
    tiled_border = _recall(truths, tiled, True)
    print(f"independent tiles: recall on borders {tiled_border:.3f}")
    assert tiled_border < border - 0.1
