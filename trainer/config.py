"""Training configuration: one frozen dataclass, every default in it, named presets."""

from __future__ import annotations

import dataclasses

from trainer import partitioning, unet

PRECISIONS = ("float32", "bfloat16")
SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A segmentation training run.

    Args:
        train_data: TFRecord file pattern of the training set (CT schema), e.g.
            `data/train-*.tfrecord` or `gs://bucket/ct/train-*.tfrecord.gz`.
        output_dir: where checkpoints, TensorBoard logs, the exported model and
            `metrics.json` go. A rerun into the same directory resumes.
        eval_data: TFRecord pattern of held-out cases; evaluated at the end.
        model: the UNet architecture.
        partition: how every example is split across cores.
        steps: optimizer steps in total (ignored when `epochs` is set).
        epochs: if set, `steps = epochs × ceil(training cases / batch_size)`.
        batch_size: global batch size, split over the replicas.
        learning_rate: peak learning rate (Adam).
        warmup_steps: linear warm-up from 0 to `learning_rate`.
        schedule: "cosine" (decay to 0 at the last step) or "constant".
        precision: "float32", or "bfloat16" (bfloat16 compute, float32 weights).
        remat: recompute activations in the backward pass to save memory.
        checkpoint_every: save a checkpoint every this many steps (and at the end).
        keep_checkpoints: how many recent checkpoints to keep.
        log_every: log the loss every this many steps.
        augment: random flips along every spatial axis.
        seed: seeds weights, data order and augmentation.

    Example:
        >>> config = smoke(train_data="/tmp/train-*.tfrecord", output_dir="/tmp/run")
        >>> config.model.num_levels
        2
    """

    train_data: str = ""
    output_dir: str = ""
    eval_data: str | None = None
    model: unet.UNetConfig = unet.UNetConfig()
    partition: partitioning.PartitionConfig = partitioning.PartitionConfig()
    steps: int = 1000
    epochs: int | None = None
    batch_size: int = 1
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"
    precision: str = "float32"
    remat: bool = False
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    log_every: int = 10
    augment: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"TrainConfig.steps must be >= 1, got {self.steps}.")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"TrainConfig.epochs must be >= 1, got {self.epochs}.")
        if self.batch_size < 1:
            raise ValueError(f"TrainConfig.batch_size must be >= 1, got {self.batch_size}.")
        if self.learning_rate <= 0:
            raise ValueError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}.")
        if self.warmup_steps < 0:
            raise ValueError(f"TrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}.")
        if self.checkpoint_every < 1:
            raise ValueError(f"TrainConfig.checkpoint_every must be >= 1, got {self.checkpoint_every}.")
        if self.keep_checkpoints < 1:
            raise ValueError(f"TrainConfig.keep_checkpoints must be >= 1, got {self.keep_checkpoints}.")
        if self.log_every < 1:
            raise ValueError(f"TrainConfig.log_every must be >= 1, got {self.log_every}.")
        expected_rank = self.model.spatial_dims + 2
        if self.partition.rank != expected_rank:
            raise partitioning.PartitionError(
                f"input_partition_dims {list(self.partition.input_partition_dims)} has {self.partition.rank} "
                f"entries but a {self.model.spatial_dims}D model takes {expected_rank}-D inputs; give one entry per "
                f"dimension, e.g. {[1, 2] + [1] * (expected_rank - 2)}."
            )

    @property
    def dtype_policy(self) -> str:
        return "mixed_bfloat16" if self.precision == "bfloat16" else "float32"


def ct_256(**overrides) -> TrainConfig:
    """Full-resolution 256³ CT: 4-level UNet, 16-way split over depth × height."""
    defaults = dict(
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=4, base_filters=16),
        partition=partitioning.PartitionConfig((1, 4, 4, 1, 1)),
        steps=20000,
        learning_rate=1e-3,
        warmup_steps=500,
    )
    return TrainConfig(**{**defaults, **overrides})


def demo(**overrides) -> TrainConfig:
    """The built-in demo: small synthetic volumes, trains to a useful Dice on 2 CPU cores."""
    defaults = dict(
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=8),
        partition=partitioning.PartitionConfig((1, 1, 1, 1, 1)),
        steps=300,
        batch_size=2,
        learning_rate=3e-3,
        warmup_steps=20,
        checkpoint_every=100,
        log_every=20,
    )
    return TrainConfig(**{**defaults, **overrides})


def smoke(**overrides) -> TrainConfig:
    """A tiny run for smoke tests: seconds on a CPU."""
    defaults = dict(
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=2, base_filters=4),
        steps=6,
        batch_size=2,
        learning_rate=1e-2,
        checkpoint_every=2,
        log_every=1,
    )
    return TrainConfig(**{**defaults, **overrides})


PRESETS = {"ct_256": ct_256, "demo": demo, "smoke": smoke}
