"""Dead letters: what fullres writes, one per input it could not use, instead of stopping the run.

Preprocessing (`dead_letter.jsonl` beside the records) and `fullres predict`
(beside the masks) write the same fields, so one reader serves both.
"""

from __future__ import annotations


class CaseError(Exception):
    """One case cannot be used. `reason` is a short stable key for counting; `detail` is the sentence for people.

    Example:
        >>> error = CaseError("read", "unreadable", "a.nii.gz is not a NIfTI file")
        >>> dead_letter("a.nii.gz", error.stage, error.reason, error.detail)["reason"]
        'unreadable'
    """

    def __init__(self, stage: str, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.stage, self.reason, self.detail = stage, reason, detail


def dead_letter(source: str, stage: str, reason: str, detail: str) -> dict:
    """One dead-letter record, as written to `dead_letter.jsonl`."""
    return {"source": source, "stage": stage, "reason": reason, "detail": detail}


def check_failed_fraction(value: float, name: str = "--max-failed-fraction") -> None:
    """The rule for the share of inputs that may fail before a run counts as failed: a fraction from 0 to 1.

    `preprocess ct|images`, `predict`, their components and the pipelines' parameter check all apply it.

    Example:
        >>> check_failed_fraction(-3, "--param max_failed_fraction")
        Traceback (most recent call last):
        ValueError: --param max_failed_fraction -3 must be a fraction from 0 to 1 (the share of inputs that may fail before the run counts as failed), e.g. 0.1.
    """
    if not 0 <= value <= 1:  # NaN too
        raise ValueError(f"{name} {value:g} must be a fraction from 0 to 1 (the share of inputs that may fail before "
                         "the run counts as failed), e.g. 0.1.")
