"""The data a run trained on, as their preprocessing recorded them, and whether other data are the same kind of data.

A data set's fingerprint (`data_set.fingerprint`) is its record kind, `summary.json`'s `preprocessing` (spacing,
orientation, window, modality, shape; a clip's length, stride and size), `label_map.json`, and which examples it
holds. `run_record`
keeps the training data's fingerprint and refuses a rerun on other data; `check_eval` refuses held-out data
preprocessed otherwise, whose scores would not be the model's.
"""

from __future__ import annotations

import json

def shown(value) -> str:
    if value is None:
        return "none"
    return json.dumps(value) if isinstance(value, (list, dict, str)) else str(value)


def trained_fingerprint(recorded) -> dict:
    """The fingerprint of the data a run (`trained_run.Record`) trained on last (`data_set.fingerprint`); for a run from
    before run_record.json, what its model_info.json kept of them (summary.json's preprocessing), else {}."""
    lines = [line for line in recorded.history if "fingerprint" in line]
    if lines:
        return lines[-1]["fingerprint"]
    preprocessing = recorded.info.get("preprocessing")
    return {"preprocessing": preprocessing} if preprocessing is not None else {}


def differences(trained: dict, other: dict, ignore: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """[(what, trained's value, other's)] where two data fingerprints differ: each preprocessing field
    (`spacing`, `window`, ...), the record `kind`, the `label_map` as a whole (a class's name is only read beside
    the others: {liver: 1, tumor: 2} against {kidney: 1, cyst: 2}). Only what `trained` records is compared; a
    label map only where both data sets have one; `ignore` leaves fields out.

    >>> differences({"label_map": {"background": 0, "liver": 1}}, {"label_map": {"background": 0, "kidney": 1}})
    [('label_map', {'background': 0, 'liver': 1}, {'background': 0, 'kidney': 1})]
    """
    found = []
    for section in trained:
        was, now = trained.get(section), other.get(section)
        if section == "label_map" and (was is None or now is None):
            continue
        if section == "label_map" or not isinstance(was, dict) or not isinstance(now, dict):
            if was != now and section not in ignore:
                found.append((section, was, now))
            continue
        for key in sorted(set(was) | set(now)):
            name = key if section == "preprocessing" else f"{section}.{key}"
            if was.get(key) != now.get(key) and key not in ignore:
                found.append((name, was.get(key), now.get(key)))
    return found


EVAL_OPTION = "--eval-across-preprocessings"


def check_eval(trained: dict, trained_from: str, eval_data: str, held_out: dict, across: bool = False) -> str | None:
    """Refuses held-out data preprocessed otherwise than the training data (`differences`; the shape aside: a
    volume's padding or crop does not change what a voxel is), whose scores would not be the model's.

    Args:
        trained: the training data's fingerprint; `trained_from`: where it comes from, for the sentence.
        eval_data: the held-out data (`--eval`); `held_out`: their fingerprint (`data_set.fingerprint`).
        across: score them anyway (`--eval-across-preprocessings`).

    Returns:
        None where they agree; else, with `across`, the note the scores carry (`across_preprocessings`).

    Raises:
        ValueError: they differ and `across` is False.
    """
    found = differences(trained, held_out, ignore=("shape", "examples"))  # held out: other cases
    if not found:
        return None
    key, was, now = found[0]
    more = f" (and {', '.join(k for k, _, _ in found[1:])} differ too)" if len(found) > 1 else ""
    if not across:
        raise ValueError(
            f"--eval {eval_data} holds data preprocessed with {key} {shown(now)} but the model trains on {key} "
            f"{shown(was)} ({trained_from}){more}, so its scores would not be the model's; convert the held-out "
            f"{_converted_as(trained)}, or pass {EVAL_OPTION} to score them anyway (the scores then say so).")
    return (f"scored across preprocessings: --eval {eval_data} has {key} {shown(now)}, the training data "
            f"{shown(was)}{more}")


def _converted_as(trained: dict) -> str:
    """How to convert held-out data as the training data were, in words: video clips name the clip settings.

    >>> _converted_as({"kind": "video clips", "preprocessing": {"clip_length": 8, "clip_stride": 8, "size": [16, 16],
    ...                                                         "fit": "crop"}})
    'videos as the training clips were (fullres preprocess video --clip-length 8 --clip-stride 8 --size 16,16 --fit crop)'
    """
    from preprocessing.records import tfrecord_schema

    recorded = trained.get("preprocessing") or {}
    if trained.get("kind") != tfrecord_schema.VIDEO_RECORDS or not recorded.get("size"):
        return "scans as the training data were (fullres preprocess ct with the same settings)"
    return (f"videos as the training clips were (fullres preprocess video --clip-length {recorded['clip_length']} "
            f"--clip-stride {recorded['clip_stride']} --size {','.join(map(str, recorded['size']))} "
            f"--fit {recorded['fit']})")
