"""Training configuration: one frozen dataclass, every default in it, and its checks.

The named presets are `presets`; from a preset and a user's settings to a config is `config_resolution.resolve`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence

from trainer.augment import recipe as augment_recipe
from trainer.models import retinanet, unet, user_model
from trainer.parallel import kernels, partitioning

PRECISIONS = ("float32", "bfloat16")
SCHEDULES = ("cosine", "constant", "poly")
OPTIMIZERS = ("adam", "sgd")
TASKS = ("segmentation", "detection")
INPUT_CACHE = ("auto", "on", "off")  # trainer.data.decoded_cache.choose_cache
MODEL_TYPES = {"segmentation": unet.UNetConfig, "detection": retinanet.RetinaNetConfig}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A training run: segmentation (UNet on CT records) or detection (RetinaNet on image records).

    Args:
        task: "segmentation" or "detection"; `model` must be a `UNetConfig` (or a
            user's network, `UserModelConfig`) or a `RetinaNetConfig` to match.
        train_data: the training data set: its folder or a pattern of its records, wildcards in the folder part
            allowed (CT schema for segmentation, TF Object Detection API keys for detection), e.g. `data/ct`,
            `out/*/data-*` or `gs://bucket/ct/data-*.tfrecord.gz`; `preprocessing.records.data_set.resolve` is the rule.
        output_dir: where checkpoints, TensorBoard logs, the exported model and
            `metrics.json` go. A rerun into the same directory resumes.
        eval_data: the held-out data set (named as `train_data`); evaluated at the end.
        model: the architecture: `UNetConfig`, `RetinaNetConfig`, or a user's own network (`UserModelConfig`,
            `--model FILE.py:FUNCTION`).
        partition: how every example is split across cores.
        steps: optimizer steps in total (ignored when `epochs` is set).
        epochs: if set, `steps = epochs × ceil(training cases / batch_size)`.
        batch_size: global batch size, split over the replicas.
        learning_rate: peak learning rate.
        warmup_steps: linear warm-up from 0 to `learning_rate`.
        schedule: "cosine" (decay to 0 at the last step), "poly" (nnU-Net's
            `(1 - t/T) ** 0.9`, to 0 at the last step) or "constant".
        optimizer: "adam", or "sgd" (SGD with Nesterov momentum, nnU-Net's).
        momentum: SGD's momentum (nnU-Net: 0.99); Adam ignores it.
        weight_decay: each step shrinks the weights by `learning_rate × weight_decay` (nnU-Net: 3e-5); 0 turns it off.
        precision: "float32", or "bfloat16" (bfloat16 compute, float32 weights).
        remat: recompute activations in the backward pass to save memory.
        checkpoint_every: save a checkpoint every this many steps (and at the end).
        keep_checkpoints: how many recent checkpoints to keep.
        log_every: log the loss every this many steps.
        augment: segmentation: the device augmentations `augmentation` names (off: none); detection:
            scale jitter, random placement and left-right flips, in the input pipeline.
        augmentation: segmentation only: which augmentations run on the device, with nnU-Net's
            probabilities and ranges (`trainer.augment.recipe`); `--augmentation NAME` picks a preset
            (`nnunet`, `flips`, `intensity`, `none`), `--set augmentation.FIELD=...` any field.
        input_cache: segmentation: keep this process's decoded share of the data in memory: "auto", "on", "off".
        patch_size: segmentation: train on random (D, H, W) crops, a third centred on foreground (`data.patches`);
            predict and evaluation then slide a window of it (`engine.sliding_window`). None: whole volumes.
        class_balance: segmentation: the cross-entropy weighs each voxel by its class's count in the batch to the
            power −class_balance (0: plain; 1: every class alike); None: the recipe's for whole volumes or patches
            (`models.losses.class_balance`; docs/recipe.md).
        image_size: detection only: the (H, W) canvas every image is fitted to.
        max_boxes: detection only: boxes kept per training image.
        seed: seeds weights, data order and augmentation.
        allow_gathers: train even when the compiled step all-gathers whole activations (a layer XLA could not
            partition: every device then holds what the split was meant to divide); refused otherwise.

    Example:
        >>> config = TrainConfig(train_data="/tmp/train-*.tfrecord", output_dir="/tmp/run", steps=100)
        >>> config.steps, config.precision
        (100, 'float32')
    """

    task: str = "segmentation"
    train_data: str = ""
    output_dir: str = ""
    eval_data: str | None = None
    model: unet.UNetConfig | retinanet.RetinaNetConfig | user_model.UserModelConfig = unet.UNetConfig()
    partition: partitioning.PartitionConfig = partitioning.PartitionConfig()
    steps: int = 1000
    epochs: int | None = None
    batch_size: int = 1
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"
    optimizer: str = "adam"
    momentum: float = 0.99
    weight_decay: float = 0.0
    precision: str = "float32"
    remat: bool = False
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    log_every: int = 10
    augment: bool = True
    augmentation: augment_recipe.AugmentationConfig = augment_recipe.preset("flips")
    input_cache: str = "auto"
    patch_size: tuple[int, ...] | None = None
    class_balance: float | None = None
    seed: int = 0
    image_size: tuple[int, int] = (256, 256)
    max_boxes: int = 100
    allow_gathers: bool = False
    kernels: kernels.KernelsConfig = kernels.KernelsConfig()  # kernels fullres computes itself (kernels.py)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"TrainConfig.task must be one of {TASKS}, got {self.task!r}.")
        if isinstance(self.model, user_model.UserModelConfig):
            user_model.check_task(self.task, self.model.source)
        if not isinstance(self.model, (MODEL_TYPES[self.task], user_model.UserModelConfig)):
            raise ValueError(f"the {self.task} task trains a {MODEL_TYPES[self.task].__name__}, but the model is a "
                             f"{type(self.model).__name__}; pick a {self.task} preset or pass a matching model.")
        object.__setattr__(self, "image_size", tuple(int(s) for s in self.image_size))
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise ValueError(f"TrainConfig.image_size must be (height, width), got {self.image_size}.")
        for name in ("max_boxes", "steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"TrainConfig.epochs must be >= 1, got {self.epochs}.")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):  # nan passed a `<= 0` test
            raise ValueError(f"TrainConfig.learning_rate must be a finite number > 0, got {self.learning_rate}.")
        if self.warmup_steps < 0:
            raise ValueError(f"TrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}.")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"TrainConfig.momentum must be in [0, 1), got {self.momentum}.")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"TrainConfig.weight_decay must be a finite number >= 0, got {self.weight_decay}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}.")
        if self.input_cache not in INPUT_CACHE:
            raise ValueError(f"TrainConfig.input_cache must be one of {INPUT_CACHE}, got {self.input_cache!r}.")
        if self.class_balance is not None and not 0 <= self.class_balance <= 1:  # nan fails it too
            raise ValueError(f"TrainConfig.class_balance must be in [0, 1] or None, got {self.class_balance}.")
        if self.patch_size is not None:
            object.__setattr__(self, "patch_size", tuple(int(s) for s in self.patch_size))
            if self.task != "segmentation" or len(self.patch_size) != self.model.spatial_dims or min(self.patch_size) < 1:
                raise ValueError(f"TrainConfig.patch_size must be {self.model.spatial_dims} positive sizes (segmentation"
                                 f" only), got {list(self.patch_size)}.")
        if self.model.spatial_dims == 2 and self.augmentation.mirror_axes == (0, 1, 2):  # the default: every axis
            object.__setattr__(self, "augmentation", dataclasses.replace(self.augmentation, mirror_axes=(0, 1)))
        beyond = [a for a in self.augmentation.mirror_axes if a >= self.model.spatial_dims]
        if beyond:
            raise ValueError(f"augmentation.mirror_axes {list(self.augmentation.mirror_axes)} names axis {beyond[0]}, "
                             f"which a {self.model.spatial_dims}D model does not have; use axes 0 to "
                             f"{self.model.spatial_dims - 1}.")
        expected_rank = self.model.spatial_dims + 2
        if not self.partition.is_auto and self.partition.rank != expected_rank:
            raise partitioning.PartitionError(
                f"input_partition_dims {list(self.partition.input_partition_dims)} has {self.partition.rank} "
                f"entries but a {self.model.spatial_dims}D model takes {expected_rank}-D inputs; give one entry per "
                f"dimension, e.g. {[1, 2] + [1] * (expected_rank - 2)}."
            )
        if not self.partition.is_auto:  # a split of the batch or the channels is refused at once, as a wrong rank is
            partitioning.check_dims(self.partition)

    @property
    def dtype_policy(self) -> str:
        return "mixed_bfloat16" if self.precision == "bfloat16" else "float32"


AUGMENTED_ON_DEVICE = ("segmentation",)  # tasks whose `augmentation` runs in the step (detection's is its input's)


def setting_types(task: str, user_network: bool = False) -> dict[str, object]:
    """Every key `resolve` accepts for `task` (with a user's network: its model's keys), with its declared type."""
    fixed = {"task", "train_data", "output_dir", "eval_data", "model", "partition", "augmentation", "kernels"}
    hints = {k: v for k, v in typing.get_type_hints(TrainConfig).items() if k not in fixed}
    model_type = user_model.UserModelConfig if user_network else MODEL_TYPES[task]
    sections = [("model", model_type), ("partition", partitioning.PartitionConfig), ("kernels", kernels.KernelsConfig)]
    if task in AUGMENTED_ON_DEVICE:
        hints["augmentation"] = str  # a preset's name (`augment_recipe.preset`); its fields as augmentation.FIELD
        sections.append(("augmentation", augment_recipe.AugmentationConfig))
    for section, cls in sections:
        hints.update({f"{section}.{k}": v for k, v in typing.get_type_hints(cls).items()})
    return hints


def to_dict(config: TrainConfig) -> dict:
    """A JSON-ready dict of `config` (the model and partition nested), as `from_dict` reads it back."""
    return dataclasses.asdict(config)


def from_dict(values: dict) -> TrainConfig:
    """Rebuilds a `TrainConfig` from `to_dict`'s output (e.g. `train_config.json` beside a trained model)."""
    values = dict(values)
    task = values.get("task", "segmentation")
    model_values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.pop("model").items()}
    partition_values = values.pop("partition")
    label_dims = partition_values.get("label_partition_dims")
    input_dims = partition_values["input_partition_dims"]
    partition = partitioning.PartitionConfig(input_dims if isinstance(input_dims, str) else tuple(input_dims),
                                             None if label_dims is None else tuple(label_dims))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown training settings {sorted(unknown)}; was the model trained by a newer fullres?")
    values.update({key: tuple(values[key]) for key in ("image_size", "patch_size") if values.get(key) is not None})
    values["kernels"] = kernels.from_dict(values.get("kernels"))  # absent from runs before kernel choice: XLA's own
    values.setdefault("class_balance", 0.0)  # absent from older runs: the plain cross-entropy they trained
    if "augmentation" in values:  # absent from older runs: the default (flips), what they trained with
        values["augmentation"] = augment_recipe.AugmentationConfig(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in values["augmentation"].items()})
    model_type = user_model.UserModelConfig if "function" in model_values else MODEL_TYPES[task]
    return TrainConfig(model=model_type(**model_values), partition=partition, **values)


def with_dims(config: TrainConfig, dims: Sequence[int]) -> TrainConfig:
    """`config` split by `dims` ("auto" resolved, or a layout the plan compiles); labels given as dims (split like the
    features) follow them, with or without their channels, and labels kept whole stay whole."""
    labels = config.partition.label_partition_dims
    labels = labels if labels is None else tuple(dims) if len(labels) == len(dims) else (1, *dims[1:-1])
    return dataclasses.replace(config, partition=partitioning.PartitionConfig(tuple(dims), labels))
