"""Detection training end to end: `fullres train --task detection`, its numerics, and objects on partition borders.

Two runs on the synthetic shapes:

- the session's short run (`detection_run` in tests/conftest.py: the detection
  demo preset, 8 steps), whose every step's loss is compared with stored golden
  numbers (`golden/detection_losses.json`, tolerance `RTOL` below) and whose
  outputs are checked;
- the preset's 300-step run on 256 images, a detector good enough for the
  border test to judge what the partitioning does to objects on the split
  lines (150 steps were not: mAP@0.5 0.009). It costs 5.5 minutes of the
  suite's 15, so it was trained once by fullres (tests/trainer/border_detector.py)
  and its run folder is kept in `golden/border_detector/`; the fixture refuses
  it when today's detection demo model differs from the one it was trained as.

Whether the detector learns (mAP@0.5 ≥ 0.2 after 300 steps; longer runs reach
0.6) is measured by `benchmarks/learning/detection_learning.py`, not asserted here
(docs/measurements.md).
"""

import json
import os

import jax
import numpy as np
import pytest

from preprocessing.images import demo_images
from trainer import presets
from trainer.engine import placement
from trainer.parallel import device_mesh, partitioning

pytestmark = pytest.mark.slow  # trains a detector


GOLDEN = json.loads(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden",
                                      "detection_losses.json")).read())
# Relative, per step. Repeated runs on the 8 devices are equal bit for bit; 1 device agrees to 3.2e-6 over the steps
# before the runs part (the file's "tolerance" entry has the measurements and what to do when they move).
RTOL = 1e-4
SIZE = 256


def test_short_detection_run_writes_its_metrics(detection_run):
    config, results = detection_run
    assert results["task"] == "detection"
    assert set(results["per_class_AP"]) == {"circle", "square", "triangle"}
    with open(os.path.join(config.output_dir, "metrics.json")) as file:
        written = json.load(file)
    assert written["mAP@0.5"] == results["mAP@0.5"] and written["images"] == 32
    # The demo images hold at most 4 shapes, under the preset's max_boxes 16: none left out, and it says so.
    assert written["boxes_dropped_max_boxes"] == 0 and written["eval_boxes_dropped_max_boxes"] == 0
    assert written["loss_history"][-1][1] < written["loss_history"][0][1]


def instruction_set() -> str:
    """The vector instruction set XLA's CPU compiler targets here ('avx512-amx' on Intel's Sapphire Rapids class,
    'avx512', or 'avx2'): it sets the reduction order, so the golden numbers are kept per instruction set (the
    file's "tolerance" entry has the measurements, "taken" which machine gave each)."""
    with open("/proc/cpuinfo") as file:
        flags = file.read()
    if " avx512f" not in flags:
        return "avx2"
    return "avx512-amx" if " amx_tile" in flags else "avx512"


def test_every_step_loss_equals_the_golden_numbers(detection_run):
    _, results = detection_run
    steps = [step_number for step_number, _ in results["loss_history"]]
    losses = np.array([loss for _, loss in results["loss_history"]])
    golden = GOLDEN["losses"][instruction_set()]
    assert steps == list(range(1, len(golden) + 1))
    np.testing.assert_allclose(losses, golden, rtol=RTOL, atol=0,
                               err_msg="the detection losses moved; if a change means to move them, take the golden "
                                       "numbers again (tests/trainer/detection_short_run.py) and say why")


@pytest.fixture(scope="module")
def border_detector() -> str:
    """The stored 300-step detector's run folder (train_config.json, model_info.json, model.keras)."""
    from tests.trainer import border_detector as stored
    from trainer.engine import run_files

    trained_as = run_files.read_train_config(stored.FOLDER)
    today = presets.detection_demo()
    if (trained_as.model, trained_as.precision, trained_as.steps) != (today.model, today.precision, stored.STEPS):
        pytest.fail(f"the stored border detector was trained as {trained_as.model} ({trained_as.precision}, "
                    f"{trained_as.steps} steps) but the detection demo preset is now {today.model} "
                    f"({today.precision}); train it again: uv run python -m tests.trainer.border_detector", pytrace=False)
    return stored.FOLDER


LINES_Y, LINES_X = (64, 128, 192), (128,)  # where (1, 4, 2, 1) splits a 256×256 image


def _distance_to_lines(y: float, x: float) -> float:
    return min([abs(y - line) for line in LINES_Y] + [abs(x - line) for line in LINES_X])


def _border_images(rng, count: int):
    """Images with two shapes of the same size range: one centred on a split line, one clear of every line."""
    images, truths = [], []
    for _ in range(count):
        radii = rng.uniform(14, 24, 2)
        if rng.random() < 0.75:  # on a horizontal line (height split), anywhere along it
            border = (float(rng.choice(LINES_Y)), rng.uniform(radii[0] + 2, SIZE - radii[0] - 2))
        else:  # on the vertical line (width split)
            border = (rng.uniform(radii[0] + 2, SIZE - radii[0] - 2), float(LINES_X[0]))
        while True:  # clear of every line by more than its radius, and apart from the first shape
            clear = (rng.uniform(radii[1] + 2, SIZE - radii[1] - 2), rng.uniform(radii[1] + 2, SIZE - radii[1] - 2))
            apart = np.hypot(clear[0] - border[0], clear[1] - border[1]) > radii.sum() + 8
            if _distance_to_lines(*clear) > radii[1] + 4 and apart:
                break
        objects = [(int(rng.integers(1, 4)), border, radii[0]), (int(rng.integers(1, 4)), clear, radii[1])]
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


def _recall(truths, detections, on_border: bool, score: float = 0.2) -> float:
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
    """Decoded detections of `images` under `distribution`; `tiles` cuts them into 4×2 tiles and runs each alone
    (no halo exchange) on `distribution`'s devices: one device, or every device would compute every tile."""
    from trainer.tasks import detection_eval

    forward = jax.jit(lambda s, x: model.stateless_call(s.trainable, s.non_trainable, x, training=False)[0])
    placed_state = placement.place_state(state, distribution)
    if tiles:  # the naive alternative: cut the image into 4×2 tiles, run each alone, stitch the maps
        rows = []
        for tile_row in np.split(images, 4, axis=1):
            columns = [forward(placed_state, tile) for tile in np.split(tile_row, 2, axis=2)]
            rows.append({k: np.concatenate([np.asarray(c[k]) for c in columns], axis=2) for k in columns[0]})
        outputs = {k: np.concatenate([r[k] for r in rows], axis=1) for k in rows[0]}
    else:
        outputs = forward(placed_state, placement.place_batch(distribution, images))
        outputs = {k: np.asarray(v) for k, v in outputs.items()}
    found = detection_eval.decode_detections(outputs, (SIZE, SIZE), config.model)
    return [{"boxes": found["boxes"][i][:n], "scores": found["confidence"][i][:n], "classes": found["classes"][i][:n]}
            for i, n in enumerate(found["num_detections"])]


def test_objects_on_partition_borders_are_found_like_the_others(border_detector):
    check_borders(border_detector)


def check_borders(model_dir: str):
    from trainer import trained_run

    loaded = trained_run.load(model_dir)
    config, model, state = loaded.config, loaded.model, loaded.state
    images, truths = _border_images(np.random.default_rng(11), 64)
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig((1, 4, 2, 1)), jax.devices()[:8])
    partitioned = _detect(model, state, config, distribution, images)
    border, elsewhere = _recall(truths, partitioned, True), _recall(truths, partitioned, False)
    one_device = device_mesh.make_distribution(partitioning.PartitionConfig((1, 1, 1, 1)), jax.devices()[:1])
    whole = _detect(model, state, config, one_device, images)
    tiled = _detect(model, state, config, one_device, images, tiles=True)
    tiled_border = _recall(truths, tiled, True)
    print(f"recall on split lines {border:.3f}, clear of them {elsewhere:.3f}; unpartitioned on lines "
          f"{_recall(truths, whole, True):.3f}; independent tiles on lines {tiled_border:.3f}")
    assert elsewhere >= 0.3, "the detector must work before its borders can be judged"
    assert border >= elsewhere - 0.1
    # What the partitioned run finds is what one device finds.
    for split, single in zip(partitioned, whole):
        np.testing.assert_allclose(split["scores"], single["scores"], atol=1e-4)
        np.testing.assert_allclose(split["boxes"], single["boxes"], atol=1e-2)
    # The same check catches a partitioning without halo exchange: tiles run alone lose the objects on their borders.
    assert tiled_border < border - 0.1
