"""How good `fullres predict`'s masks are: Dice against label maps, on each scan's own grid.

The masks are found through predict's own `summary.json` (`outputs.read_summary`);
the label map of a case is the file of the same name under the labels folder.
"""

from __future__ import annotations

import os

import numpy as np
import SimpleITK as sitk

from trainer.predict import outputs
from trainer.tasks import metrics


def dice_in_own_geometry(masks_dir: str, labels_dir: str, num_classes: int) -> dict:
    """Dice of the predicted masks in `masks_dir` against the label maps in `labels_dir`; the grids must be equal.

    Returns:
        `{"dice_mean", "dice_per_class", "cases"}`; `dice_mean` is the mean over foreground classes.

    Raises:
        RuntimeError: a mask is not on its label map's grid (size, spacing, origin or direction).
    """
    dice = metrics.DiceAccumulator(num_classes)
    cases = outputs.read_summary(masks_dir)["cases"]
    for case in cases:
        mask = sitk.ReadImage(case["outputs"][0])
        truth = sitk.ReadImage(os.path.join(labels_dir, os.path.basename(case["outputs"][0])))
        same_grid = (mask.GetSize() == truth.GetSize()
                     and all(np.allclose(getattr(mask, f"Get{field}")(), getattr(truth, f"Get{field}")(), atol=1e-6)
                             for field in ("Spacing", "Origin", "Direction")))
        if not same_grid:
            raise RuntimeError(f"the mask {case['outputs'][0]} is not on its scan's grid (size, spacing, origin "
                               f"or direction differ from {truth.GetSize()}, {truth.GetSpacing()}, ...).")
        dice.update(sitk.GetArrayFromImage(mask), sitk.GetArrayFromImage(truth))
    return {"dice_mean": dice.foreground_mean(), "dice_per_class": dice.per_class(), "cases": len(cases)}
