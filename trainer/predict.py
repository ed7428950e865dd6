"""`fullres predict`: the model's own preprocessing, read from the run it was trained in.

A fullres run records in `model_info.json` how its training scans were
prepared (spacing, orientation, HU window, modality: `summary.json`'s
`preprocessing`, copied by `fullres train`). Predict applies exactly that to
each new scan, so the user passes no preprocessing flags; a run trained before
this was recorded is refused with one sentence naming what is missing.
"""

import json
import os

# What predict needs to prepare a scan as the model's training scans were (see ct_transforms.preprocessing_record).
PREPROCESSING_FIELDS = ("spacing", "orientation", "window", "modality")


class ModelRefused(ValueError):
    """`--model` is not a fullres run predict can use; the message says why and what to do."""


def read_model_info(model_dir: str) -> dict:
    """The run's model_info.json, with its recorded preprocessing checked.

    Args:
        model_dir: the output directory of `fullres train`.

    Returns:
        model_info.json's fields; `preprocessing` holds every one of `PREPROCESSING_FIELDS`.

    Raises:
        ModelRefused: `model_dir` is not a fullres run, is not a segmentation
            model, or was trained before runs recorded their preprocessing.
    """
    info_path = os.path.join(model_dir, "model_info.json")
    weights_path = os.path.join(model_dir, "model.keras")
    if not os.path.isfile(info_path) or not os.path.isfile(weights_path):
        raise ModelRefused(f"--model {model_dir} is not a fullres run (it lacks model_info.json or model.keras); "
                           "pass the output directory of `fullres train`.")
    try:
        with open(info_path) as file:
            info = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise ModelRefused(f"--model {model_dir}: model_info.json cannot be read ({error}); "
                           "pass the output directory of a finished `fullres train`.") from None
    if info.get("task") != "segmentation":
        raise ModelRefused(f"--model {model_dir} is a {info.get('task')} model; `fullres predict` segments scans with a "
                           "segmentation model trained by `fullres train`.")
    recorded = info.get("preprocessing") or {}
    missing = [name for name in PREPROCESSING_FIELDS if name not in recorded]
    if missing:
        raise ModelRefused(
            f"--model {model_dir}: model_info.json does not record the preprocessing the model was trained with "
            f"(missing: {', '.join(missing)}); retrain it with this fullres on data from `fullres preprocess ct`, "
            "which records it.")
    return info
