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
