"""Segmentation loss: soft Dice over the foreground classes plus cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

WHOLE_VOLUME_CLASS_BALANCE = 0.5  # the recipe's `class_balance` for whole volumes, measured over seeds: docs/recipe.md


def class_balance(setting: float | None, whole_volumes: bool) -> float:
    """A run's `dice_cross_entropy(class_balance=...)`: `setting` (`TrainConfig.class_balance`), or with None the
    recipe's: `WHOLE_VOLUME_CLASS_BALANCE` for whole volumes, 0 for patches (a third of them are centred on
    foreground, nnU-Net's answer to the same imbalance)."""
    if setting is not None:
        return float(setting)
    return WHOLE_VOLUME_CLASS_BALANCE if whole_volumes else 0.0


def dice_cross_entropy(logits: jax.Array, labels: jax.Array, dice_weight: float = 1.0, epsilon: float = 1e-5,
                       class_balance: float = 0.0) -> jax.Array:
    """Voxel cross-entropy plus `dice_weight` × (1 − soft Dice).

    The soft Dice is computed per example and per foreground class (class 0 is
    background) and averaged, so a small organ counts as much as a large one.

    The cross-entropy weighs each voxel by its class's count in the batch to the
    power −`class_balance` (0: the plain mean over voxels; 1: every class present
    in the batch weighs as much as every other, however few its voxels). The
    soft Dice of a class the network has pushed to a probability near 0 has a
    vanishing gradient (through the softmax, ∂p/∂z = p(1 − p)), so a small organ
    the first steps suppress is then learned from the cross-entropy alone, where
    its share of a whole volume's voxels is under 1 %; the weights give it back
    a share (docs/recipe.md).

    Args:
        logits: (B, [D,] H, W, C) float logits; computed in float32 whatever their dtype.
        labels: (B, [D,] H, W) integer class ids in [0, C).
        dice_weight: weight of the Dice term.
        epsilon: smoothing that keeps the Dice of an absent class finite.
        class_balance: the power of the cross-entropy's class weights, in [0, 1].

    Returns:
        A scalar float32 loss.
    """
    logits = logits.astype(jnp.float32)
    num_classes = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    one_hot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)  # (B, ..., C)
    voxel_loss = -jnp.sum(one_hot * log_probs, axis=-1)  # (B, ...)
    if class_balance:
        counts = jnp.sum(one_hot, axis=tuple(range(logits.ndim - 1)))  # (C,): the batch's voxels of each class
        weights = jnp.where(counts > 0, jnp.maximum(counts, 1.0) ** -class_balance, 0.0)  # (C,)
        voxel_weights = jnp.sum(one_hot * weights, axis=-1)  # (B, ...)
        cross_entropy = jnp.sum(voxel_weights * voxel_loss) / jnp.sum(voxel_weights)
    else:
        cross_entropy = jnp.mean(voxel_loss)

    probs = jnp.exp(log_probs)
    spatial_axes = tuple(range(1, logits.ndim - 1))
    intersection = jnp.sum(probs * one_hot, axis=spatial_axes)  # (B, C)
    total = jnp.sum(probs, axis=spatial_axes) + jnp.sum(one_hot, axis=spatial_axes)  # (B, C)
    dice = (2.0 * intersection + epsilon) / (total + epsilon)
    dice_loss = 1.0 - jnp.mean(dice[:, 1:])
    return cross_entropy + dice_weight * dice_loss


def class_dice(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Each class's Dice of the predicted class ids (argmax) over the whole batch: (C,), NaN where a class is
    neither labelled nor predicted.

    Example:
        >>> import numpy as np
        >>> logits = np.eye(3, dtype=np.float32)[np.array([[0, 1, 1, 0]])]  # (1, 4, 3): predicts 0, 1, 1, 0
        >>> [round(float(d), 2) for d in class_dice(logits, np.array([[0, 1, 0, 0]]))]
        [0.8, 0.67, nan]
    """
    num_classes = logits.shape[-1]
    predicted = jax.nn.one_hot(jnp.argmax(logits, axis=-1), num_classes, dtype=jnp.float32)  # (B, ..., C)
    true = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    axes = tuple(range(logits.ndim - 1))
    total = jnp.sum(predicted, axis=axes) + jnp.sum(true, axis=axes)  # (C,)
    overlap = jnp.sum(predicted * true, axis=axes)
    return jnp.where(total > 0, 2.0 * overlap / jnp.maximum(total, 1.0), jnp.nan)


def downsample_labels(labels: jax.Array, factors: tuple[int, ...]) -> jax.Array:
    """Class ids at 1/factor of the resolution along each spatial axis, nearest-neighbour, as nnU-Net makes them.

    nnU-Net downsamples the segmentation for deep supervision with
    `interpolate(mode="nearest-exact")`: output voxel i takes input voxel
    floor((i + 0.5) × factor), the centre voxel of its block (index factor // 2
    within it). Done here by a reshape into blocks and a slice within each
    block, so a spatially split label map is downsampled on each device in
    place, split like the features at that resolution (every split holds whole
    blocks: the model's sizes divide by 2^levels per device), with no communication.

    Args:
        labels: (B, [D,] H, W) class ids.
        factors: one integer per spatial axis, each dividing that axis's size.

    Example:
        >>> import numpy as np
        >>> downsample_labels(np.arange(8).reshape(1, 8), (4,)).tolist()
        [[2, 6]]
    """
    if all(f == 1 for f in factors):
        return labels
    batch, spatial = labels.shape[0], labels.shape[1:]
    blocks = [v for n, f in zip(spatial, factors) for v in (n // f, f)]
    x = labels.reshape(batch, *blocks)  # (B, D/f, f, H/f, f, W/f, f)
    centre = (slice(None),) + tuple(s for f in factors for s in (slice(None), f // 2))
    return x[centre]  # (B, D/f, H/f, W/f)


def deep_supervision(outputs, labels: jax.Array, weights, loss=dice_cross_entropy) -> jax.Array:
    """nnU-Net's `DeepSupervisionWrapper`: Σ weight_i × loss(outputs_i, labels at output i's resolution).

    Args:
        outputs: logits, full resolution first, then lower resolutions (each size divides the labels').
        labels: (B, [D,] H, W) class ids at full resolution, downsampled here for each output.
        weights: one per output (`UNetConfig.output_weights`).
    """
    if len(outputs) != len(weights):
        raise ValueError(f"{len(outputs)} model outputs but {len(weights)} deep supervision weights.")
    total = 0.0
    for logits, weight in zip(outputs, weights):
        factors = tuple(n // m for n, m in zip(labels.shape[1:], logits.shape[1:-1]))
        total = total + weight * loss(logits, downsample_labels(labels, factors))
    return total
