"""Named training presets: functions that return a `TrainConfig`, each a starting point a user picks with `--preset`.

Every default lives in `TrainConfig`; a preset names only what it changes, and any keyword overrides it
(`smoke(steps=2)`). `config_resolution.resolve` starts from one of these, then applies the user's settings.
"""

from __future__ import annotations

from trainer.augment import recipe as augment_recipe
from trainer.config import TrainConfig
from trainer.models import retinanet, unet
from trainer.parallel import partitioning


def ct_256(**overrides) -> TrainConfig:
    """Full-resolution 256³ CT: the default (TPU-shaped) UNet, 16-way split over depth × height."""
    defaults = dict(model=unet.UNetConfig(spatial_dims=3, num_classes=3),  # TPU-shaped: 2×2×2 stem, 128-512 filters
                    partition=partitioning.PartitionConfig((1, 4, 4, 1, 1)), steps=20000, learning_rate=1e-3,
                    warmup_steps=500)
    return TrainConfig(**{**defaults, **overrides})


def nnunet(**overrides) -> TrainConfig:
    """nnU-Net's training recipe on the default (TPU-shaped) UNet: deep supervision, SGD, poly learning rate.

    nnunetv2's `nnUNetTrainer`: SGD with Nesterov momentum 0.99, weight decay
    3e-5, learning rate 1e-2 decayed as `(1 - t/T) ** 0.9`, no warm-up, and
    deep supervision (`UNetConfig.deep_supervision`), and its augmentation set on
    the device (`augmentation="nnunet"`). Add `encoder="residual"`
    for its ResEnc presets' encoder (`--encoder residual`).
    """
    defaults = dict(
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, deep_supervision=True),
        optimizer="sgd",
        momentum=0.99,
        weight_decay=3e-5,
        learning_rate=1e-2,
        schedule="poly",
        warmup_steps=0,
        augmentation=augment_recipe.preset("nnunet"),
    )
    return TrainConfig(**{**defaults, **overrides})


def demo(**overrides) -> TrainConfig:
    """The built-in demo: small synthetic volumes, trains to a useful Dice on 2 CPU cores."""
    defaults = dict(
        # Shaped for 2 CPU cores, not for TPU lanes: no stem, 8 filters at the scan's own resolution.
        model=unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=8, stem="none"),
        partition=partitioning.PartitionConfig((1, 1, 1, 1, 1)),
        steps=500,
        batch_size=2,
        learning_rate=3e-3,
        warmup_steps=20,
        checkpoint_every=100,
        log_every=20,
    )
    return TrainConfig(**{**defaults, **overrides})


def smoke(**overrides) -> TrainConfig:
    """A tiny run for smoke tests: seconds on a CPU."""
    defaults = dict(model=unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=2, base_filters=4, stem="none"),
                    steps=6, batch_size=2, learning_rate=1e-2, checkpoint_every=2, log_every=1)
    return TrainConfig(**{**defaults, **overrides})


def video(**overrides) -> TrainConfig:
    """Video clips (`fullres preprocess video`): the demo's small 3D UNet over (T, H, W) RGB frames, video augmentation."""
    model = unet.UNetConfig(spatial_dims=3, num_classes=3, in_channels=3, num_levels=3, base_filters=8, stem="none")
    return demo(**{"model": model, "augmentation": augment_recipe.preset("video"), "steps": 300, **overrides})


def detection(**overrides) -> TrainConfig:
    """RetinaNet (ResNet-18 + FPN) at 1024², unpartitioned; set `partition` for larger images."""
    defaults = dict(
        task="detection",
        model=retinanet.RetinaNetConfig(),
        partition=partitioning.PartitionConfig((1, 1, 1, 1)),
        image_size=(1024, 1024),
        steps=20000,
        batch_size=8,
        learning_rate=1e-3,
        warmup_steps=500,
    )
    return TrainConfig(**{**defaults, **overrides})


def detection_2560(**overrides) -> TrainConfig:
    """RetinaNet at 2560², each image split 8-way along its height."""
    return detection(**{"partition": partitioning.PartitionConfig((1, 8, 1, 1)), "image_size": (2560, 2560),
                        "batch_size": 1, **overrides})


def detection_demo(**overrides) -> TrainConfig:
    """The synthetic shapes (`fullres demo-data images`): a small RetinaNet that learns them on 2 CPU cores."""
    defaults = dict(
        task="detection",
        model=DETECTION_DEMO_MODEL,
        partition=partitioning.PartitionConfig((1, 1, 1, 1)),
        image_size=(256, 256),
        max_boxes=16,
        steps=1000,
        batch_size=8,
        learning_rate=3e-3,
        warmup_steps=100,
        checkpoint_every=250,
        log_every=50,
    )
    return TrainConfig(**{**defaults, **overrides})


# Anchors from 16 px (P3) to 101 px (P5): the synthetic shapes are 20–56 px wide, and KerasHub's default
# anchor_size 4 (32 px and up) leaves the smaller ones without any anchor of IoU ≥ 0.5, i.e. as background.
DETECTION_DEMO_MODEL = retinanet.RetinaNetConfig(
    num_classes=3, stackwise_num_blocks=(1, 1, 1, 1), stackwise_num_filters=(64, 64, 96, 128), head_filters=64,
    head_conv_layers=2, anchor_size=2.0,
)


DEFAULT_PRESETS = {"segmentation": TrainConfig, "detection": detection}


PRESETS = {"ct_256": ct_256, "demo": demo, "smoke": smoke, "nnunet": nnunet, "detection": detection, "detection_2560": detection_2560,
           "detection_demo": detection_demo, "video": video}
