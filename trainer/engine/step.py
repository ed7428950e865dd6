"""The training and prediction steps, and their partitioned compilation.

The steps are pure JAX functions over an explicit `TrainState` (Keras's
stateless API), so one function serves every mesh: `jit_train_step` gives it the
input shardings of a `SpatialParallel` distribution and XLA's SPMD partitioner
splits every layer accordingly. The same jitted function can be lowered and
compiled ahead of time to read its memory use and its communication.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import keras
import numpy as np

from trainer.parallel import distributed, partitioning


class TrainState(NamedTuple):
    """Everything a training step reads and writes, as JAX arrays."""

    trainable: list
    non_trainable: list
    optimizer: list


def initial_state(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> TrainState:
    """Reads the model's and optimizer's current variables (building the optimizer if needed)."""
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return TrainState(
        trainable=[v.value for v in model.trainable_variables],
        non_trainable=[v.value for v in model.non_trainable_variables],
        optimizer=[v.value for v in optimizer.variables],
    )


def write_state_to_model(state: TrainState, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    """Assigns a `TrainState` back into the Keras variables (for saving and export)."""
    for variable, value in zip(model.trainable_variables, state.trainable):
        variable.assign(np.asarray(value))
    for variable, value in zip(model.non_trainable_variables, state.non_trainable):
        variable.assign(np.asarray(value))
    for variable, value in zip(optimizer.variables, state.optimizer):
        variable.assign(np.asarray(value))


LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def make_loss_and_grads(model: keras.Model, loss_fn: LossFn):
    """Returns `f(state, images, labels) -> (loss, grads, new_non_trainable)`.

    Args:
        model: the Keras model (its variables are not touched); rematerialization,
            if wanted, is part of the model (`unet.build_unet(..., remat=True)`):
            checkpointing the whole forward pass at once would recompute, and
            hold, every activation together in the backward pass and save nothing.
        loss_fn: `loss_fn(logits, labels) -> scalar`.
    """

    def forward(trainable, non_trainable, images, labels):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, images, training=True)
        return loss_fn(logits, labels), non_trainable

    def loss_and_grads(state: TrainState, images, labels):
        (loss, non_trainable), grads = jax.value_and_grad(forward, has_aux=True)(
            state.trainable, state.non_trainable, images, labels
        )
        return loss, grads, non_trainable

    return loss_and_grads


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn: LossFn):
    """Returns `train_step(state, images, labels) -> (state, {"loss", "grad_norm"})`."""
    loss_and_grads = make_loss_and_grads(model, loss_fn)

    def train_step(state: TrainState, images, labels):
        loss, grads, non_trainable = loss_and_grads(state, images, labels)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        trainable, optimizer_variables = optimizer.stateless_apply(state.optimizer, grads, state.trainable)
        return TrainState(trainable, non_trainable, optimizer_variables), {"loss": loss, "grad_norm": grad_norm}

    return train_step


def make_predict_step(model: keras.Model):
    """Returns `predict_step(state, images) -> class ids (B, [D,] H, W)`."""

    def predict_step(state: TrainState, images):
        logits, _ = model.stateless_call(state.trainable, state.non_trainable, images, training=False)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return predict_step


def state_shardings(state: TrainState, distribution: partitioning.SpatialParallel):
    """Replicated shardings for every array of the state (weights are never split)."""
    return jax.tree_util.tree_map(lambda x: distribution.replicated_layout(np.ndim(x)).backend_layout, state)


def place_state(state: TrainState, distribution: partitioning.SpatialParallel) -> TrainState:
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
    rows = set()
    for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
        rows.update(range(*index[0].indices(shape[0])))
    return sorted(rows)


def global_array(sharding: jax.sharding.Sharding, local: np.ndarray, batch_size: int,
                 rows: list[int] | None = None) -> jax.Array:
    """A global batch array laid out by `sharding`, from the rows of it this process holds.

    Args:
        sharding: the global batch's sharding (over every process's devices).
        local: (len(rows), ...) the rows `rows` of the global batch, in that order;
            with `rows=None`, the whole global batch (batch_size, ...).
        batch_size: the global batch size.
        rows: which global rows `local` holds (`process_rows`); None: all.
    """
    positions = {row: i for i, row in enumerate(range(batch_size) if rows is None else rows)}

    def device_block(index):  # index: one slice per dimension of the global array
        wanted = [positions[row] for row in range(*index[0].indices(batch_size))]
        if wanted == list(range(wanted[0], wanted[-1] + 1)):  # contiguous (always, in practice): a view, no copy
            return local[(slice(wanted[0], wanted[-1] + 1), *index[1:])]
        return local[wanted][(slice(None), *index[1:])]

    return jax.make_array_from_callback((batch_size, *local.shape[1:]), sharding, device_block)


def place_batch(distribution: partitioning.SpatialParallel, images: np.ndarray, labels: np.ndarray | None = None,
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


def jit_train_step(train_step, distribution: partitioning.SpatialParallel, state: TrainState, image_ndim: int,
                   label_ndim: int | None = None, label_sharding=None):
    """Jits `train_step` with the distribution's shardings; the state is donated.

    Labels are one array of rank `label_ndim` laid out by the distribution
    (segmentation masks), or any pytree given its own `label_sharding`
    (detection targets: one map per pyramid level).
    """
    image_sharding = distribution.get_data_layout((0,) * image_ndim).backend_layout
    if label_sharding is None:
        label_sharding = distribution.get_label_layout((0,) * label_ndim).backend_layout
    state_sharding = state_shardings(state, distribution)
    scalar = distribution.replicated_layout(0).backend_layout
    return jax.jit(
        train_step,
        in_shardings=(state_sharding, image_sharding, label_sharding),
        out_shardings=(state_sharding, {"loss": scalar, "grad_norm": scalar}),
        donate_argnums=(0,),
    )


def jit_predict_step(predict_step, distribution: partitioning.SpatialParallel, state: TrainState, image_ndim: int):
    """Jits `predict_step`: images split like in training, predictions split like the features."""
    image_layout = distribution.get_data_layout((0,) * image_ndim)
    # Class ids (B, [D,] H, W): the image layout without its channel axis.
    prediction_layout = keras.distribution.TensorLayout(image_layout.axes[:-1], distribution.device_mesh)
    return jax.jit(
        predict_step,
        in_shardings=(state_shardings(state, distribution), image_layout.backend_layout),
        out_shardings=prediction_layout.backend_layout,
    )
