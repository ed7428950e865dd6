"""Which augmentations a run applies on the device, with what probability and range: `AugmentationConfig`, presets.

The defaults are nnU-Net's (nnunetv2 2.x, `nnUNetTrainer.get_training_transforms`
with batchgeneratorsv2's transforms, and `configure_rotation_dummyDA_mirroring_and_inital_patch_size`
for 3D volumes): in nnU-Net's order,

| augmentation | probability | range |
| --- | --- | --- |
| rotation (each axis) | 0.2 per example | ±30° (`rotation_for_DA`, 3D) |
| scaling (one factor for all axes) | 0.2 | 0.7–1.4 (above 1 shrinks the anatomy) |
| Gaussian noise | 0.1 | σ ~ U(0, 0.1) |
| Gaussian blur | 0.2, then 0.5 per channel | σ ~ U(0.5, 1) per channel and axis |
| brightness (multiplicative) | 0.15 | × `BGContrast((0.75, 1.25))` |
| contrast | 0.15 | × `BGContrast((0.75, 1.25))` about the mean, range kept |
| low resolution | 0.25, then 0.5 per channel | shrink to U(0.5, 1), nearest down, linear up |
| gamma, inverted image | 0.1 | γ ~ `BGContrast((0.7, 1.5))`, mean and spread kept |
| gamma | 0.3 | γ ~ `BGContrast((0.7, 1.5))`, mean and spread kept |
| mirroring | 0.5 per axis | every spatial axis (`mirror_axes`) |

nnU-Net's elastic deformation is off by default (`p_elastic_deform=0`), and
so left out here. `compose` runs them inside the partitioned train step. nnU-Net normalizes CT by the data set's z-score, where these
ranges were tuned; fullres maps a CT window to [0, 1], on which the additive
noise (σ up to 0.1) is relatively stronger and the other ranges are relative anyway.

"""

from __future__ import annotations

import dataclasses
import math

from trainer.augment import intensity, mirror, spatial

NAMES = ("nnunet", "flips", "intensity", "video", "none")


@dataclasses.dataclass(frozen=True)
class AugmentationConfig:
    """The device augmentations of a segmentation run; every probability 0 and no mirror axes is none at all.

    Args:
        mirror_axes: spatial axes flipped with probability 1/2 each (0 = depth in 3D); () or None mirrors none. A model
            that must tell left from right leaves the left-right axis out (e.g. (0, 1) for (D, H, W) volumes
            whose W runs right to left).
        rotation_probability, rotation_degrees: rotate an example (each axis by U(−d, d) degrees); below 45.
        scale_probability, scale: scale an example by U(scale) on every axis.
        noise_probability, noise_sigma: add N(0, σ²) noise, σ ~ U(noise_sigma).
        blur_probability, blur_sigma: Gaussian blur, σ ~ U(blur_sigma) per channel and axis.
        brightness_probability, brightness: multiply by a factor in `brightness`.
        contrast_probability, contrast: scale about the mean by a factor in `contrast`, range kept.
        low_resolution_probability, low_resolution_scale: shrink to U(scale) and grow back.
        inverted_gamma_probability, gamma_probability, gamma: gamma curves (of the negated image, and of the
            image), γ in `gamma`.

    Example:
        >>> preset("flips").rotation_probability, preset("flips").mirror_axes
        (0.0, (0, 1, 2))
        >>> AugmentationConfig(mirror_axes=(0, 1)).mirror_axes
        (0, 1)
    """

    mirror_axes: tuple[int, ...] | None = (0, 1, 2)
    rotation_probability: float = 0.2
    rotation_degrees: float = 30.0
    scale_probability: float = 0.2
    scale: tuple[float, float] = (0.7, 1.4)
    noise_probability: float = 0.1
    noise_sigma: tuple[float, float] = (0.0, 0.1)
    blur_probability: float = 0.2
    blur_sigma: tuple[float, float] = (0.5, 1.0)
    brightness_probability: float = 0.15
    brightness: tuple[float, float] = (0.75, 1.25)
    contrast_probability: float = 0.15
    contrast: tuple[float, float] = (0.75, 1.25)
    low_resolution_probability: float = 0.25
    low_resolution_scale: tuple[float, float] = (0.5, 1.0)
    inverted_gamma_probability: float = 0.1
    gamma_probability: float = 0.3
    gamma: tuple[float, float] = (0.7, 1.5)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_probability") and not 0 <= value <= 1:
                raise ValueError(f"AugmentationConfig.{field.name} must be in [0, 1], got {value}.")
            if isinstance(value, (tuple, list)) and field.name != "mirror_axes":
                value = tuple(float(v) for v in value)
                object.__setattr__(self, field.name, value)
                if len(value) != 2 or not all(math.isfinite(v) for v in value) or value[0] > value[1] or value[0] < 0:
                    raise ValueError(f"AugmentationConfig.{field.name} must be a range LOW,HIGH of finite numbers "
                                     f"with 0 <= LOW <= HIGH, got {list(value)}.")
        object.__setattr__(self, "mirror_axes", tuple(int(a) for a in self.mirror_axes or ()))
        if len(set(self.mirror_axes)) != len(self.mirror_axes) or any(a < 0 for a in self.mirror_axes):
            raise ValueError(f"AugmentationConfig.mirror_axes must be distinct spatial axes (0 = the first), got "
                             f"{list(self.mirror_axes)}.")
        if not 0 <= self.rotation_degrees < 45:
            raise ValueError(f"AugmentationConfig.rotation_degrees must be in [0, 45) (fullres rotates in one-axis "
                             f"passes, which need cos > 0; nnU-Net's 3D default is 30), got {self.rotation_degrees}.")
        if self.scale[0] <= 0 or self.low_resolution_scale[0] <= 0 or self.low_resolution_scale[1] > 1:
            raise ValueError(f"AugmentationConfig.scale and low_resolution_scale need factors above 0 (and the low "
                             f"resolution at most 1), got {list(self.scale)} and {list(self.low_resolution_scale)}.")


def preset(name: str) -> AugmentationConfig:
    """A named augmentation recipe: `nnunet` (every augmentation, nnU-Net's defaults), `flips` (mirroring only,
    fullres's recipe before), `intensity` (noise, blur, brightness, contrast, low resolution, gamma; no mirroring
    or resampling), `video` (clips (T, H, W): mirroring of height and width, the same in every frame; noise,
    brightness, contrast and gamma drawn per clip; nothing that resamples across frames, and no temporal reversal
    (mirroring axis 0) unless `mirror_axes` names it) or `none`.

    Raises:
        ValueError: an unknown name (the known ones listed).
    """
    full = AugmentationConfig()
    off = {f.name: 0.0 for f in dataclasses.fields(AugmentationConfig) if f.name.endswith("_probability")}
    spatial_off = {"rotation_probability": 0.0, "scale_probability": 0.0}
    recipes = {
        "nnunet": full,
        "flips": dataclasses.replace(full, **off),
        "intensity": dataclasses.replace(full, mirror_axes=(), **spatial_off),
        "video": dataclasses.replace(full, mirror_axes=(1, 2), **spatial_off, blur_probability=0.0,
                                     low_resolution_probability=0.0),
        "none": dataclasses.replace(full, mirror_axes=(), **off),
    }
    if name not in recipes:
        raise ValueError(f"augmentation {name!r} is not known; use one of {', '.join(NAMES)}.")
    return recipes[name]


def compose(config: AugmentationConfig, images, labels, keys, num_classes: int, image_sharding=None,
            label_sharding=None):
    """Every augmentation `config` turns on, in nnU-Net's order, on the global batch inside the train step.

    Args:
        images: (B, *spatial, C) float32, split as `image_sharding` says; labels (B, *spatial) int32.
        keys: (B,) one per global batch row (`trainer.augment.keys.row_keys`).
        num_classes: the labels' classes (rotation resamples each class's indicator).
        image_sharding, label_sharding: the step's layouts, which rotation and scaling keep (None: one device).

    Returns:
        (images, labels), augmented.
    """
    if config.rotation_probability or config.scale_probability:
        angle = math.radians(config.rotation_degrees)
        images, labels = spatial.rotate_and_scale(
            images, labels, keys, num_classes, rotation_probability=config.rotation_probability,
            rotation=(-angle, angle), scale_probability=config.scale_probability, scale=config.scale,
            image_sharding=image_sharding, label_sharding=label_sharding)
    steps = (
        (intensity.gaussian_noise, config.noise_probability, {"sigma": config.noise_sigma}),
        (intensity.gaussian_blur, config.blur_probability, {"sigma": config.blur_sigma}),
        (intensity.brightness, config.brightness_probability, {"multiplier": config.brightness}),
        (intensity.contrast, config.contrast_probability, {"factor": config.contrast}),
        (intensity.low_resolution, config.low_resolution_probability, {"scale": config.low_resolution_scale}),
        (intensity.inverted_gamma, config.inverted_gamma_probability, {"gamma": config.gamma}),
        (intensity.gamma, config.gamma_probability, {"gamma": config.gamma}),
    )
    for augmentation, probability, ranges in steps:
        if probability:
            images, labels = augmentation(images, labels, keys, probability=probability, **ranges)
    if config.mirror_axes:
        images, labels = mirror.mirror(images, labels, keys, axes=config.mirror_axes)
    return images, labels
