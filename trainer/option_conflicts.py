"""Options of `fullres train` that cannot hold together, each refused in one sentence before anything runs.

An option that another one switches off would otherwise be accepted and silently do nothing: `--no-augment
--augmentation nnunet` trained without augmentation, while the command line asked for nnU-Net's.
"""

from __future__ import annotations

from common import parsing
from trainer import config as config_lib


def augmentation(task: str, augment: bool | None, augmentation_name: str | None, settings: list[str]) -> str | None:
    """The sentence refusing `--augment`/`--augmentation` (or their `--set` keys) as given together, or None.

    Args:
        task: `--task`.
        augment: `--augment` / `--no-augment` (None: not given).
        augmentation_name: `--augmentation` (None: not given).
        settings: the `--set KEY=VALUE` flags.

    >>> augmentation("segmentation", False, "nnunet", [])
    '--no-augment switches augmentation off, but --augmentation nnunet configures it; pass one of them: --augmentation nnunet alone, or --no-augment alone (or with --augmentation none).'
    >>> augmentation("segmentation", False, "none", []), augmentation("segmentation", None, "nnunet", [])
    (None, None)
    """
    pairs = parsing.parse_settings(settings)
    if augmentation_name is not None and "augmentation" not in config_lib.setting_types(task):
        return (f"--augmentation sets segmentation's augmentations on the accelerator; --task {task} augments its "
                "input instead (--augment/--no-augment).")
    off = "--no-augment" if augment is False else None
    if augment is None and pairs.get("augment", "").lower() in ("false", "0", "no", "off"):
        off = f"--set augment={pairs['augment']}"
    asked = [f"--augmentation {augmentation_name}"] if augmentation_name not in (None, "none") else []
    asked += [f"--set {key}={value}" for key, value in pairs.items()
              if key.startswith("augmentation") and not (key == "augmentation" and value == "none")]
    if off is None or not asked or task not in config_lib.AUGMENTED_ON_DEVICE:
        return None
    return (f"{off} switches augmentation off, but {asked[0]} configures it; pass one of them: {asked[0]} alone, "
            f"or {off} alone (or with --augmentation none).")
