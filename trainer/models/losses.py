"""Segmentation loss: soft Dice over the foreground classes plus cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dice_cross_entropy(logits: jax.Array, labels: jax.Array, dice_weight: float = 1.0, epsilon: float = 1e-5) -> jax.Array:
    """Mean voxel cross-entropy plus `dice_weight` × (1 − soft Dice).

    The soft Dice is computed per example and per foreground class (class 0 is
    background) and averaged, so a small organ counts as much as a large one.

    Args:
        logits: (B, [D,] H, W, C) float logits; computed in float32 whatever their dtype.
        labels: (B, [D,] H, W) integer class ids in [0, C).
        dice_weight: weight of the Dice term.
        epsilon: smoothing that keeps the Dice of an absent class finite.

    Returns:
        A scalar float32 loss.
    """
    logits = logits.astype(jnp.float32)
    num_classes = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    one_hot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)  # (B, ..., C)
    cross_entropy = -jnp.mean(jnp.sum(one_hot * log_probs, axis=-1))

    probs = jnp.exp(log_probs)
    spatial_axes = tuple(range(1, logits.ndim - 1))
    intersection = jnp.sum(probs * one_hot, axis=spatial_axes)  # (B, C)
    total = jnp.sum(probs, axis=spatial_axes) + jnp.sum(one_hot, axis=spatial_axes)  # (B, C)
    dice = (2.0 * intersection + epsilon) / (total + epsilon)
    dice_loss = 1.0 - jnp.mean(dice[:, 1:])
    return cross_entropy + dice_weight * dice_loss
