"""The training step `fullres train` would run, lowered and compiled ahead of time for any layout, without running it.

Nothing runs and no input is allocated: the step for a `TrainConfig` (same task,
model, loss, labels, optimizer and schedule, built by `engine.program.build_model`
and `jit_step`) is lowered from `jax.ShapeDtypeStruct`s with the partitioned
shardings and compiled; `compiled.memory_analysis()` then gives the bytes each
device needs, and the HLO text shows the communication (`communication`):
`collective-permute` is halo exchange between neighbours (or ring attention's keys and values: `ring_traffic`), an `all-gather` of an
activation is a layer the compiler could not partition (it costs a
full-resolution copy on every device; `gathers` names each by its layer), and an
`all-to-all` moves a split from one axis to another (rotation and scaling resample
along an axis made whole that way: `trainer.augment.spatial`), one shard's bytes per device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from common import parsing
from trainer import config as config_lib
from trainer import config_resolution, presets
from trainer.engine import program, step
from trainer.models import user_model
from trainer.parallel import device_mesh, halo, partitioning, replicas, thin_shards
from trainer.plan import gathers, ring_traffic
from trainer.tasks import registry


MODELS = ("unet3d", "unet2d", "retinanet")

_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}


def default_partition_dims(partitions: int, rank: int) -> tuple[int, ...]:
    """`[1, N, 1, 1(, 1)]`: the usual TPU convention, N-way along the first spatial dimension."""
    dims = [1] * rank
    dims[1] = partitions
    return tuple(dims)

def communication(hlo_text: str, replica_batch: int, weight_shapes=()) -> tuple[list[gathers.Gather], int]:
    """(activation all-gathers, halo bytes per device) in a compiled module's HLO text.

    The gathers are `gathers.activation_gathers` (an all-gather whose result has the per-replica batch in front
    and is no weight's shape), each with its Keras layer and bytes (`gathers.of_step` names them right where the
    persistent cache served the program); the halo is the bytes of every collective-permute but the ring
    attention's (`ring_traffic.permute_bytes`, which counts those apart).
    """
    exchanged, _ = ring_traffic.permute_bytes(hlo_text)
    return gathers.activation_gathers(hlo_text, replica_batch, weight_shapes), exchanged

# `%name = (f32[2,16,1,8,16,1]{...}, f32[...]) all-to-all(` (one operand per peer) or a single array.
_ALL_TO_ALL = re.compile(r"=\s*(\([^)]*\)|[a-z0-9]+\[[0-9,]*\][^ ]*)\s+all-to-all(-start)?\(")
_SHAPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")


def all_to_all_bytes(hlo_text: str) -> int:
    """Bytes per device that a compiled module's all-to-alls deliver (their results, summed), 0 without any.

    Those inside a conditional (augmentations drawn for some steps only) count as if the branch ran.
    """
    total = 0
    for match in _ALL_TO_ALL.finditer(hlo_text):
        for dtype, dims in _SHAPE.findall(match.group(1)):
            total += math.prod(parsing.parse_list(dims, int, "HLO shape") or ()) * _DTYPE_BYTES.get(dtype, 4)
    return total


def plan_config(model: str | None = None, preset: str = "default", overrides: dict | None = None,
                task: str | None = None, given: dict | None = None, train_data: str = "") -> config_lib.TrainConfig:
    """The `TrainConfig` `fullres plan` sizes, through `config_resolution.resolve` like `fullres train`.

    `model` is shorthand: "unet3d" / "unet2d" (segmentation, 3D or 2D UNet),
    "retinanet" (detection), or a user's network as FILE.py:FUNCTION
    (segmentation; `model.spatial_dims` says 2D or 3D); None takes the task
    from `task`, else the preset's. `given`: how the command line gave each override (`config_resolution.resolve`).
    `train_data`: the records `fullres plan --data` names, resolved from as training resolves from its --train (their
    input channels: 3 for video clips).
    """
    user = user_model.is_source(model)
    if model is not None and model not in MODELS and not user:
        raise ValueError(f"--model {model!r} is not known; use one of {', '.join(MODELS)}, or your own network as "
                         f"{user_model.SOURCE_FORM} (e.g. --model nets/my_net.py:build).")
    if model is not None:
        task = "detection" if model == "retinanet" else "segmentation"
    elif task is None:
        task = presets.PRESETS[preset]().task if preset in presets.PRESETS else "segmentation"
    settings = dict(overrides or {})
    if model in ("unet3d", "unet2d") or user:
        spatial_dims = int(settings.setdefault("model.spatial_dims", 3 if model != "unet2d" else 2))
        settings.setdefault("partition.input_partition_dims", ",".join("1" * (spatial_dims + 2)))  # layouts replace it
    return config_resolution.resolve(task, preset, train_data, overrides=settings, model_source=model if user else None,
                                     given=given)

def example_shape(config: config_lib.TrainConfig, spatial_size: Sequence[int] | None) -> tuple[int, ...]:
    """One example's shape, channels last, as the task trains on it: (D, H, W, 1) at `spatial_size`, or (H, W, 3)."""
    return registry.make_task(config).planned_example_shape(None if spatial_size is None else tuple(spatial_size))

class StepBuilder:
    """One model per config (its variables on one device, shapes are all planning needs), compiled per layout."""

    def __init__(self, config: config_lib.TrainConfig, shape: tuple[int, ...]):
        import jax

        self.config, self.example_shape = config, shape
        self.image_shape = (config.batch_size, *shape)
        self.task = registry.make_task(config)
        self.dimension_names = registry.dimension_names(self.task)  # what the partition checks call each axis
        # No `keras.utils.set_random_seed`: the plan keeps only the variables' shapes, so their values (and the seed)
        # change nothing it reports, and that call imports TensorFlow to seed it (5 s of every `fullres plan`).
        self.model, self.optimizer, _, state = program.build_model(config, self.task, config.steps)
        self.state = jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), state)
        self._windows = None
        self._split_windows: dict = {}  # dims -> thin_shards.model_windows

    def compile_layout(self, dims: tuple[int, ...], devices):
        """Checks `dims` for `devices` (`check_layout`), lowers and compiles the train step; returns (compiled,
        distribution)."""
        self.check_layout(dims, len(devices))
        lowered, distribution = self.lower_layout(dims, devices)
        return lowered.compile(), distribution

    def check_layout(self, dims: tuple[int, ...], num_devices: int) -> None:
        """Refuses `dims` on `num_devices` where they cannot divide the devices or the batch (`replicas.validate`),
        the volume (`partitioning.validate`), or where XLA would compute this network's gradient wrongly
        (`check_thin_shards`).

        Raises:
            partitioning.PartitionError: one sentence naming the dimension and the fix.
        """
        partition = config_lib.with_dims(self.config, dims).partition
        replicas.validate(partition, num_devices, self.config.batch_size)
        partitioning.validate(partition, self.image_shape, downsampling_levels=self.config.model.downsampling_levels,
                              dimension_names=self.dimension_names)
        self.check_thin_shards(dims)

    def lower_layout(self, dims: tuple[int, ...], devices):
        """Lowers the train step for `dims` on `devices`; returns (lowered, distribution).

        `dims` are checked already, by `check_layout` or by the search that pruned them (`layout_search.prune`), so
        they are not checked again here.
        """
        partition = config_lib.with_dims(self.config, dims).partition
        distribution = device_mesh.make_distribution(partition, devices)
        arguments = step.step_arguments(self.task, self.state, distribution, self.image_shape)
        train_step = step.jit_step(self.task, self.model, self.optimizer, distribution, self.state, len(self.image_shape),
                                      self.config.kernels)
        return train_step.lower(*arguments), distribution

    def check_thin_shards(self, dims: tuple[int, ...]) -> None:
        """Refuses `dims` where XLA would compute this network's gradient wrongly (`thin_shards.check`)."""
        if thin_shards.splits_two_axes(dims) and isinstance(self.config.model, user_model.UserModelConfig):
            if dims not in self._split_windows:
                self._split_windows[dims] = thin_shards.model_windows(self.model, self.state, self.image_shape, dims)
            thin_shards.check(self._split_windows[dims], dims, self.image_shape)

    def windows(self) -> list[halo.Window]:
        """The model's convolutions and pooling windows (traced once per config)."""
        if self._windows is None:
            self._windows = halo.windows(self.model, self.state, self.image_shape)
        return self._windows

def compile_step(config: config_lib.TrainConfig, shape: tuple[int, ...], devices):
    """Lowers and compiles the training step `fullres train` runs for `config` on `devices`, without running it.

    Args:
        config: the run; its `partition` says the layout (not "auto").
        shape: one example, channels last, e.g. (D, H, W, 1) (`example_shape`).
        devices: the devices of one replica group (their count divides by the layout's cores).

    Returns:
        (the compiled step, its `device_mesh.SpatialParallel`); it takes
        `(TrainState, inputs, labels, step)` placed as `placement.place_state` and the task's `place` place them.
    """
    return StepBuilder(config, tuple(shape)).compile_layout(config.partition.input_partition_dims, devices)

def lower_step(config: config_lib.TrainConfig, shape: tuple[int, ...], devices):
    """`compile_step` before compiling: (the lowered step, its distribution)."""
    builder = StepBuilder(config, tuple(shape))
    builder.check_layout(config.partition.input_partition_dims, len(devices))
    return builder.lower_layout(config.partition.input_partition_dims, devices)
