"""How far each output voxel sees, measured from the network itself: the gradient support of one output voxel.

A network's receptive field decides whether it can tell apart structures that
differ only by where they sit (the left and the right kidney, the fifth and
the sixth vertebra): an output voxel cannot depend on anything outside it.
Formulas for it hold for one architecture; this measures any Keras network
(fullres's UNets, a user's `--model FILE.py:FUNCTION`) as it computes: the
gradient of the centre output voxel's logits with respect to the input is
non-zero exactly where the input can change that voxel, and its extent along
each axis is the field.

One input can hide part of it: where a ReLU is inactive for that input, the
gradient through it is zero, and a narrow network (a few filters) can have
every path to the centre voxel inactive along a whole axis (a 4-filter UNet
measured 1 voxel of one axis in 2 of 12 initializations, and `fullres plan`,
which measures a fresh random initialization each time, said "1 of 64 of
width" in about one plan in 17). So the gradient is taken for `SAMPLES`
random inputs at once, a batch, and the field is the union of their
supports; and a ReLU (`max(x, 0)`) passes the gradient through whether it is
active or not (its value is unchanged): the field is what the architecture
lets an output voxel see, not what one draw of weights happens to switch on.
A NaN in the gradient counts as reached: it flows only where the input does.

Normalization statistics (instance, group, batch normalization; likewise a
squeeze-and-excitation's pooling) make every output depend a little on every
input voxel, through one mean and variance per channel: a summary of the
whole volume, not the arrangement of its voxels. The measurement holds those
statistics fixed: in the traced computation, the gradient does not flow
through a sum, maximum or minimum over spatial axes (`SPATIAL_REDUCTIONS`).
What flows through convolutions, pooling windows, resampling and attention
(a product over positions) is counted.

Cost: one gradient per axis, of a batch of `SAMPLES` inputs as long as the
volume along that axis and as thin as the network accepts across it (the
field along depth does not depend on the width), so the default UNet at 256³
is measured on three batches of 256×16×16 inputs (2.3 s on 2 cores, 1.0 s
with one input); small volumes are measured whole, all axes at once. A
network that needs more across (a reshape into whole 4×4×4 attention windows
at a quarter of the resolution: 16 voxels) is probed at the next thicker size
that divides the volume (`thin_sizes`), up to the volume's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

SPATIAL_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin")
SAMPLES = 4  # random inputs per gradient, their supports united (an inactive ReLU hides what is behind it)
WHOLE_VOLUME_VOXELS = 32**3  # volumes up to this many voxels are measured whole, in one gradient
AXIS_NAMES = {3: ("depth", "height", "width"), 2: ("height", "width")}


@dataclasses.dataclass(frozen=True)
class ReceptiveField:
    """Voxels each output voxel sees along each spatial axis, of the input's size there.

    Example:
        >>> print(ReceptiveField(seen=(36, 256, 40), size=(256, 256, 256)))
        each output voxel sees 36 of 256 voxels of depth, all 256 of height, 40 of 256 of width
    """

    seen: tuple[int, ...]
    size: tuple[int, ...]
    video: bool = False  # the first axis is time: said in frames and pixels

    @property
    def covers(self) -> bool:
        """Whether the centre voxel sees the whole input along every axis."""
        return all(s >= n for s, n in zip(self.seen, self.size))

    def __str__(self) -> str:
        """
        >>> print(ReceptiveField(seen=(5, 32, 9), size=(16, 32, 32), video=True))
        each output pixel sees 5 of 16 frames, all 32 pixels of height, 9 of 32 of width
        """
        if self.video:
            frames, *plane = [f"all {n}" if s >= n else f"{s} of {n}" for s, n in zip(self.seen, self.size)]
            return (f"each output pixel sees {frames} frames, {plane[0]} pixels of height, {plane[1]} of width")
        names = AXIS_NAMES[len(self.size)]
        parts = [f"all {n}" if s >= n else f"{s} of {n}" for s, n in zip(self.seen, self.size)]
        parts = [f"{part} voxels of {name}" if i == 0 else f"{part} of {name}"
                 for i, (part, name) in enumerate(zip(parts, names))]
        return "each output voxel sees " + ", ".join(parts)

    def to_json(self) -> dict:
        return {"seen": list(self.seen), "size": list(self.size), **({"axes": ["frames", "height", "width"]}
                                                                      if self.video else {})}


def _interpret(jaxpr, consts, *args):
    """Evaluates `jaxpr` as JAX would, the outputs of spatial reductions cut from the gradient."""
    import jax
    from jax.extend import core as jax_core

    env = {}

    def read(var):
        return var.val if isinstance(var, jax_core.Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for equation in jaxpr.eqns:
        values = [read(var) for var in equation.invars]
        name, params = equation.primitive.name, equation.params
        inner = params.get("jaxpr") if name in ("jit", "pjit", "checkpoint", "remat") else (
            params.get("call_jaxpr") if name == "custom_jvp_call" else None)
        if inner is not None:  # a nested computation: into it, so its reductions are seen too
            closed = hasattr(inner, "consts")
            outputs = _interpret(inner.jaxpr if closed else inner, inner.consts if closed else (), *values)
        else:
            outputs = equation.primitive.bind(*values, **params)
            outputs = outputs if equation.primitive.multiple_results else [outputs]
            zero = [_is_zero(var) for var in equation.invars]
            if name == "max" and sum(zero) == 1:  # a ReLU: its value, the identity's gradient (see the module)
                (x,) = [value for value, is_zero in zip(values, zero) if not is_zero]
                outputs = [x + jax.lax.stop_gradient(outputs[0] - x)]  # exact: x + (0 - x) is 0, x + 0 is x
            if name in SPATIAL_REDUCTIONS:
                rank = len(equation.invars[0].aval.shape)
                if any(0 < axis < rank - 1 for axis in params.get("axes", ())):
                    outputs = [jax.lax.stop_gradient(output) for output in outputs]
        env.update(zip(equation.outvars, outputs))
    return [read(var) for var in jaxpr.outvars]


def _is_zero(var) -> bool:
    """Whether a jaxpr operand is the constant 0 (the other side of a ReLU's `max`)."""
    from jax.extend import core as jax_core

    return isinstance(var, jax_core.Literal) and np.ndim(var.val) == 0 and var.val == 0


def _full_resolution(outputs, spatial: Sequence[int]):
    """The logits at the input's resolution (a deep-supervised network returns several)."""
    if isinstance(outputs, (list, tuple)):
        return next(o for o in outputs if tuple(o.shape[1:-1]) == tuple(spatial))
    return outputs


def support(apply: Callable, input_shape: Sequence[int], seed: int = 0,
            samples: int = SAMPLES) -> tuple[tuple[int, int], ...]:
    """[first, last] input voxel, per spatial axis, whose gradient reaches the centre output voxel's logits, for
    any of `samples` random inputs (one batch; see the module docstring).

    Args:
        apply: `apply(images)` -> logits (B, *spatial, K) (or a list with them), a pure function of its input, each
            example computed apart from the others.
        input_shape: (*spatial, C) of one input.
    """
    import jax
    import jax.numpy as jnp

    spatial = tuple(input_shape[:-1])
    images = jnp.asarray(np.random.default_rng(seed).normal(size=(samples, *input_shape)), jnp.float32)
    traced = jax.make_jaxpr(lambda x: _full_resolution(apply(x), spatial))(images)
    centre = (slice(None), *(s // 2 for s in spatial))

    def centre_logits(x, consts):  # the weights as arguments: as constants, XLA would fold them at length
        (logits,) = _interpret(traced.jaxpr, consts, x)
        return logits[centre].astype(jnp.float32).sum()

    gradient = np.abs(np.asarray(jax.jit(jax.grad(centre_logits))(images, traced.consts))).max(axis=(0, -1))
    extents = []
    for axis in range(len(spatial)):
        profile = gradient.max(axis=tuple(a for a in range(len(spatial)) if a != axis))
        reached = np.flatnonzero(profile != 0)  # NaN too (see the module)
        extents.append((int(reached[0]), int(reached[-1])) if len(reached) else (spatial[axis] // 2,) * 2)
    return tuple(extents)


def _declared_size(model, spatial_dims: int) -> tuple[int, ...] | None:
    """The spatial size a network's one input is fixed to (`keras.Input((24, 24, 24, 1))`); None where any is taken."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1 or len(inputs[0].shape) != spatial_dims + 2:
        return None
    spatial = tuple(inputs[0].shape[1:-1])
    return None if any(s is None for s in spatial) else tuple(int(s) for s in spatial)


def measure(model, size: Sequence[int], multiples: Sequence[int], in_channels: int = 1) -> ReceptiveField:
    """The receptive field of `model` (a Keras model, any input size it accepts, or one fixed size) on inputs of
    `size`.

    Args:
        size: the spatial size of the inputs it is judged against, e.g. (256, 256, 256).
        multiples: what each spatial size must divide by for the model (its downsampling per axis).
        in_channels: the input's channels.
    """
    trainable = [np.asarray(v.value) for v in model.trainable_variables]  # host copies: a placed model's too
    non_trainable = [np.asarray(v.value) for v in model.non_trainable_variables]

    def apply(images):
        return model.stateless_call(trainable, non_trainable, images, training=False)[0]

    size = tuple(int(s) for s in size)
    declared = _declared_size(model, len(size))
    if declared is not None or math.prod(size) <= WHOLE_VOLUME_VOXELS:  # the whole input: every axis in one gradient
        # A network of a fixed input size takes nothing else: it is probed at its size (the data's, to be trained).
        extents = support(apply, (*(declared or size), in_channels))
        return ReceptiveField(tuple(min(high - low + 1, n) for (low, high), n in zip(extents, size)), size)
    seen = []
    for axis, length in enumerate(size):
        low, high = _thin_support(apply, size, multiples, in_channels, axis)
        seen.append(min(high - low + 1, length))
    return ReceptiveField(tuple(seen), size)


def thin_sizes(length: int, multiple: int) -> list[int]:
    """The sizes an axis of `length` voxels is probed with across another, thinnest first: the divisors of `length`
    that `multiple` divides, from 8 voxels on, then `length` itself. A network that takes `length` (it trains on it)
    takes one of them whatever else its reshapes need (whole attention windows): their least common size divides
    `length` too.

    >>> thin_sizes(48, 4), thin_sizes(56, 1), thin_sizes(6, 2)
    ([8, 12, 16, 24, 48], [8, 14, 28, 56], [6])
    """
    least = max(multiple, math.ceil(8 / multiple) * multiple)
    return [s for s in range(multiple, length, multiple) if s >= least and length % s == 0] + [length]


def _thin_support(apply: Callable, size: tuple[int, ...], multiples: Sequence[int], in_channels: int,
                  axis: int) -> tuple[int, int]:
    """`support` along `axis` on an input as long as the volume there and as thin across it as the network accepts:
    each thinner size it refuses (a reshape into whole windows) is passed over for the next, up to the volume's."""
    candidates = [thin_sizes(n, m) for n, m in zip(size, multiples)]
    for attempt in range(max(len(c) for c in candidates)):
        shape = [size[a] if a == axis else c[min(attempt, len(c) - 1)] for a, c in enumerate(candidates)]
        last = all(attempt >= len(c) - 1 for a, c in enumerate(candidates) if a != axis)
        try:
            return support(apply, (*shape, in_channels))[axis]
        except Exception:  # the user's network, on a size thinner than its windows (the volume's own: re-raised)
            if last:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
