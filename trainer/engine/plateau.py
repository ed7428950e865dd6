"""The plateau warning: a training loss that has stopped moving while a foreground class is still not found.

A whole-volume run can settle with a small organ never learned (the
kidney of the demo's data, Dice 0.000, the loss flat at about 0.55): the Dice
term of a class the network has pushed to a probability near zero has almost
no gradient, and the run goes on for its remaining steps without a sign. The
training loop hands every logged step's loss and the Dice of each class on the
batch it trained on (`SegmentationTask.batch_metrics`) to a `PlateauWatch`;
when the loss has moved by less than `LOSS_CHANGE` of itself over
`WINDOW_STEPS` steps while a foreground class labelled in those batches scored
below `DICE_FLOOR` on every one of them, the run's log says so once, in one
line, with what to try.
"""

from __future__ import annotations

import dataclasses
import math

WINDOW_STEPS = 100  # the loss is compared between the two halves of this many steps
LOSS_CHANGE = 0.05  # relative change of the mean loss between the halves, under which the loss counts as flat
DICE_FLOOR = 0.05  # a foreground class below this Dice on every training batch of the window counts as not found


@dataclasses.dataclass
class PlateauWatch:
    """Reads the logged steps of a run; `observe` returns the warning once, the first time the plateau is seen.

    Example:
        >>> watch = PlateauWatch(window_steps=4)
        >>> [watch.observe(step, 0.55, [1.0, 0.9, 0.0]) for step in range(1, 5)][-1][:36]
        'warning: the training loss stayed at'
        >>> watch.observe(5, 0.55, [1.0, 0.9, 0.0]) is None  # once
        True
    """

    window_steps: int = WINDOW_STEPS
    loss_change: float = LOSS_CHANGE
    dice_floor: float = DICE_FLOOR
    seen: list = dataclasses.field(default_factory=list)  # (step, loss, per-class Dice) of the logged steps
    warned: bool = False

    def observe(self, step: int, loss: float, class_dice) -> str | None:
        """Notes a logged step (its loss, each class's Dice on its training batch, NaN: neither labelled nor
        predicted); returns the warning line the first time the loss is flat and a foreground class unfound."""
        self.seen.append((step, float(loss), [float(d) for d in class_dice]))
        start = step - self.window_steps
        self.seen = [entry for entry in self.seen if entry[0] > start - self.window_steps]  # what the test reads
        if self.warned or not self.seen or self.seen[0][0] > start + 1:
            return None  # warned already, or fewer than `window_steps` steps logged
        middle = start + self.window_steps / 2
        window = [entry for entry in self.seen if entry[0] > start]
        earlier = [loss for s, loss, _ in window if s <= middle]
        later = [loss for s, loss, _ in window if s > middle]
        if not earlier or not later:
            return None
        before, after = sum(earlier) / len(earlier), sum(later) / len(later)
        change = abs(after - before) / max(abs(before), 1e-12)
        if change >= self.loss_change:
            return None
        unfound = [c for c in range(1, len(window[0][2]))
                   if any(not math.isnan(dice[c]) for _, _, dice in window)
                   and all(math.isnan(dice[c]) or dice[c] < self.dice_floor for _, _, dice in window)]
        if not unfound:
            return None
        self.warned = True
        names = ", ".join(map(str, unfound))
        return (f"warning: the training loss stayed at {after:.4f} (moved {change:.1%}, under "
                f"{self.loss_change:.0%}) over steps {start + 1}-{step} while class{'es' if len(unfound) > 1 else ''} "
                f"{names} scored Dice under {self.dice_floor} on every training batch: the network is not learning "
                f"{'them' if len(unfound) > 1 else 'it'}; try --set class_balance=1 (cross-entropy weighted by "
                "class frequency), a lower --learning-rate, or another --seed (docs/recipe.md)")
