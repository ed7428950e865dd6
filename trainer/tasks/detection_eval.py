"""Detection evaluation: decode per-level outputs, non-max suppression, COCO mAP (pycocotools).

Decoding runs after the partitioned forward pass, on whole images: the
per-level maps are flattened back into KerasHub's anchor order (level, row,
column, anchor — the inverse of `retinanet.targets_to_levels`), decoded with
KerasHub's anchors and box coding, and filtered with its `NonMaxSuppression`.
"""

from __future__ import annotations

import contextlib
import functools
import io

import jax
import keras
import numpy as np

from trainer.models import retinanet


def flatten_levels(outputs: dict, config: retinanet.RetinaNetConfig):
    """(B, N, 4) box deltas and (B, N, C) class logits, in KerasHub's anchor order."""
    boxes, classes = [], []
    for level in config.levels:
        level_boxes = np.asarray(outputs[f"boxes/{level}"])  # (B, H, W, A·4)
        level_classes = np.asarray(outputs[f"classes/{level}"])  # (B, H, W, A·C)
        batch = level_boxes.shape[0]
        boxes.append(level_boxes.reshape(batch, -1, retinanet.BOX_CODE))  # (B, H·W·A, 4)
        classes.append(level_classes.reshape(batch, -1, config.num_classes))  # (B, H·W·A, C)
    return np.concatenate(boxes, axis=1), np.concatenate(classes, axis=1)


NMS_TILE = 512  # KerasHub's `non_max_suppression` compares boxes in tiles of this many
# Kept as candidates down to this far below the confidence threshold: numpy's sigmoid and XLA's may differ in the
# last bit; what NMS then finds at or under the threshold it drops itself.
THRESHOLD_MARGIN = 1e-3


def candidates(boxes: np.ndarray, logits: np.ndarray, confidence_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Of every image's (B, N, 4) boxes and (B, N, C) logits, the ones NMS could select, in their order.

    KerasHub's NMS zeroes every box whose confidence is not above the
    threshold and then compares all N boxes with each other, tile by tile
    (N² box pairs): 12,096 anchors per 256² image, about 0.1 s an image on a
    CPU core, although a trained detector puts a few hundred boxes above 0.05.
    A zeroed box is never selected and suppresses nothing, so NMS finds the
    same detections among the boxes above the threshold alone. Each image
    keeps its most confident boxes, as many as the image with the most above
    the threshold has, rounded up to whole tiles (NMS pads to tiles anyway;
    few distinct shapes to compile), in their original order (ties among
    equal scores sort as before).
    """
    num_boxes = boxes.shape[1]
    # Confidence as NMS computes it: the largest class probability (the sigmoid is monotonic).
    confidence = 1 / (1 + np.exp(-logits.max(axis=-1).astype(np.float64)))
    above = int((confidence > confidence_threshold - THRESHOLD_MARGIN).sum(axis=1).max(initial=0))
    keep = min(num_boxes, max(1, -(-above // NMS_TILE)) * NMS_TILE)
    if keep == num_boxes:
        return boxes, logits
    kept = np.sort(np.argsort(-confidence, axis=1, kind="stable")[:, :keep], axis=1)  # (B, keep), in order
    return np.take_along_axis(boxes, kept[..., None], axis=1), np.take_along_axis(logits, kept[..., None], axis=1)


def decode_detections(outputs: dict, image_size: tuple[int, int], config: retinanet.RetinaNetConfig,
                      confidence_threshold: float = 0.05, iou_threshold: float = 0.5, max_detections: int = 100) -> dict:
    """Boxes after NMS: `{"boxes": (B, K, 4) yxyx pixels, "confidence": (B, K), "classes": (B, K), "num_detections": (B,)}`."""
    deltas, logits = flatten_levels(outputs, config)
    boxes = np.asarray(_box_decoder(tuple(image_size), config)(deltas))
    boxes, logits = candidates(boxes, logits, confidence_threshold)
    found = _suppressor(confidence_threshold, iou_threshold, max_detections)(boxes, logits)
    return {"boxes": np.asarray(found["boxes"]), "confidence": np.asarray(found["confidence"]),
            "classes": np.asarray(found["labels"]), "num_detections": np.asarray(found["num_detections"])}


# Anchors, box decoding and NMS as compiled programs (one each, kept in the persistent compilation cache), not op
# by op: run eagerly, every operation of KerasHub's anchor generator and NMS compiled apart in each new process,
# 11 s before a process's first decoding of 32 images on the 2-core machine (0.26 s for the next ones), against
# 1.2 s compiled beyond importing KerasHub (0.13 s for the next ones).
@functools.lru_cache(maxsize=8)
def _box_decoder(image_size: tuple[int, int], config: retinanet.RetinaNetConfig):
    """`deltas (B, N, 4) -> boxes (B, N, 4)`, yxyx pixels, against the config's anchors at `image_size`."""
    generator, _ = retinanet.anchor_tools(config)

    def decode(deltas):
        anchors = keras.ops.concatenate(list(generator(np.zeros((*image_size, 3), np.float32)).values()), axis=0)
        return keras.utils.bounding_boxes.decode_deltas_to_boxes(
            anchors=anchors, boxes_delta=deltas, encoded_format="center_xywh", anchor_format="yxyx",
            box_format="yxyx", variance=list(config.box_variance), image_shape=(*image_size, 3))

    return jax.jit(decode)


@functools.lru_cache(maxsize=8)
def _suppressor(confidence_threshold: float, iou_threshold: float, max_detections: int):
    """`(boxes (B, N, 4), logits (B, N, C)) -> KerasHub's NonMaxSuppression result`."""
    from keras_hub.layers import NonMaxSuppression

    suppress = NonMaxSuppression(bounding_box_format="yxyx", from_logits=True, iou_threshold=iou_threshold,
                                 confidence_threshold=confidence_threshold, max_detections=max_detections)
    return jax.jit(lambda boxes, logits: suppress(boxes, logits))


def coco_metrics(detections: list[dict], ground_truth: list[dict], class_names: list[str]) -> dict:
    """COCO box AP of detections against ground truth, with pycocotools.

    Args:
        detections: per image `{"boxes": (K, 4) yxyx, "scores": (K,), "classes": (K,)}` (0-based classes).
        ground_truth: per image `{"boxes": (M, 4) yxyx, "classes": (M,)}` and optionally `"ignore"` (M,) (crowd
            regions and difficult objects: COCO's `iscrowd`, so a detection on one is neither right nor wrong);
            the same order as `detections`.
        class_names: names of the 0-based classes.

    Returns:
        `{"mAP": AP@[.5:.95], "mAP@0.5": AP@.5, "per_class_AP": {name: AP@[.5:.95] or None}}`.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(box):
        y0, x0, y1, x1 = (float(v) for v in box)
        return [x0, y0, x1 - x0, y1 - y0]

    dataset = {"images": [], "annotations": [],
               "categories": [{"id": i + 1, "name": name} for i, name in enumerate(class_names)]}
    results = []
    for image_id, (truth, found) in enumerate(zip(ground_truth, detections), start=1):
        dataset["images"].append({"id": image_id})
        ignore = truth.get("ignore", np.zeros(len(truth["classes"]), bool))
        for box, label, crowd in zip(truth["boxes"], truth["classes"], ignore):
            x, y, w, h = xywh(box)
            dataset["annotations"].append({"id": len(dataset["annotations"]) + 1, "image_id": image_id,
                                           "category_id": int(label) + 1, "bbox": [x, y, w, h], "area": w * h,
                                           "iscrowd": int(bool(crowd))})
        for box, score, label in zip(found["boxes"], found["scores"], found["classes"]):
            results.append({"image_id": image_id, "category_id": int(label) + 1, "bbox": xywh(box), "score": float(score)})
    if not results:
        return {"mAP": 0.0, "mAP@0.5": 0.0, "per_class_AP": {name: 0.0 for name in class_names}}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth = COCO()
        truth.dataset = dataset
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    precision = evaluation.eval["precision"]  # (IoU thresholds, recall, classes, areas, max detections)
    per_class = {}
    for index, name in enumerate(class_names):
        values = precision[:, :, index, 0, -1]
        values = values[values > -1]
        per_class[name] = float(values.mean()) if values.size else None
    return {"mAP": float(evaluation.stats[0]), "mAP@0.5": float(evaluation.stats[1]), "per_class_AP": per_class}
