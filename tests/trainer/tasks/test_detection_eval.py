"""Detection evaluation: decoding inverts the targets, NMS keeps one box per object, mAP is right."""

import numpy as np
import pytest

from trainer.models import retinanet
from trainer.tasks import detection_eval

CONFIG = retinanet.RetinaNetConfig(num_classes=3, stackwise_num_blocks=(1, 1, 1, 1),
                                   stackwise_num_filters=(64, 32, 32, 32), head_filters=32, head_conv_layers=2)
SIZE = (128, 128)
GT_BOXES = np.array([[[16, 20, 60, 70], [70, 64, 120, 100]], [[30, 30, 90, 90], [0, 0, 0, 0]]], np.float32)
GT_CLASSES = np.array([[0, 2], [1, -1]])


def _outputs_from_targets(class_shift=0):
    """Model outputs that say exactly what the targets say (optionally with every class shifted)."""
    targets = retinanet.encode_targets(GT_BOXES, GT_CLASSES, SIZE, CONFIG)
    outputs = {}
    for level in CONFIG.levels:
        classes = targets[f"classes/{level}"]  # (B, H, W, A)
        logits = np.full((*classes.shape, CONFIG.num_classes), -10.0, np.float32)
        positive = classes >= 0
        shifted = (classes.astype(int) + class_shift) % CONFIG.num_classes
        np.put_along_axis(logits, shifted[..., None], np.where(positive, 10.0, -10.0)[..., None], axis=-1)
        outputs[f"classes/{level}"] = logits.reshape(*classes.shape[:-1], -1)
        outputs[f"boxes/{level}"] = targets[f"boxes/{level}"]
    return outputs


def _evaluate(outputs):
    found = detection_eval.decode_detections(outputs, SIZE, CONFIG, confidence_threshold=0.5)
    detections = [{"boxes": found["boxes"][i, :n], "scores": found["confidence"][i, :n], "classes": found["classes"][i, :n]}
                  for i, n in enumerate(found["num_detections"])]
    truth = [{"boxes": GT_BOXES[i][GT_CLASSES[i] >= 0], "classes": GT_CLASSES[i][GT_CLASSES[i] >= 0]} for i in range(2)]
    return found, detection_eval.coco_metrics(detections, truth, ["circle", "square", "triangle"])


@pytest.mark.slow
def test_perfect_outputs_decode_to_the_ground_truth():
    found, metrics = _evaluate(_outputs_from_targets())
    assert list(found["num_detections"]) == [2, 1]  # NMS keeps one box per object
    np.testing.assert_allclose(np.sort(found["boxes"][0, :2], axis=0), np.sort(GT_BOXES[0], axis=0), atol=0.1)
    assert metrics["mAP"] == pytest.approx(1.0) and metrics["mAP@0.5"] == pytest.approx(1.0)
    assert metrics["per_class_AP"] == pytest.approx({"circle": 1.0, "square": 1.0, "triangle": 1.0})


def test_wrong_classes_score_zero():
    _, metrics = _evaluate(_outputs_from_targets(class_shift=1))
    assert metrics["mAP@0.5"] == pytest.approx(0.0)


def test_no_detections_score_zero():
    outputs = _outputs_from_targets()
    silent = {k: (np.full_like(v, -10.0) if k.startswith("classes") else v) for k, v in outputs.items()}
    _, metrics = _evaluate(silent)
    assert metrics["mAP"] == 0.0


@pytest.mark.slow
def test_nms_among_the_candidates_finds_what_nms_among_all_boxes_finds():
    """`decode_detections` hands KerasHub's NMS only the boxes above the confidence threshold (whole tiles of
    them): the same detections, in the same order, as NMS over every anchor (what it ran before), on images with
    many boxes above the threshold, a few, and none; scores come in steps of 0.5 logits, so many tie."""
    from keras_hub.layers import NonMaxSuppression

    rng = np.random.default_rng(5)
    strides = range(CONFIG.min_level, CONFIG.max_level + 1)
    anchors_count = sum((SIZE[0] >> level) * (SIZE[1] >> level) for level in strides) * CONFIG.anchors_per_position
    above = {0: 560, 1: 30, 2: 0}  # boxes per image above the threshold
    logits = np.full((3, anchors_count, CONFIG.num_classes), -6.0, np.float32)
    for image, count in above.items():  # image 0's: 560 of the 576 finest anchors of its top quarter, overlapping
        chosen = rng.choice(576 if image == 0 else anchors_count, count, replace=False)
        logits[image, chosen, rng.integers(0, CONFIG.num_classes, count)] = np.round(rng.uniform(-2, 3, count) * 2) / 2
    outputs, start = {}, 0
    for name, level in zip(CONFIG.levels, strides):
        height, width = SIZE[0] >> level, SIZE[1] >> level
        count = height * width * CONFIG.anchors_per_position
        outputs[f"classes/{name}"] = logits[:, start:start + count].reshape(3, height, width, -1)
        outputs[f"boxes/{name}"] = rng.normal(0, 0.1, (3, height, width, CONFIG.anchors_per_position * 4)).astype(
            np.float32)
        start += count

    found = detection_eval.decode_detections(outputs, SIZE, CONFIG, confidence_threshold=0.05)

    deltas, flat_logits = detection_eval.flatten_levels(outputs, CONFIG)
    np.testing.assert_array_equal(flat_logits, logits)
    boxes = detection_eval._box_decoder(SIZE, CONFIG)(deltas)  # the same boxes; what differs is what NMS sees
    every = NonMaxSuppression(bounding_box_format="yxyx", from_logits=True, iou_threshold=0.5,
                              confidence_threshold=0.05, max_detections=100)(boxes, logits)
    np.testing.assert_array_equal(found["num_detections"], np.asarray(every["num_detections"]))
    np.testing.assert_array_equal(found["boxes"], np.asarray(every["boxes"]))
    np.testing.assert_array_equal(found["confidence"], np.asarray(every["confidence"]))
    np.testing.assert_array_equal(found["classes"], np.asarray(every["labels"]))
    # NMS kept some of each image's boxes and dropped most of the busiest one's; the candidates are two tiles (560
    # rounded up) of the 3,024 anchors.
    assert 30 < found["num_detections"][0] < 100 and 0 < found["num_detections"][1] <= 30
    assert found["num_detections"][2] == 0
    assert detection_eval.candidates(np.asarray(boxes), logits, 0.05)[0].shape == (3, detection_eval.NMS_TILE * 2, 4)
    assert anchors_count == 3024
