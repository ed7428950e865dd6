"""nnU-Net's intensity augmentations as pure JAX functions over the global, spatially split batch.

Each is `f(images, labels, keys, **params) -> (images, labels)` (contracts.md): images
(B, *spatial, C) float32, labels (B, *spatial) int32 (returned as they came), keys (B,)
one per row of the global batch. The defaults of every parameter are nnunetv2's
(`nnUNetTrainer.get_training_transforms`, batchgeneratorsv2's transforms); a row is
augmented with `probability`, and, where nnU-Net draws per channel, each channel
on its own.

None of them all-gathers a split volume:
* noise, brightness and contrast/gamma are per voxel (contrast and gamma reduce
  each example to its mean, spread and range first: an all-reduce of scalars);
* blur and the low-resolution simulation are separable filters with a few voxels
  of reach (`banded`): along a split axis, XLA exchanges that halo with the neighbours.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trainer.augment import draws

# Each augmentation's stream within a row's key (contracts.md): fixed forever, so resumed runs draw the same.
NOISE, BLUR, BRIGHTNESS, CONTRAST, LOW_RESOLUTION, INVERTED_GAMMA, GAMMA = 101, 102, 103, 104, 105, 106, 107


def _spatial_axes(images) -> tuple[int, ...]:
    return tuple(range(1, images.ndim - 1))


def _when(active: jax.Array, transform, images):
    """`transform(images)` if any row is active, else `images` untouched (a batch none of whose rows drew the
    augmentation costs nothing)."""
    return jax.lax.cond(jnp.any(active), transform, lambda x: x, images)


def gaussian_noise(images, labels, keys, probability: float = 0.1, sigma: tuple[float, float] = (0.0, 0.1)):
    """Adds N(0, s²) noise to every voxel, s ~ U(sigma) per row (the same for every channel, as nnU-Net)."""
    rows = draws.stream(keys, NOISE, 3)
    active = draws.bernoulli(rows[:, 0], probability)  # (B,)
    scale = jnp.where(active, draws.uniform(rows[:, 1], *sigma), 0.0)

    def add(x):
        noise = jax.vmap(lambda key: jax.random.normal(key, x.shape[1:], jnp.float32))(rows[:, 2])
        return x + draws.per_row(scale, x.ndim) * noise

    return _when(active, add, images), labels


def banded(x: jax.Array, axis: int, weights: jax.Array) -> jax.Array:
    """A filter along one spatial `axis` with its own weights at every position, row and channel.

    out[b, .., i, .., c] = Σ_m weights[b, i, c, m] × x[b, .., i + m - R, .., c] (zero outside the volume),
    with R = (weights.shape[-1] - 1) / 2. The 2R + 1 shifted copies come from one convolution with one-hot
    kernels, which XLA partitions as the UNet's convolutions: R slabs exchanged with each neighbour along a
    split axis, once.

    Args:
        x: (B, *spatial, C).
        axis: the array axis to filter along (1 to x.ndim - 2).
        weights: (B, n, C, 2R + 1), n = x.shape[axis].
    """
    taps = weights.shape[-1]
    spatial = x.ndim - 2
    channels = x.shape[-1]
    window = [1] * spatial
    window[axis - 1] = taps
    kernel = jnp.eye(taps, dtype=x.dtype).reshape(*window, 1, taps)  # tap t of the window -> output channel t
    kernel = jnp.tile(kernel, (1,) * spatial + (1, channels))  # (…, 1, C × taps): each channel its own copies
    dimensions = ("NDHWC", "DHWIO", "NDHWC") if spatial == 3 else ("NHWC", "HWIO", "NHWC")
    shifted = jax.lax.conv_general_dilated(x, kernel, (1,) * spatial, "SAME", dimension_numbers=dimensions,
                                           feature_group_count=channels)  # (B, *spatial, C × taps)
    shifted = shifted.reshape(*x.shape, taps)  # (B, *spatial, C, taps): channel c's copy shifted by tap − R
    weight = jnp.expand_dims(weights, [a for a in range(1, x.ndim - 1) if a != axis])  # (B, .., n, .., C, taps)
    return jnp.sum(weight * shifted, axis=-1)


def _offsets_matrix(sources: np.ndarray, radius: int) -> np.ndarray:
    """(n, T, 2R + 1) one-hot of sources[i, t] - i: where tap t of position i reads, as a band offset."""
    n = sources.shape[0]
    offsets = sources - np.arange(n)[:, None] + radius
    return np.eye(2 * radius + 1, dtype=np.float32)[offsets]


def _kernel_size(sigma, truncate: float = 6.0, numpy=jnp):
    """batchgeneratorsv2's Gaussian kernel size: sigma × truncate + 0.5 rounded (half to even) to the nearest odd."""
    value = sigma * truncate + 0.5
    rounded = numpy.round(value)
    even = numpy.mod(rounded, 2) == 0
    return numpy.where(even, numpy.where(value - rounded >= 0, rounded + 1, rounded - 1), rounded)


def gaussian_blur(images, labels, keys, probability: float = 0.2, sigma: tuple[float, float] = (0.5, 1.0),
                  probability_per_channel: float = 0.5):
    """Gaussian smoothing, separable, with its own sigma per channel and axis (~U(sigma)), mirrored at the border.

    As batchgeneratorsv2's `GaussianBlurTransform` (kernel truncated at 6 sigma,
    rounded to an odd size; reflect padding) with nnU-Net's settings: a row with
    probability 0.2, each of its channels with probability 0.5.
    """
    spatial = _spatial_axes(images)
    channels = images.shape[-1]
    rows = draws.stream(keys, BLUR, 3)
    active = draws.bernoulli(rows[:, 0], probability)[:, None] & draws.bernoulli(
        rows[:, 1], probability_per_channel, (channels,))  # (B, C)
    sigmas = draws.uniform(rows[:, 2], *sigma, (channels, len(spatial)))  # (B, C, axes)
    radius = int(_kernel_size(max(sigma), numpy=np) - 1) // 2  # the widest kernel's; narrower ones pad with 0
    taps = np.arange(-radius, radius + 1)

    def blur(x):
        for index, axis in enumerate(spatial):
            s = sigmas[..., index][..., None]  # (B, C, 1)
            half = (_kernel_size(s) - 1) / 2
            kernel = jnp.where(jnp.abs(taps) <= half, jnp.exp(-0.5 * (taps / s) ** 2), 0.0)
            kernel = kernel / jnp.sum(kernel, axis=-1, keepdims=True)
            kernel = jnp.where(active[..., None], kernel, (taps == 0).astype(jnp.float32))  # (B, C, taps)
            n = x.shape[axis]
            reach = np.arange(n)[:, None] + taps  # (n, taps): where each tap reads, mirrored at the border
            reach = np.abs(reach)
            reach = np.where(reach > n - 1, 2 * (n - 1) - reach, reach)
            weights = jnp.einsum("bct,itm->bicm", kernel, _offsets_matrix(reach, radius))
            x = banded(x, axis, weights)
        return x

    return _when(active, blur, images), labels


def brightness(images, labels, keys, probability: float = 0.15, multiplier: tuple[float, float] = (0.75, 1.25)):
    """Multiplies each channel by a factor drawn as `BGContrast(multiplier)` (nnU-Net's multiplicative brightness)."""
    rows = draws.stream(keys, BRIGHTNESS, 2)
    active = draws.bernoulli(rows[:, 0], probability)[:, None]  # (B, 1)
    factor = jnp.where(active, draws.bg_contrast(rows[:, 1], *multiplier, (images.shape[-1],)), 1.0)  # (B, C)
    return images * draws.per_row(factor, images.ndim), labels


def contrast(images, labels, keys, probability: float = 0.15, factor: tuple[float, float] = (0.75, 1.25),
             preserve_range: bool = True):
    """Scales each channel about its mean by a `BGContrast(factor)` draw, clipped to its former range."""
    spatial = _spatial_axes(images)
    rows = draws.stream(keys, CONTRAST, 2)
    active = draws.bernoulli(rows[:, 0], probability)[:, None]
    scale = draws.per_row(jnp.where(active, draws.bg_contrast(rows[:, 1], *factor, (images.shape[-1],)), 1.0),
                          images.ndim)
    mean = jnp.mean(images, axis=spatial, keepdims=True)  # (B, 1, 1, 1, C)
    out = (images - mean) * scale + mean
    if preserve_range:
        out = jnp.clip(out, jnp.min(images, axis=spatial, keepdims=True), jnp.max(images, axis=spatial, keepdims=True))
    return jnp.where(draws.per_row(active, images.ndim), out, images), labels


def _low_resolution_radius(n: int, smallest_scale: float) -> int:
    """The farthest a voxel of an axis of n voxels reads in `low_resolution`, over every size it may shrink to."""
    reach = 0
    for size in range(max(1, round(n * smallest_scale)), n + 1):
        position = np.maximum((np.arange(n) + 0.5) * size / n - 0.5, 0.0)
        first = np.minimum(np.floor(position), size - 1)
        for j in (first, np.minimum(first + 1, size - 1)):
            source = np.minimum(np.floor((j + 0.5) * n / size), n - 1)
            reach = max(reach, int(np.max(np.abs(source - np.arange(n)))))
    return reach + 1  # float32 on the device may land one voxel off where float64 here does not


def low_resolution(images, labels, keys, probability: float = 0.25, scale: tuple[float, float] = (0.5, 1.0),
                   probability_per_channel: float = 0.5):
    """Simulates a coarser scan: each channel shrunk to ~U(scale) of its size (nearest), then grown back (linear).

    As batchgeneratorsv2's `SimulateLowResolutionTransform` with nnU-Net's
    settings (one scale for every axis, its own per channel; `interpolate`
    nearest-exact down, linear with align_corners=False up): both are fixed
    linear maps along each axis that read a few voxels away, so the two
    resamplings are one `banded` filter per axis, computed for the volume's own size.
    """
    spatial = _spatial_axes(images)
    channels = images.shape[-1]
    rows = draws.stream(keys, LOW_RESOLUTION, 3)
    active = draws.bernoulli(rows[:, 0], probability)[:, None] & draws.bernoulli(
        rows[:, 1], probability_per_channel, (channels,))  # (B, C)
    factor = draws.uniform(rows[:, 2], *scale, (channels,))[..., None]  # (B, C, 1)

    def resample(x):
        for axis in spatial:
            n = x.shape[axis]
            radius = _low_resolution_radius(n, min(scale))
            size = jnp.maximum(jnp.round(n * factor), 1.0)  # (B, C, 1): the shrunken length
            position = jnp.maximum((jnp.arange(n) + 0.5) * size / n - 0.5, 0.0)  # (B, C, n)
            first = jnp.minimum(jnp.floor(position), size - 1)
            second = jnp.minimum(first + 1, size - 1)
            fraction = position - first
            weights = 0.0
            for j, weight in ((first, 1.0 - fraction), (second, fraction)):
                source = jnp.minimum(jnp.floor((j + 0.5) * n / size), n - 1)
                offset = (source - jnp.arange(n)).astype(jnp.int32) + radius  # (B, C, n)
                weights = weights + weight[..., None] * jax.nn.one_hot(offset, 2 * radius + 1)
            identity = jax.nn.one_hot(radius, 2 * radius + 1)
            weights = jnp.where(active[..., None, None], weights, identity)  # (B, C, n, taps)
            x = banded(x, axis, jnp.transpose(weights, (0, 2, 1, 3)))
        return x

    return _when(active, resample, images), labels


def _gamma(images, keys, stream_id: int, probability: float, gamma: tuple[float, float], invert_probability: float,
           retain_stats: bool):
    spatial = _spatial_axes(images)
    channels = images.shape[-1]
    rows = draws.stream(keys, stream_id, 3)
    active = draws.per_row(draws.bernoulli(rows[:, 0], probability), images.ndim)
    exponent = draws.per_row(draws.bg_contrast(rows[:, 1], *gamma, (channels,)), images.ndim)
    invert = draws.per_row(draws.bernoulli(rows[:, 2], invert_probability, (channels,)), images.ndim)
    sign = jnp.where(invert, -1.0, 1.0)
    x = images * sign
    low = jnp.min(x, axis=spatial, keepdims=True)
    span = jnp.max(x, axis=spatial, keepdims=True) - low
    out = jnp.power((x - low) / jnp.maximum(span, 1e-7), exponent) * span + low
    if retain_stats:  # the mean and (unbiased) standard deviation the channel had
        mean, std = jnp.mean(x, axis=spatial, keepdims=True), jnp.std(x, axis=spatial, keepdims=True, ddof=1)
        new_mean, new_std = jnp.mean(out, axis=spatial, keepdims=True), jnp.std(out, axis=spatial, keepdims=True, ddof=1)
        out = (out - new_mean) * (std / jnp.maximum(new_std, 1e-7)) + mean
    return jnp.where(active, out * sign, images)


def inverted_gamma(images, labels, keys, probability: float = 0.1, gamma: tuple[float, float] = (0.7, 1.5),
                   invert_probability: float = 1.0, retain_stats: bool = True):
    """nnU-Net's first gamma transform: the gamma curve applied to the negated image (dark and bright swap roles)."""
    return _gamma(images, keys, INVERTED_GAMMA, probability, gamma, invert_probability, retain_stats), labels


def gamma(images, labels, keys, probability: float = 0.3, gamma: tuple[float, float] = (0.7, 1.5),
          invert_probability: float = 0.0, retain_stats: bool = True):
    """nnU-Net's gamma transform: each channel mapped to [0, 1], raised to a `BGContrast(gamma)` power, mapped
    back, and given its former mean and standard deviation again."""
    return _gamma(images, keys, GAMMA, probability, gamma, invert_probability, retain_stats), labels

