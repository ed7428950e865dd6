"""Per-class Dice of hard (argmax) predictions, accumulated over a data set."""

from __future__ import annotations

import numpy as np


class DiceAccumulator:
    """Accumulates per-class overlap counts across batches, then reports Dice.

    Dice is computed from the counts summed over the whole data set (not a mean
    of per-case scores), so a class absent from some cases is still scored.

    Example:
        >>> import numpy as np
        >>> dice = DiceAccumulator(num_classes=2)
        >>> dice.update(np.array([[0, 1, 1]]), np.array([[0, 1, 0]]))
        >>> dice.per_class()
        [0.6666666666666666, 0.6666666666666666]
    """

    def __init__(self, num_classes: int):
        if num_classes < 2:
            raise ValueError(f"DiceAccumulator needs num_classes >= 2, got {num_classes}.")
        self.num_classes = num_classes
        self.intersection = np.zeros(num_classes, np.int64)
        self.predicted = np.zeros(num_classes, np.int64)
        self.true = np.zeros(num_classes, np.int64)

    def update(self, predictions: np.ndarray, labels: np.ndarray) -> None:
        """Adds a batch of class-id predictions and labels of the same shape."""
        if predictions.shape != labels.shape:
            raise ValueError(f"predictions {predictions.shape} and labels {labels.shape} differ in shape.")
        predictions = predictions.reshape(-1).astype(np.int64)
        labels = labels.reshape(-1).astype(np.int64)
        n = self.num_classes
        self.predicted += np.bincount(predictions, minlength=n)[:n]
        self.true += np.bincount(labels, minlength=n)[:n]
        self.intersection += np.bincount(labels[predictions == labels], minlength=n)[:n]

    def per_class(self) -> list[float | None]:
        """Dice per class; None for a class neither predicted nor present."""
        scores = []
        for intersection, predicted, true in zip(self.intersection, self.predicted, self.true):
            total = predicted + true
            scores.append(None if total == 0 else float(2 * intersection / total))
        return scores

    def foreground_mean(self) -> float | None:
        """Mean Dice over the foreground classes (1..C-1) that could be scored."""
        scores = [s for s in self.per_class()[1:] if s is not None]
        return float(np.mean(scores)) if scores else None
