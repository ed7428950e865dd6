"""Per-device memory of a partitioned training step, read from the ahead-of-time compiled step.

Nothing runs and no input is allocated: the step is lowered from
`jax.ShapeDtypeStruct`s with the partitioned shardings and compiled, then
`compiled.memory_analysis()` gives the bytes each device needs and the HLO text
shows the communication: `collective-permute` is halo exchange between
neighbours, an `all-gather` of an activation is a layer the compiler could not
partition (it costs a full-resolution copy on every device).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from trainer import losses, partitioning, retinanet, step, unet

MODELS = ("unet3d", "unet2d", "retinanet")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}
# `%name = f32[1,2,3]{...} collective-permute(` or the async `-start` form, whose result is a tuple.
_INSTRUCTION = re.compile(r"=\s*\(?([a-z0-9]+)\[([0-9,]*)\][^ ]*\)?.*?\s(collective-permute|all-gather)(-start)?\(")


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """Per-device figures of one partitioning (bytes)."""

    partitions: int
    input_partition_dims: tuple[int, ...]
    temp_bytes: int
    argument_bytes: int
    total_bytes: int
    efficiency: float | None
    activation_all_gathers: int
    halo_bytes: int
    fits: bool | None = None


def default_partition_dims(partitions: int, rank: int) -> tuple[int, ...]:
    """`[1, N, 1, 1(, 1)]`: the usual TPU convention, N-way along the first spatial dimension."""
    dims = [1] * rank
    dims[1] = partitions
    return tuple(dims)


def parse_bytes(text: str) -> int:
    """'16GiB', '16 GB', '512MiB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?i?B?)?\s*", text)
    if not match:
        raise ValueError(f"--device-memory {text!r} is not a size; write e.g. 16GiB or 32GB.")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    scale = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(number * scale[unit])


def communication(hlo_text: str, feature_rank: int, replica_batch: int) -> tuple[int, int]:
    """(activation all-gathers, halo bytes per device) in a compiled module's HLO text.

    An all-gather counts as an activation's when its result has the feature
    tensor's rank and the per-replica batch size in front (weights are
    replicated and never gathered; gradients are all-reduced).
    """
    gathers, halo = 0, 0
    for match in _INSTRUCTION.finditer(hlo_text):
        dtype, dims, kind = match.group(1), match.group(2), match.group(3)
        shape = [int(d) for d in dims.split(",") if d]
        if kind == "collective-permute":
            halo += math.prod(shape) * _DTYPE_BYTES.get(dtype, 4)
        elif len(shape) == feature_rank and shape[0] == replica_batch:
            gathers += 1
    return gathers, halo


def compile_step(model_name: str, image_size: tuple[int, ...], dims: tuple[int, ...], devices, *,
                 precision: str = "float32", remat: bool = False, batch_size: int = 1, model_config=None):
    """Lowers and compiles the training step for `dims` on `devices` without running it.

    `model_config` is a `unet.UNetConfig` for the UNets or a
    `retinanet.RetinaNetConfig` for RetinaNet (defaults when None). RetinaNet's
    anchor targets are kept whole within each replica (labels unpartitioned).
    """
    import jax
    import keras
    from jax.sharding import NamedSharding, PartitionSpec

    if model_name not in MODELS:
        raise ValueError(f"--model {model_name!r} is not known; use one of {', '.join(MODELS)}.")
    spatial_dims = 3 if model_name == "unet3d" else 2
    if len(image_size) != spatial_dims:
        raise ValueError(f"--image-size needs {spatial_dims} sizes for {model_name}, got {list(image_size)}.")
    detection = model_name == "retinanet"
    if detection:
        config = model_config or retinanet.RetinaNetConfig()
        channels = 3
    else:
        config = model_config or unet.UNetConfig(spatial_dims=spatial_dims)
        channels = config.in_channels
    image_shape = (batch_size, *image_size, channels)
    partition = partitioning.PartitionConfig(dims)
    partitioning.validate(partition, image_shape, len(devices), config.downsampling_levels, batch_size)
    distribution = partitioning.make_distribution(partition, devices)
    dtype = "mixed_bfloat16" if precision == "bfloat16" else "float32"
    with distribution.scope():
        if detection:
            model = retinanet.build_retinanet(config, dtype=dtype)
        else:
            model = unet.build_unet(config, dtype=dtype, remat=remat)
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    state = step.TrainState(
        trainable=[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.trainable_variables],
        non_trainable=[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.non_trainable_variables],
        optimizer=[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in optimizer.variables],
    )
    if detection:
        whole = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec(partitioning.REPLICA_AXIS))
        labels = {}
        for number, level in zip(range(config.min_level, config.max_level + 1), config.levels):
            grid = (batch_size, image_size[0] // 2**number, image_size[1] // 2**number)
            anchors = config.anchors_per_position
            labels[f"boxes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors * retinanet.BOX_CODE), np.float32, sharding=whole)
            labels[f"classes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors), np.int32, sharding=whole)
        train_step = step.jit_train_step(
            step.make_train_step(model, optimizer, lambda outputs, targets: retinanet.detection_loss(outputs, targets, config)),
            distribution, state, image_ndim=len(image_shape), label_sharding={k: whole for k in labels},
        )
    else:
        label_shape = image_shape[:-1]
        labels = jax.ShapeDtypeStruct(label_shape, np.int32,
                                      sharding=distribution.get_label_layout(label_shape).backend_layout)
        train_step = step.jit_train_step(step.make_train_step(model, optimizer, losses.dice_cross_entropy),
                                         distribution, state, image_ndim=len(image_shape), label_ndim=len(label_shape))
    images = jax.ShapeDtypeStruct(image_shape, np.float32, sharding=distribution.get_data_layout(image_shape).backend_layout)
    state = jax.tree_util.tree_map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        state, step.state_shardings(state, distribution),
    )
    return train_step.lower(state, images, labels).compile(), distribution


def plan(model_name: str, image_size: tuple[int, ...], partitions: list[int], *, precision: str = "float32",
         remat: bool = False, batch_size: int = 1, device_memory: int | None = None,
         dims_for=default_partition_dims, model_config=None, log=lambda line: None) -> list[PlanRow]:
    """Compiles the step for every partition count and reports per-device memory and communication.

    `efficiency` is E(N) = M(1) / (N · M(N)) of activation (temp) memory; it
    needs N = 1 in `partitions` (None otherwise).
    """
    import jax

    devices = jax.devices()
    rows = []
    for count in partitions:
        if count > len(devices):
            raise ValueError(f"{count} partitions need {count} devices, {len(devices)} are present; on a CPU pass "
                             f"--virtual-devices {max(partitions)}.")
        dims = dims_for(count, len(image_size) + 2)
        log(f"compiling {model_name} {list(image_size)} on {count} device(s), input_partition_dims {list(dims)} ...")
        compiled, distribution = compile_step(model_name, image_size, dims, devices[:count], precision=precision,
                                              remat=remat, batch_size=batch_size, model_config=model_config)
        memory = compiled.memory_analysis()
        gathers, halo = communication(compiled.as_text(), len(image_size) + 2, batch_size // distribution.num_replicas)
        total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes \
            - memory.alias_size_in_bytes
        rows.append(PlanRow(count, dims, memory.temp_size_in_bytes, memory.argument_size_in_bytes, total, None,
                            gathers, halo, None if device_memory is None else total <= device_memory))
    reference = next((r for r in rows if r.partitions == 1), None)
    if reference is not None:
        rows = [dataclasses.replace(r, efficiency=round(reference.temp_bytes / (r.partitions * r.temp_bytes), 4))
                for r in rows]
    return rows
