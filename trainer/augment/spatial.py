"""nnU-Net's rotation and scaling as a pure JAX function over the global, spatially split batch, without an all-gather.

nnU-Net (batchgeneratorsv2's `SpatialTransform`) resamples each example at
`source = c + A (p − c)`, p an output voxel, c the volume's centre, A = Rz Ry Rx S:
rotations about each axis (each ~U(−30°, 30°)) and one scale for all axes
(~U(0.7, 1.4); above 1 shrinks the anatomy), trilinear for the image, and for the
labels each class's indicator resampled trilinearly and the largest one taken.
A voxel's source can be tens of voxels away, on another device: gathering the
volume would put a whole one on every device.

How fullres keeps it sharded:
1. **Three one-axis passes** (multi-pass resampling, as Catmull & Smith's two
   passes in 2D). The affine map is split into maps that each change one
   coordinate: the last axis first, then the middle, then the first; each pass
   reads, for every voxel, a linearly interpolated value along one axis only, at
   a position that is an affine function of the voxel's coordinates. This needs
   the leading minors of A to be non-zero, which holds for rotations below 45°
   (nnU-Net's 3D default is 30°). Three linear passes interpolate as much as one
   trilinear one; what a pass moves outside the volume is lost before the next
   (zero, as nnU-Net's padding), at the corners only.
2. **Each pass along an axis that is whole on every device.** Where the axis is
   split, its split moves to another spatial axis first (an all-to-all: each
   device sends and receives about one shard, never the volume) and moves back
   after the pass. The plan counts the bytes (`plan.compiled_step.communication`).

Elastic deformation is left out: nnU-Net's default recipe does not use it
(`p_elastic_deform=0`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from trainer.augment import draws

ROTATION_AND_SCALING = 201  # this augmentation's stream within a row's key (contracts.md)
MAX_ANGLE = math.pi / 4  # the passes need cos of every angle well above 0


def affine(keys, spatial_dims: int, rotation_probability: float = 0.2,
           rotation: tuple[float, float] = (-math.pi / 6, math.pi / 6), scale_probability: float = 0.2,
           scale: tuple[float, float] = (0.7, 1.4)):
    """Per row, nnU-Net's matrix A = Rz Ry Rx S (2D: R S) and whether it differs from the identity.

    Returns:
        ((B, d, d) float32 matrices, (B,) booleans).
    """
    if max(abs(a) for a in rotation) >= MAX_ANGLE:
        raise ValueError(f"rotation {rotation} reaches 45 degrees; fullres resamples in one-axis passes, which need "
                         f"angles below pi/4 (nnU-Net's 3D default is pi/6).")
    rows = draws.stream(keys, ROTATION_AND_SCALING, 4)
    rotate = draws.bernoulli(rows[:, 0], rotation_probability)
    zoom = draws.bernoulli(rows[:, 1], scale_probability)
    angles = jnp.where(rotate[:, None], draws.uniform(rows[:, 2], *rotation, (spatial_dims,)), 0.0)
    factor = jnp.where(zoom, draws.uniform(rows[:, 3], *scale), 1.0)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    one, zero = jnp.ones_like(factor), jnp.zeros_like(factor)
    if spatial_dims == 2:  # nnU-Net rotates 2D images by their last angle
        rotation_matrix = jnp.stack([jnp.stack([cos[:, 1], -sin[:, 1]], -1), jnp.stack([sin[:, 1], cos[:, 1]], -1)], 1)
    else:
        c, s = cos.T, sin.T
        rx = jnp.stack([jnp.stack([one, zero, zero], -1), jnp.stack([zero, c[0], -s[0]], -1),
                        jnp.stack([zero, s[0], c[0]], -1)], 1)
        ry = jnp.stack([jnp.stack([c[1], zero, s[1]], -1), jnp.stack([zero, one, zero], -1),
                        jnp.stack([-s[1], zero, c[1]], -1)], 1)
        rz = jnp.stack([jnp.stack([c[2], -s[2], zero], -1), jnp.stack([s[2], c[2], zero], -1),
                        jnp.stack([zero, zero, one], -1)], 1)
        rotation_matrix = rz @ ry @ rx
    return rotation_matrix * factor[:, None, None], rotate | zoom


def pass_coefficients(matrix: jax.Array, axis: int) -> jax.Array:
    """(B, d): the pass along `axis` reads position Σ_j coefficient_j × w_j (centred coordinates) along `axis`.

    The image after the pass along `axis` lives on coordinates w = (v_0 .. v_{axis-1}, u_axis .. u_{d-1}) (v = A u
    the source, u the output coordinates); the pass sets coordinate `axis` to v_axis = A_axis · H⁻¹ w, where H maps
    u to w (rows A_0 .. A_{axis-1}, then unit rows).
    """
    d = matrix.shape[-1]
    unit = jnp.broadcast_to(jnp.eye(d, dtype=matrix.dtype), matrix.shape)
    h = jnp.concatenate([matrix[:, :axis], unit[:, axis:]], axis=1)  # (B, d, d)
    return jnp.einsum("bj,bjk->bk", matrix[:, axis], jnp.linalg.inv(h))


def _names(mesh, group) -> tuple[str, ...]:
    """The mesh axes of one entry of a PartitionSpec that really split (size > 1)."""
    group = () if group is None else group if isinstance(group, tuple) else (group,)
    return tuple(n for n in group if mesh.shape[n] > 1)


def _whole_along(sharding: NamedSharding | None, shape: tuple[int, ...], axis: int):
    """A sharding of an array of `shape` like `sharding` but whole along `axis`, its split moved to another spatial
    axis, unsplit ones first (None: `axis` is already whole, nothing to move). XLA moves it with an all-to-all.

    Raises:
        ValueError: no other spatial axis divides by the parts it would then hold.
    """
    if sharding is None:
        return None
    mesh = sharding.mesh
    given = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    split = [_names(mesh, group) for group in given]
    moving = split[axis]
    if not moving:
        return None

    def parts(names):
        return math.prod(mesh.shape[n] for n in names)

    for other in sorted((a for a in range(1, len(shape) - 1) if a != axis), key=lambda a: parts(split[a])):
        if shape[other] % (parts(split[other]) * parts(moving)) == 0:
            names = split[other] + moving
            given[other], given[axis] = names[0] if len(names) == 1 else names, None
            return NamedSharding(mesh, PartitionSpec(*given))
    raise ValueError(
        f"rotation and scaling resample along spatial axis {axis - 1} of a {tuple(shape)} batch split "
        f"{sharding.spec}: no other spatial axis can take its {parts(moving)} parts; split fewer axes, or "
        "turn rotation and scaling off.")


def _pass(x: jax.Array, coefficients: jax.Array, axis: int, sharding: NamedSharding | None) -> jax.Array:
    """Linear interpolation along array `axis` of x (B, *spatial, C) at c + Σ_j coefficient_j (i_j − c_j)."""
    spatial = x.shape[1:-1]
    whole = _whole_along(sharding, x.shape, axis)
    if whole is not None:  # an all-to-all: the split moves to another axis (from the step's own layout)
        x = jax.lax.with_sharding_constraint(jax.lax.with_sharding_constraint(x, sharding), whole)
    position = 0.0
    for j, n in enumerate(spatial):
        coordinate = jnp.arange(n, dtype=jnp.float32) - (n - 1) / 2
        coordinate = coordinate.reshape((1,) * (1 + j) + (n,) + (1,) * (len(spatial) - 1 - j))
        position = position + draws.per_row(coefficients[:, j], len(spatial) + 1) * coordinate
    n = x.shape[axis]
    position = position + (n - 1) / 2  # (B, *spatial): where each voxel reads along `axis`
    below = jnp.floor(position)
    fraction = (position - below)[..., None]
    out = 0.0
    for index, weight in ((below, 1.0 - fraction), (below + 1, fraction)):
        inside = ((index >= 0) & (index <= n - 1))[..., None]
        gathered = jnp.take_along_axis(x, jnp.broadcast_to(jnp.clip(index, 0, n - 1).astype(jnp.int32)[..., None],
                                                           x.shape), axis=axis)
        out = out + jnp.where(inside, weight * gathered, 0.0)
    if whole is not None:  # and back (both ends pinned: else XLA gathers and slices)
        out = jax.lax.with_sharding_constraint(jax.lax.with_sharding_constraint(out, whole), sharding)
    return out


def _resample(x: jax.Array, matrices: jax.Array, sharding: NamedSharding | None) -> jax.Array:
    for axis in reversed(range(matrices.shape[-1])):
        x = _pass(x, pass_coefficients(matrices, axis), 1 + axis, sharding)
    return x


def rotate_and_scale(images, labels, keys, num_classes: int, rotation_probability: float = 0.2,
                     rotation: tuple[float, float] = (-math.pi / 6, math.pi / 6), scale_probability: float = 0.2,
                     scale: tuple[float, float] = (0.7, 1.4), image_sharding: NamedSharding | None = None,
                     label_sharding: NamedSharding | None = None):
    """Rotates and scales each drawn row about its centre, image and labels alike (nnU-Net's `SpatialTransform`).

    Args:
        num_classes: the labels' classes: each class's indicator is resampled and the largest wins.
        rotation: angles in radians, each axis's drawn on its own.
        scale: one factor for every axis; above 1 shrinks the anatomy (nnU-Net's convention).
        image_sharding, label_sharding: how the step lays the batch out; where a pass runs along a split axis,
            the split moves to another axis for it (None: leave the layout to XLA, e.g. on one device).
    """
    matrices, active = affine(keys, images.ndim - 2, rotation_probability, rotation, scale_probability, scale)

    def transform(operands):
        images, labels = operands
        indicators = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)  # (B, *spatial, K)
        label_sharding_k = None
        if label_sharding is not None:  # the indicators: the labels' layout, one axis more (whole)
            spec = (*label_sharding.spec, *(None,) * (indicators.ndim - len(label_sharding.spec)))
            label_sharding_k = NamedSharding(label_sharding.mesh, PartitionSpec(*spec))
        images = _resample(images, matrices, image_sharding)
        labels = jnp.argmax(_resample(indicators, matrices, label_sharding_k), axis=-1).astype(labels.dtype)
        return images, labels

    return jax.lax.cond(jnp.any(active), transform, lambda operands: operands, (images, labels))
