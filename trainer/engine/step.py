"""The training step and its partitioned compilation.

The step is a pure JAX function over an explicit `placement.TrainState` (Keras's
stateless API), so one function serves every mesh: `jit_train_step` gives it the
input shardings of a `SpatialParallel` distribution and XLA's SPMD partitioner
splits every layer accordingly. The same jitted function can be lowered and
compiled ahead of time to read its memory use and its communication.

`jit_step` is a task's step jitted this way (with the task's input layouts and augmentation), `step_arguments`
what it is called with as shapes (to compile it ahead), and `choose_kernels` the kernels a run's step is jitted
with (`engine.kernel_choice`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import keras
import numpy as np

from trainer.engine import kernel_choice, placement
from trainer.parallel import device_mesh, split_ops, xla_compile
from trainer.parallel import kernels as kernels_lib

if TYPE_CHECKING:
    from trainer import config as config_lib


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
    with_metrics = _loss_grads_and_metrics(model, loss_fn, None)

    def loss_and_grads(state: placement.TrainState, images, labels):
        return with_metrics(state, images, labels)[:3]

    return loss_and_grads


def _loss_grads_and_metrics(model: keras.Model, loss_fn: LossFn, batch_metrics):
    """`make_loss_and_grads`'s function, returning `batch_metrics(logits, labels)` (no gradient) fourth: {} if None."""

    def forward(trainable, non_trainable, images, labels):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, images, training=True)
        metrics = {} if batch_metrics is None else batch_metrics(jax.lax.stop_gradient(logits), labels)
        if metrics:
            # The metrics are computed before the loss reads the logits, so the logits die where they did without
            # them: left to XLA's scheduler, the per-class Dice kept the full-resolution logits (C × 4 bytes a voxel)
            # live through the step's peak, +1.5 % a device at 256³ on 64 (docs/planning.md).
            logits, metrics = jax.lax.optimization_barrier((logits, metrics))
        return loss_fn(logits, labels), (non_trainable, metrics)

    def loss_grads_and_metrics(state: placement.TrainState, images, labels):
        (loss, (non_trainable, metrics)), grads = jax.value_and_grad(forward, has_aux=True)(
            state.trainable, state.non_trainable, images, labels
        )
        return loss, grads, non_trainable, metrics

    return loss_grads_and_metrics


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn: LossFn, prepare=None,
                    batch_metrics=None):
    """Returns `train_step(state, inputs, labels, step) -> (state, {"loss", "grad_norm", ...batch_metrics})`.

    Args:
        prepare: `prepare(inputs, labels, step) -> (images, labels)` on the device, before the forward pass: the
            task's cast of compact inputs (int16 images, uint8 labels) to what the model takes, and its
            augmentation, drawn from `step` (the global step number). None: the inputs are the images.
        batch_metrics: `batch_metrics(logits, labels) -> {name: array}` of the batch just trained on, no gradient
            (segmentation: each class's Dice, which the plateau warning reads); None: none.
    """
    loss_and_grads = _loss_grads_and_metrics(model, loss_fn, batch_metrics)

    def train_step(state: placement.TrainState, inputs, labels, step):
        images, labels = prepare(inputs, labels, step) if prepare is not None else (inputs, labels)
        loss, grads, non_trainable, metrics = loss_and_grads(state, images, labels)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        trainable, optimizer_variables = optimizer.stateless_apply(state.optimizer, grads, state.trainable)
        return (placement.TrainState(trainable, non_trainable, optimizer_variables),
                {"loss": loss, "grad_norm": grad_norm, **metrics})

    return train_step


def jit_train_step(train_step, distribution: device_mesh.SpatialParallel, state: placement.TrainState, image_ndim: int,
                   label_ndim: int | None = None, label_sharding=None, input_sharding=None,
                   kernels: kernels_lib.KernelsConfig | None = None, layers: dict | None = None):
    """Jits `train_step(state, inputs, labels, step)` with the distribution's shardings; the state is donated.

    Inputs are one image batch of rank `image_ndim` laid out by the distribution,
    or any pytree given its own `input_sharding` (segmentation: the int16 image
    and each row's scale). Labels are one array of rank `label_ndim` laid out by
    the distribution, or any pytree given its own `label_sharding` (segmentation
    masks split like the features; detection targets: one map per pyramid level).
    The step number is a replicated scalar. Under a split layout the step is traced with `split_ops.splitting`:
    transposed convolutions and interpolating upsampling are computed on each device's block, not gathered.
    `kernels` (the run's `kernels` setting; None: XLA's own ops) swaps the ops fullres computes itself while the
    step is traced, and gives the compiler its named XLA options (`kernels.compiler_options`); `layers` is a
    measured per-layer choice (`engine.kernel_choice`: {signature key: value}) over those fields.
    """
    if input_sharding is None:
        input_sharding = distribution.get_data_layout((0,) * image_ndim).backend_layout
    if label_sharding is None:
        label_sharding = distribution.get_label_layout((0,) * label_ndim).backend_layout
    state_sharding = placement.state_shardings(state, distribution)
    scalar = distribution.replicated_layout(0).backend_layout
    return jax.jit(
        kernels_lib.traced(split_ops.traced_split(train_step, distribution.config.input_partition_dims,
                                                  distribution.device_mesh),
                           kernels, distribution.device_mesh.devices.flat[0].platform, layers),
        in_shardings=(state_sharding, input_sharding, label_sharding, scalar),
        out_shardings=(state_sharding, scalar),  # every metric replicated
        donate_argnums=(0,),
        compiler_options=kernels_lib.compiler_options(kernels),
    )


def jit_step(task, model, optimizer, distribution: device_mesh.SpatialParallel, state, image_ndim: int,
             kernels=None, layers: dict | None = None):
    """The jitted, partitioned training step that `train` runs and `fullres plan` compiles ahead of time:
    `(state, inputs, labels, step) -> (state, metrics)`, the task's `prepare` (cast, augmentation) inside it;
    `kernels`: the run's `config.kernels` (`trainer.parallel.kernels`; None: XLA's own ops); `layers`: the run's
    measured per-layer choice over them (`engine.kernel_choice`; None: the fields everywhere)."""
    prepare = functools.partial(task.prepare, distribution=distribution)  # it augments the batch as split here
    train_step = make_train_step(model, optimizer, task.loss, prepare, task.batch_metrics)
    return jit_train_step(train_step, distribution, state,
                          image_ndim=image_ndim, label_sharding=task.label_sharding(distribution, image_ndim),
                          input_sharding=task.input_sharding(distribution, image_ndim), kernels=kernels,
                          layers=layers)


def step_arguments(task, state, distribution: device_mesh.SpatialParallel, image_shape: tuple[int, ...]) -> tuple:
    """What the train step is called with, `(state, inputs, labels, step)`, as shapes laid out on the mesh
    (`jax.ShapeDtypeStruct`s; the inputs in the task's compact dtypes): to lower it ahead of time
    (`compiled_step.StepBuilder.lower_layout`, and training's kernel choice and gather check) without any input."""
    state = jax.tree_util.tree_map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                                   state, placement.state_shardings(state, distribution))
    number = jax.ShapeDtypeStruct((), np.int32, sharding=distribution.replicated_layout(0).backend_layout)
    return (state, task.input_spec(image_shape, distribution), task.label_spec(image_shape, distribution), number)


def choose_kernels(config: config_lib.TrainConfig, task, model, optimizer, distribution, state, image_shape,
                   log: Callable[[str], None], recorded: dict | None = None
                   ) -> tuple[kernel_choice.Choice, object, tuple]:
    """The run's kernels (`engine.kernel_choice`), its train step jitted with them (`jit_step`) and what the
    step is called with, as shapes (`step_arguments`): `config.kernels` as set, or measured on the run's
    device; `recorded`: the choice the run being resumed recorded (run_record.json's), which it keeps."""
    arguments = step_arguments(task, state, distribution, image_shape)

    def step_of(kernels, layers):
        return jit_step(task, model, optimizer, distribution, state, len(image_shape), kernels, layers)

    def discover():
        with kernels_lib.recording() as found:
            step_of(config.kernels, None).trace(*arguments)
        return found

    def time_step(kernels, layers):
        compiled, _ = xla_compile.compile(step_of(kernels, layers).lower(*arguments))
        placed = placement.place_state(state, distribution)  # a copy for each timing: the step donates it
        return kernel_choice.step_seconds(compiled, arguments, placed)

    chosen = kernel_choice.choose(config.kernels, distribution.device_mesh.devices.flat[0], distribution.num_replicas,
                                  discover, time_step, recorded, log, jax.process_count())
    return chosen, step_of(chosen.kernels, chosen.layers), arguments
