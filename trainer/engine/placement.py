"""What a partitioned program reads and writes, and how it gets onto the mesh and back.

A `TrainState` holds the model's and optimizer's variables as JAX arrays
(Keras's stateless API). Weights are replicated on every device of a
`SpatialParallel` mesh; a batch goes batch over replicas, space over the cores
of each replica, also when the mesh spans processes; results come back whole.
Training (`engine.step`), evaluation and prediction (`engine.inference`) place
through here.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import keras
import numpy as np

from trainer.data import batches
from trainer.parallel import device_mesh, distributed


class TrainState(NamedTuple):
    """Everything a training step reads and writes, as JAX arrays."""

    trainable: list
    non_trainable: list
    optimizer: list


def weights_state(model: keras.Model) -> TrainState:
    """The model's weights and statistics, no optimizer slots (a run starts from `program.initial_state`): what
    predict and evaluation hold and place (`trained_run.load`), and what `fullres plan` sizes predict's pass with
    (`plan.predict_plan`)."""
    return TrainState([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables], [])


def write_weights_to_model(state: TrainState, model: keras.Model) -> None:
    """Assigns a `TrainState`'s weights back into the model's Keras variables (for saving and export: the model is
    not compiled, so `model.keras` holds no optimizer, and the optimizer's state stays in the checkpoints)."""
    for variable, value in zip(model.trainable_variables, state.trainable):
        variable.assign(np.asarray(value))
    for variable, value in zip(model.non_trainable_variables, state.non_trainable):
        variable.assign(np.asarray(value))


def sharding(distribution: device_mesh.SpatialParallel, axes) -> jax.sharding.Sharding:
    """The sharding of an array whose dimensions lie along `axes` of the distribution's mesh (None: whole)."""
    return keras.distribution.TensorLayout(tuple(axes), distribution.device_mesh).backend_layout


def state_shardings(state: TrainState, distribution: device_mesh.SpatialParallel):
    """Replicated shardings for every array of the state (weights are never split)."""
    return jax.tree_util.tree_map(lambda x: distribution.replicated_layout(np.ndim(x)).backend_layout, state)


def place_state(state: TrainState, distribution: device_mesh.SpatialParallel) -> TrainState:
    """Copies the state onto the distribution's mesh, replicated.

    Always a copy (`may_alias=False`): the train step donates its state, and a
    state that aliased its source would delete the caller's arrays. Across
    processes JAX checks that every process puts the same values (a collective
    per array), so the processes meet first (`distributed.wait_for_the_others`).
    """
    distributed.wait_for_the_others("place state")
    return jax.device_put(state, state_shardings(state, distribution), may_alias=False)


def process_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> list[int]:
    """The rows of a global batch of `shape` that this process's devices hold under `sharding`, in order.

    One process: every row. Replicas on processes: each process its replicas'
    rows. A partitioned dimension crossing processes: every process that holds
    a part of an example needs that example's row.
    """
    return list(process_share(sharding, shape).rows)


def process_share(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> batches.Share:
    """What of a global batch of `shape` this process's devices hold under `sharding`: rows, and the depth range.

    The depth range (axis 1) spans every block of this process's devices; with depth split across processes it
    is this process's part (1,16,1,1,1 on 4 processes: a quarter), else the whole axis (None).
    """
    return share_of_blocks(sharding.addressable_devices_indices_map(tuple(shape)).values(), shape)


def share_of_blocks(blocks, shape: tuple[int, ...]) -> batches.Share:
    """The `batches.Share` that covers `blocks` (one slice per dimension each) of a global batch of `shape`.

    >>> share_of_blocks([(slice(0, 2), slice(64, 80)), (slice(0, 2), slice(80, 96))], (2, 256))
    Share(rows=(0, 1), depth=(64, 96))
    """
    rows, starts, stops = set(), [], []
    for index in blocks:
        rows.update(range(*index[0].indices(shape[0])))
        if len(index) > 1:
            start, stop, _ = index[1].indices(shape[1])
            starts.append(start)
            stops.append(stop)
    depth = (min(starts), max(stops)) if starts and (min(starts), max(stops)) != (0, shape[1]) else None
    return batches.Share(tuple(sorted(rows)), depth)


def global_array(sharding: jax.sharding.Sharding, local: np.ndarray, batch_size: int,
                 rows: list[int] | None = None, depth: tuple[int, int] | None = None,
                 full_depth: int | None = None) -> jax.Array:
    """A global batch array laid out by `sharding`, from the part of it this process holds.

    Args:
        sharding: the global batch's sharding (over every process's devices).
        local: (len(rows), ...) the rows `rows` of the global batch, in that order;
            with `rows=None`, the whole global batch (batch_size, ...).
        batch_size: the global batch size.
        rows: which global rows `local` holds (`process_rows`); None: all.
        depth: [start, stop) of axis 1 that `local` holds (`process_share`); None: all of it.
        full_depth: axis 1's global size, when `local` holds only `depth` of it.
    """
    positions = {row: i for i, row in enumerate(range(batch_size) if rows is None else rows)}
    shape = (batch_size, *local.shape[1:])
    if depth is not None:
        shape = (batch_size, full_depth, *local.shape[2:])

    def device_block(index):  # index: one slice per dimension of the global array
        if depth is not None:  # this process holds depths [start, stop): shift the block's depth slice into them
            start, stop, _ = index[1].indices(full_depth)
            index = (index[0], slice(start - depth[0], stop - depth[0]), *index[2:])
        wanted = [positions[row] for row in range(*index[0].indices(batch_size))]
        if wanted == list(range(wanted[0], wanted[-1] + 1)):  # contiguous (always, in practice): a view, no copy
            return local[(slice(wanted[0], wanted[-1] + 1), *index[1:])]
        return local[wanted][(slice(None), *index[1:])]

    return jax.make_array_from_callback(shape, sharding, device_block)


def place_batch(distribution: device_mesh.SpatialParallel, images: np.ndarray, labels: np.ndarray | None = None,
                *, batch_size: int | None = None, rows: list[int] | None = None):
    """Places a batch on the mesh: batch over replicas, space over cores.

    In one process `images` is the whole global batch. In a multi-process run
    each process passes the rows `rows` of the global batch of `batch_size`
    that its own devices need (`process_rows`), or, with `rows=None`, the whole
    global batch; either way every device gets exactly its block.
    """
    batch_size = batch_size or images.shape[0]
    image_sharding = distribution.get_data_layout(images.shape).backend_layout
    placed_images = global_array(image_sharding, images, batch_size, rows)
    if labels is None:
        return placed_images
    label_sharding = distribution.get_label_layout(labels.shape).backend_layout
    return placed_images, global_array(label_sharding, labels, batch_size, rows)


def to_host(array: jax.Array) -> np.ndarray:
    """The whole of a global array as one host array, also when it spans processes (every process gets it all)."""
    if array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
