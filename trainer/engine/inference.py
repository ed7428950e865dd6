"""The forward pass that evaluation, detection's predictions and `fullres predict` share (`make_forward`).

The model is called as training's loss calls it (`step`): Keras's `stateless_call` under explicit weights.

A batch goes onto the mesh as in training (batch over replicas, space over
the cores of each replica), the model runs once, and the output comes back
whole: class ids for scoring, or per-class probabilities for prediction. A
volume of any size is padded up to the nearest shape the model and the
partitioning accept, and the padding is cut off the output again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import keras
import numpy as np

from common import sizes
from trainer.engine import placement, sliding_window
from trainer.parallel import device_mesh, partitioning, split_ops, xla_compile


OUTPUTS = ("class_ids", "probabilities", "raw")


def make_forward(model: keras.Model, distribution: device_mesh.SpatialParallel, state: placement.TrainState,
                 image_ndim: int, output: str = "class_ids"):
    """`forward(state, placed_images)`, jitted with the distribution's shardings (images split as in training).

    Args:
        output: "class_ids" ((B, [D,] H, W) int32, the argmax, split like the features), "probabilities"
            ((B, [D,] H, W, K) float32, softmax, split like the features) or "raw" (the model's outputs as they
            are, e.g. RetinaNet's box and class maps, laid out as XLA chooses).
    """
    if output not in OUTPUTS:
        raise ValueError(f"output {output!r} is not known; use {', '.join(OUTPUTS)}.")

    def forward(state: placement.TrainState, images):
        outputs, _ = model.stateless_call(state.trainable, state.non_trainable, images, training=False)
        if output == "class_ids":
            return jnp.argmax(outputs, axis=-1).astype(jnp.int32)
        if output == "probabilities":
            return jax.nn.softmax(outputs.astype(jnp.float32), axis=-1)
        return outputs

    forward = split_ops.traced_split(forward, distribution.config.input_partition_dims,
                                     distribution.device_mesh)  # as training traces it
    image_layout = distribution.get_data_layout((0,) * image_ndim)
    in_shardings = (placement.state_shardings(state, distribution), image_layout.backend_layout)
    if output == "raw":
        return jax.jit(forward, in_shardings=in_shardings)
    if output == "probabilities":
        return jax.jit(forward, in_shardings=in_shardings, out_shardings=image_layout.backend_layout)
    # Class ids (B, [D,] H, W): the image layout without its channel axis.
    ids_layout = keras.distribution.TensorLayout(image_layout.axes[:-1], distribution.device_mesh)
    return jax.jit(forward, in_shardings=in_shardings, out_shardings=ids_layout.backend_layout)


def pad_batch(images: np.ndarray, batch_size: int) -> np.ndarray:
    """Pads the last, short batch with copies of its first example, so every replica gets an equal share."""
    if images.shape[0] == batch_size:
        return images
    return np.concatenate([images, np.repeat(images[:1], batch_size - images.shape[0], axis=0)])


def padded_shape(shape: Sequence[int], multiples: Sequence[int]) -> tuple[int, ...]:
    """The smallest shape at least `shape` whose every entry is a multiple of the matching `multiples` entry.

    >>> padded_shape((75, 131, 97), (16, 8, 8))
    (80, 136, 104)
    """
    return tuple(int(math.ceil(s / m) * m) for s, m in zip(shape, multiples))


def spatial_multiples(input_partition_dims: Sequence[int], downsampling_levels: int | Sequence[int]
                      ) -> tuple[int, ...]:
    """What each spatial size must divide by: 2^levels (the model's downsamplings along it) times its parts.

    >>> spatial_multiples((1, 4, 1, 1, 1), 3), spatial_multiples((1, 2, 2, 1, 1), (1, 2, 2))
    ((32, 8, 8), (4, 8, 4))
    """
    spatial = input_partition_dims[1:-1]
    levels = partitioning.per_axis(downsampling_levels, len(spatial))
    return tuple((2**level) * int(parts) for level, parts in zip(levels, spatial))


def lower_predict(forward, state, distribution: device_mesh.SpatialParallel, batch_shape: tuple[int, ...]):
    """Predict's pass, lowered: `forward` (`make_forward(..., "probabilities")`) on a float32 (1, [D,] H, W, C) batch
    laid out as predict places it. `state` may be arrays or their shapes: `VolumePredictor` compiles what it runs
    from here, and `fullres plan` sizes the same program for a target (`plan.predict_plan`)."""
    sharding = distribution.get_data_layout(batch_shape).backend_layout
    return forward.lower(state, jax.ShapeDtypeStruct(batch_shape, jnp.float32, sharding=sharding))


class VolumeTooLarge(ValueError):
    """A volume's forward pass needs more memory per device than the devices have; the message says what to do."""


def device_memory_limit(device) -> int | None:
    """Bytes one accelerator can hold (from its runtime); None where it does not say (CPUs)."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # some runtimes have no memory statistics
        return None
    return stats.get("bytes_limit")


class VolumePredictor:
    """Per-class probabilities of whole volumes, one partitioned forward pass each.

    Args:
        model, state: the trained model and its weights (as `trained_run.load` returns them).
        partition: the partitioning to predict with (its replica count is 1: one volume at a time).
        devices: the devices to use (the first `partition.num_cores_per_replica` of them).
        downsampling_levels: the model's downsamplings (one number, or one per spatial dimension), for padding.
        device_memory: bytes one device holds (None: as the accelerator's runtime says; no check on CPUs). Each
            padded shape is compiled ahead of time and its memory checked before anything runs.
        patch_size: predict by nnU-Net's sliding window of this (D, H, W) (`sliding_window`: a patch-trained
            model, or one asked to), each window one partitioned pass; None: the whole volume in one pass.
        pad_as: pad volumes as this split pads them (the training split): the padding is part of what the model
            sees (instance normalization averages over it, the convolutions at the border read it), so every split
            that runs on that one padded shape gives the training split's masks. A split runs on it when each axis
            divides by its parts (the input's placement needs that); the model's lower levels may then divide
            unevenly, which XLA's partitioner computes exactly (nothing in a forward pass is a `shard_map`). Only a
            split the padded shape does not divide pads further (`pads_beyond`), and its masks can differ.
    """

    def __init__(self, model, state: placement.TrainState, partition: partitioning.PartitionConfig, devices,
                 downsampling_levels: int | Sequence[int], device_memory: int | None = None,
                 patch_size: Sequence[int] | None = None, pad_as: Sequence[int] | None = None):
        cores = partition.num_cores_per_replica
        device_mesh.require_devices(cores, len(devices), f"input_partition_dims {list(partition.input_partition_dims)}")
        self.partition = partition
        self.distribution = device_mesh.make_distribution(partition, list(devices)[:cores])
        self.model = model
        self.state = placement.place_state(state, self.distribution)
        self.multiples = spatial_multiples(partition.input_partition_dims, downsampling_levels)
        spatial = len(partition.input_partition_dims) - 2
        self._runs_on = tuple(math.lcm(2**level, int(parts)) for level, parts in zip(  # what the pass accepts
            partitioning.per_axis(downsampling_levels, spatial), partition.input_partition_dims[1:-1]))
        self.pad_multiples = self.multiples if pad_as is None else spatial_multiples(pad_as, downsampling_levels)
        self.device_memory = device_memory if device_memory is not None else device_memory_limit(devices[0])
        self._forward = None
        self._compiled: dict[tuple[int, ...], object] = {}
        self.patch_size = None if patch_size is None else tuple(int(p) for p in patch_size)
        if self.patch_size is not None and any(p % m for p, m in zip(self.patch_size, self._runs_on)):
            raise ValueError(f"the sliding window's patch {list(self.patch_size)} must be a multiple of "
                             f"{list(self._runs_on)} along each axis (the model's downsampling and the split "
                             f"{','.join(map(str, partition.input_partition_dims))}); split it another way with "
                             "--input-partition-dims.")
        self.windows = 0  # the sliding windows of the last volume predicted

    def compiled(self, batch_shape: tuple[int, ...]):
        """The forward pass for (1, D, H, W, C) batches, compiled ahead of time and checked against device memory.

        Raises:
            VolumeTooLarge: it needs more than `device_memory` per device.
        """
        if batch_shape in self._compiled:
            return self._compiled[batch_shape]
        if self._forward is None:
            self._forward = make_forward(self.model, self.distribution, self.state, len(batch_shape), "probabilities")
        compiled, _ = xla_compile.compile(lower_predict(self._forward, self.state, self.distribution, batch_shape))
        memory = compiled.memory_analysis()
        needed = None if memory is None else (memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                              + memory.output_size_in_bytes - memory.alias_size_in_bytes)
        if self.device_memory is not None and needed is not None and needed > self.device_memory:
            cores = self.partition.num_cores_per_replica
            wanted = cores * 2 ** math.ceil(math.log2(needed / self.device_memory))
            raise VolumeTooLarge(
                f"the volume, padded to {'×'.join(map(str, batch_shape[1:-1]))}, needs {sizes.human_bytes(needed, smallest='MiB')} per device "
                f"split {','.join(map(str, self.partition.input_partition_dims))} over {cores} device(s), which hold "
                f"{sizes.human_bytes(self.device_memory, smallest='MiB')} each; split it over about {wanted} cores (size the layouts with: "
                f"fullres plan --image-size {','.join(map(str, batch_shape[1:-1]))} --partitions {wanted} --layouts all)")
        self._compiled[batch_shape] = compiled
        return compiled

    def padded_shape(self, spatial_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape a volume of `spatial_shape` is padded to before the forward pass (sliding: to one patch)."""
        if self.patch_size is not None:
            return tuple(max(s, p) for s, p in zip(spatial_shape, self.patch_size))
        shared = padded_shape(spatial_shape, self.pad_multiples)  # the training split's padding: every split's
        if all(size % multiple == 0 for size, multiple in zip(shared, self._runs_on)):
            return shared
        return padded_shape(spatial_shape, [math.lcm(a, b) for a, b in zip(self.pad_multiples, self._runs_on)])

    def pads_beyond(self, spatial_shape: Sequence[int]) -> str | None:
        """Where this split pads a volume of `spatial_shape` further than the training split does (its masks can
        then differ from the training split's), that in words; else None."""
        if self.patch_size is not None:
            return None
        shared, own = padded_shape(spatial_shape, self.pad_multiples), self.padded_shape(spatial_shape)
        if shared == own:
            return None
        dims = ",".join(map(str, self.partition.input_partition_dims))
        return (f"split {dims} pads {'×'.join(map(str, spatial_shape))} to {'×'.join(map(str, own))}, beyond the "
                f"training split's {'×'.join(map(str, shared))}, and the model sees padding (instance normalization "
                "averages over it), so its masks can differ from the training split's; a split whose parts divide "
                f"{'×'.join(map(str, shared))} gives them exactly")

    def describe(self) -> str:
        """How volumes meet the network, in words (predict's log and summary)."""
        return "whole volume, one pass" if self.patch_size is None else sliding_window.describe(self.patch_size)

    def _sliding(self, volume: np.ndarray, fill: float) -> np.ndarray:
        def forward(windows):  # (n, d, h, w, C) -> (n, d, h, w, K), one compiled shape for every window
            batch = windows.astype(np.float32)
            compiled = self.compiled(batch.shape)
            return placement.to_host(compiled(self.state, placement.place_batch(self.distribution, batch)))

        probabilities, self.windows = sliding_window.predict(volume, self.patch_size, forward, fill=fill)
        return probabilities

    def probabilities(self, volume: np.ndarray, fill: float = 0.0, pad_to: Sequence[int] | None = None) -> np.ndarray:
        """(D, H, W, C) volume -> (D, H, W, K) float32 class probabilities, padded with `fill` and unpadded.

        The padding is part of what the model sees (instance normalization and
        the convolutions at the border read it), so a volume padded to another
        shape can come back a little different; `pad_to` (a shape every
        partitioning compared accepts) fixes it, and the split itself then
        changes nothing. With `patch_size`, the sliding window (`pad_to` does not apply).
        """
        if self.patch_size is not None:
            return self._sliding(volume, fill)
        spatial = volume.shape[:-1]
        target = self.padded_shape(spatial) if pad_to is None else tuple(pad_to)
        if any(t < s or t % m for s, t, m in zip(spatial, target, self._runs_on)):
            raise ValueError(f"pad_to {list(target)} must be at least {list(spatial)} and a multiple of "
                             f"{list(self._runs_on)}.")
        padding = [(0, t - s) for s, t in zip(spatial, target)]
        padded = np.pad(volume, [*padding, (0, 0)], constant_values=fill) if any(p for _, p in padding) else volume
        batch = padded[None].astype(np.float32)
        forward = self.compiled(batch.shape)
        output = placement.to_host(forward(self.state, placement.place_batch(self.distribution, batch)))[0]
        return output[tuple(slice(0, s) for s in spatial)]

