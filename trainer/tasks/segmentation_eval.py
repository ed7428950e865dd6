"""Scoring a segmentation model on held-out records: every case predicted at full resolution (whole, or by the
sliding window for a patch-trained model), per-class Dice accumulated over cases."""

from __future__ import annotations

import numpy as np

from preprocessing.records import tfrecord_schema
from trainer.data import ct_batches, ct_input
from trainer.engine import inference, placement, sliding_window
from trainer.parallel import device_mesh, distributed
from trainer.tasks import metrics


def evaluate_segmentation(
    model,
    state: placement.TrainState,
    distribution: device_mesh.SpatialParallel,
    pattern: str,
    batch_size: int,
    num_classes: int,
    samples: list | None = None,
    keep: int = 0,
    patch_size: tuple[int, ...] | None = None,
) -> dict:
    """Predicts every case matching `pattern` at full resolution and scores it.

    With `patch_size` (a patch-trained model) each case is predicted by nnU-Net's sliding window of that size
    (`engine.sliding_window`), `batch_size` patches per partitioned forward pass; otherwise whole, in one pass.

    With `samples` (a list) and `keep`, the first `keep` cases are appended to
    it as `{"case_id", "image" (D, H, W, C), "label", "prediction", "video"}` for reports.

    The last batch is padded with copies of its first case to the global batch
    size, so every replica gets an equal share; padded predictions are dropped.

    Returns:
        `{"dice_per_class": [...], "dice_mean": x, "cases": n}`; `dice_mean` is
        the mean over foreground classes.
    """
    dice = metrics.DiceAccumulator(num_classes)
    predict = None
    cases = 0
    records = ct_input.CtRecords(pattern)
    video = records.layout(0).kind == tfrecord_schema.VIDEO_RECORDS  # the report shows clips as frames over time
    stream = ct_batches.CtBatches(records, batch_size, shuffle=False)
    for batch in stream:
        images = tfrecord_schema.dequantize(batch.inputs["image"], batch.inputs["scale"][:, None, None, None, None])
        labels = batch.labels.astype(np.int32)
        batch.release()  # both copied out above
        real = images.shape[0]
        images = inference.pad_batch(images, batch_size)  # (B, D, H, W, 1)
        if predict is None:
            predict = distributed.RunTogether(inference.make_forward(
                model, distribution, state, images.ndim, "class_ids" if patch_size is None else "probabilities"),
                "evaluation")
        if patch_size is None:
            predictions = placement.to_host(predict(state, placement.place_batch(distribution, images)))[:real]
        else:
            def forward(windows, predict=predict):  # (n <= B, d, h, w, 1) -> (n, d, h, w, K), padded to B
                padded = inference.pad_batch(windows, batch_size)
                return placement.to_host(predict(state, placement.place_batch(distribution, padded)))[:len(windows)]

            predictions = np.stack([np.argmax(sliding_window.predict(image, patch_size, forward, batch_size=batch_size
                                                                     )[0], axis=-1) for image in images[:real]])
        dice.update(predictions, labels)
        if samples is not None:
            for index in range(min(real, keep - len(samples))):
                samples.append({"case_id": batch.ids[index], "image": images[index], "label": labels[index],
                                "prediction": predictions[index], "video": video})
        cases += real
    stream.close()
    records.close()
    return {"dice_per_class": dice.per_class(), "dice_mean": dice.foreground_mean(), "cases": cases}
