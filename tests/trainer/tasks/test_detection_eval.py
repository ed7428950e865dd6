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
