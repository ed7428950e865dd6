"""The partitioned forward pass that evaluation and `fullres predict` share.

A fullres model sees a whole volume at once, split over the cores of a mesh.
`Inference` pads each batch to the nearest shape the model and the
partitioning accept (every spatial size a multiple of 2^downsamplings × its
partition count), runs one partitioned forward pass, and removes the padding:

    images (B, D, H, W, 1) --pad--> (B, D', H', W', 1) --mesh--> (B, D', H', W', C) --crop--> (B, D, H, W, C)

It returns class ids (argmax on the devices: what evaluation scores) or
per-class probabilities (softmax: what predict resamples onto the scan's own
grid). The jitted steps retrace for each new shape; a shape seen before reuses
its compilation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import keras
import numpy as np

from trainer import partitioning, step


class VolumeTooLarge(RuntimeError):
    """The padded volume does not fit the memory of the devices under this partitioning; the message says what would."""


def padded_shape(spatial_shape, partition_dims, downsampling_levels: int) -> tuple[int, ...]:
    """The smallest shape >= `spatial_shape` that a model with `downsampling_levels` halvings accepts under the split.

    Args:
        spatial_shape: (D, H, W) or (H, W).
        partition_dims: the input_partition_dims, one entry per feature dimension (batch first, channels last).
        downsampling_levels: how many times the model halves each spatial dimension.

    Example:
        >>> padded_shape((25, 31, 19), (1, 2, 1, 1, 1), 2)
        (32, 32, 20)
    """
    parts = tuple(partition_dims)[1:-1]
    multiples = [p * 2**downsampling_levels for p in parts]
    return tuple(int(math.ceil(n / m) * m) for n, m in zip(spatial_shape, multiples))


def pad_volume(images: np.ndarray, shape, fill: float) -> np.ndarray:
    """Pads (B, *spatial, C) `images` at the end of each spatial axis up to `shape` with `fill`."""
    widths = [(0, 0)] + [(0, t - n) for n, t in zip(images.shape[1:-1], shape)] + [(0, 0)]
    if not any(after for _, after in widths):
        return images
    return np.pad(images, widths, constant_values=fill)


def make_probability_step(model: keras.Model):
    """Returns `probability_step(state, images) -> softmax class probabilities (B, [D,] H, W, C)` (float32)."""

    def probability_step(state: step.TrainState, images):
        logits, _ = model.stateless_call(state.trainable, state.non_trainable, images, training=False)
        return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

    return probability_step


class Inference:
    """One trained model on one mesh: whole-volume class ids or probabilities, any volume size.

    Args:
        model: the Keras model (its variables are read through `state`).
        state: the model's state, placed on the distribution's mesh (`step.place_state`).
        distribution: the partitioning the forward pass runs under.
        downsampling_levels: how many times the model halves each spatial dimension.
        device_memory_bytes: memory of one device; None reads it from the device (accelerators report it,
            CPUs do not, and then only an allocation failure tells).
    """

    def __init__(self, model, state: step.TrainState, distribution: partitioning.SpatialParallel,
                 downsampling_levels: int, device_memory_bytes: int | None = None):
        self.model, self.state, self.distribution = model, state, distribution
        self.downsampling_levels = downsampling_levels
        self.device_memory_bytes = device_memory_bytes or _device_memory(distribution)
        self._steps: dict = {}

    @property
    def partition_dims(self) -> tuple[int, ...]:
        return self.distribution.config.input_partition_dims

    @property
    def cores(self) -> int:
        return self.distribution.config.num_cores_per_replica

    def _jitted(self, kind: str, ndim: int):
        key = (kind, ndim)
        if key not in self._steps:
            if kind == "class_ids":
                self._steps[key] = step.jit_predict_step(step.make_predict_step(self.model), self.distribution,
                                                         self.state, ndim)
            else:  # probabilities: laid out like the images (channels whole)
                layout = self.distribution.get_data_layout((0,) * ndim).backend_layout
                self._steps[key] = jax.jit(make_probability_step(self.model),
                                           in_shardings=(step.state_shardings(self.state, self.distribution), layout),
                                           out_shardings=layout)
        return self._steps[key]

    def _run(self, kind: str, images: np.ndarray, fill: float) -> np.ndarray:
        spatial = images.shape[1:-1]
        target = padded_shape(spatial, self.partition_dims, self.downsampling_levels)
        padded = pad_volume(images, target, fill)
        jitted = self._jitted(kind, padded.ndim)
        placed = step.place_batch(self.distribution, padded)
        if self.device_memory_bytes:
            self._check_memory(jitted, placed, target)
        try:
            output = step.to_host(jitted(self.state, placed))
        except Exception as error:  # XLA's allocation failure (XlaRuntimeError RESOURCE_EXHAUSTED); others propagate
            if "RESOURCE_EXHAUSTED" not in str(error) and "out of memory" not in str(error).lower():
                raise
            raise VolumeTooLarge(self._too_large(target, None)) from None
        return output[(slice(None), *(slice(0, n) for n in spatial))]

    def class_ids(self, images: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """(B, *spatial, C) images -> (B, *spatial) int32 class ids, argmax taken on the devices."""
        return self._run("class_ids", images, fill)

    def probabilities(self, images: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """(B, *spatial, C) images -> (B, *spatial, classes) float32 softmax probabilities."""
        return self._run("probabilities", images, fill)

    def _check_memory(self, jitted, placed, target) -> None:
        """Compiles ahead (as `fullres plan` does) and refuses a pass whose buffers exceed one device's memory."""
        analysis = jitted.lower(self.state, placed).compile().memory_analysis()
        if analysis is None:
            return
        needed = sum(getattr(analysis, f"{kind}_size_in_bytes", 0) for kind in ("argument", "output", "temp"))
        if needed > self.device_memory_bytes:
            raise VolumeTooLarge(self._too_large(target, needed))

    def _too_large(self, target, needed: int | None) -> str:
        cores = self.cores
        if needed and self.device_memory_bytes:
            cores = cores * 2 ** math.ceil(math.log2(needed / self.device_memory_bytes))
        else:
            cores = cores * 2
        size = "×".join(map(str, target))
        need = f" ({needed / 2**30:.1f} GiB per device)" if needed else ""
        return (f"the volume, padded to {size}, does not fit the memory of {self.cores} device(s) under "
                f"input_partition_dims {list(self.partition_dims)}{need}; it needs about {cores} cores: pass "
                f"--input-partition-dims splitting it {cores} ways, on as many devices.")


def _device_memory(distribution: partitioning.SpatialParallel) -> int | None:
    """One device's memory limit in bytes, when the device reports it (GPUs, TPUs; not CPUs)."""
    device = distribution.device_mesh.backend_mesh.devices.flat[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not implement it
        return None
    return (stats or {}).get("bytes_limit")
