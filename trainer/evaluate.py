"""Full-volume evaluation under the training partitioning: per-class Dice."""

from __future__ import annotations

import numpy as np

from trainer import ct_input, metrics, partitioning, step


def evaluate_segmentation(
    model,
    state: step.TrainState,
    distribution: partitioning.SpatialParallel,
    pattern: str,
    batch_size: int,
    num_classes: int,
) -> dict:
    """Predicts every case matching `pattern` at full resolution and scores it.

    The last batch is padded with copies of its first case to the global batch
    size, so every replica gets an equal share; padded predictions are dropped.

    Returns:
        `{"dice_per_class": [...], "dice_mean": x, "cases": n}`; `dice_mean` is
        the mean over foreground classes.
    """
    dice = metrics.DiceAccumulator(num_classes)
    predict = None
    cases = 0
    for batch in ct_input.ct_dataset(pattern, batch_size).as_numpy_iterator():
        images, labels = batch["image"], batch["label"]
        real = images.shape[0]
        if real < batch_size:
            pad = batch_size - real
            images = np.concatenate([images, np.repeat(images[:1], pad, axis=0)])  # (B, D, H, W, 1)
        if predict is None:
            predict = step.jit_predict_step(step.make_predict_step(model), distribution, state, images.ndim)
        predictions = np.asarray(predict(state, step.place_batch(distribution, images)))[:real]
        dice.update(predictions, labels)
        cases += real
    return {"dice_per_class": dice.per_class(), "dice_mean": dice.foreground_mean(), "cases": cases}
