"""The least halo a partitioned training step must exchange, from the model's convolutions.

Every windowed op (convolution, pooling window) of the forward pass needs, on
each device, the neighbours' rows within its reach; its backward pass needs the
same of the output gradient. `lower_bound` adds these up for a layout, so that
`fullres plan` can print measured halo ÷ bound: a layer that exchanges more than
it must shows up as a ratio well above 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np



@dataclasses.dataclass(frozen=True)
class Window:
    """One windowed operation of the forward pass (a convolution or a pooling window), global shapes.

    `low`/`high` are the input's padding per spatial dimension; `needs_gradient`
    is False where the input is the image itself (no input gradient is formed).
    """

    batch: int
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    in_channels: int
    out_channels: int
    window: tuple[int, ...]  # effective extent (dilation applied)
    strides: tuple[int, ...]
    low: tuple[int, ...]
    itemsize: int
    needs_gradient: bool
    high: tuple[int, ...] = ()  # the input's padding after it, per spatial dimension
    layer: str = ""  # the Keras layer path it was traced in ("" outside every layer)


def windows(model, state, image_shape: tuple[int, ...]) -> list[Window]:
    """The convolutions (and pooling windows) of `model`'s training forward pass on images of `image_shape`.

    Read from the traced forward pass (its jaxpr), so nested models, custom
    layers and rematerialized blocks are all seen, with their real padding.
    """
    import jax

    def forward(trainable, non_trainable, images):
        return model.stateless_call(trainable, non_trainable, images, training=True)[0]

    images = jax.ShapeDtypeStruct(image_shape, np.float32)
    closed = jax.make_jaxpr(forward)(state.trainable, state.non_trainable, images)
    flags = [True] * len(jax.tree_util.tree_leaves(state.trainable))
    flags += [False] * (len(closed.jaxpr.invars) - len(flags))  # non-trainable variables and the images
    found: list[Window] = []
    _walk(closed.jaxpr, flags, found)
    return found


def _walk(jaxpr, depends: list[bool], found: list[Window], scope: str = "") -> None:
    """Collects windowed ops; `depends[i]`: the i-th input depends on trainable weights (so needs a gradient);
    `scope`: the name stack of the equation whose inner jaxpr this is."""
    from jax.extend import core

    flags = {var: flag for var, flag in zip(jaxpr.invars, depends)}

    def flag_of(var):
        return flags.get(var, False) if isinstance(var, core.Var) else False

    for equation in jaxpr.eqns:
        inputs = [flag_of(v) for v in equation.invars]
        name = equation.primitive.name
        layer = "/".join(part for part in (scope, str(equation.source_info.name_stack)) if part)
        if name == "conv_general_dilated":
            found.append(dataclasses.replace(_conv_window(equation, inputs[0]), layer=layer))
        elif name in ("reduce_window_max", "reduce_window_sum", "reduce_window_min", "reduce_window"):
            window = _pool_window(equation, inputs[0])
            if window is not None:
                found.append(dataclasses.replace(window, layer=layer))
        for value in equation.params.values():
            inner = getattr(value, "jaxpr", value)  # ClosedJaxpr -> Jaxpr
            if isinstance(inner, core.Jaxpr):
                mapped = inputs if len(inner.invars) == len(inputs) else [any(inputs)] * len(inner.invars)
                _walk(inner, mapped, found, layer)
        for var in equation.outvars:
            flags[var] = any(inputs)


def _conv_window(equation, needs_gradient: bool) -> Window:
    lhs, rhs = equation.invars[0].aval, equation.invars[1].aval
    out = equation.outvars[0].aval
    params = equation.params
    numbers = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec
    kernel = [rhs.shape[axis] for axis in rhs_spec[2:]]
    dilation = params["rhs_dilation"] or (1,) * len(kernel)
    return Window(
        batch=lhs.shape[lhs_spec[0]],
        in_spatial=tuple(lhs.shape[axis] for axis in lhs_spec[2:]),
        out_spatial=tuple(out.shape[axis] for axis in out_spec[2:]),
        in_channels=lhs.shape[lhs_spec[1]], out_channels=out.shape[out_spec[1]],
        window=tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation)),
        strides=tuple(params["window_strides"]), low=tuple(p[0] for p in params["padding"]),
        itemsize=np.dtype(lhs.dtype).itemsize, needs_gradient=needs_gradient,
        high=tuple(p[1] for p in params["padding"]),
    )


def _pool_window(equation, needs_gradient: bool) -> Window | None:
    operand, out = equation.invars[0].aval, equation.outvars[0].aval
    params = equation.params
    dims, strides = params["window_dimensions"], params["window_strides"]
    if len(dims) < 3 or dims[0] != 1 or dims[-1] != 1:
        return None  # not a spatial window over a channels-last tensor
    return Window(
        batch=operand.shape[0], in_spatial=tuple(operand.shape[1:-1]), out_spatial=tuple(out.shape[1:-1]),
        in_channels=operand.shape[-1], out_channels=out.shape[-1], window=tuple(dims[1:-1]),
        strides=tuple(strides[1:-1]), low=tuple(p[0] for p in params["padding"][1:-1]),
        itemsize=np.dtype(operand.dtype).itemsize, needs_gradient=needs_gradient,
        high=tuple(p[1] for p in params["padding"][1:-1]),
    )


def _extension(low: int, high: int, parts: int) -> int:
    """Rows a shard must receive along one axis: none unsplit; one side's worth for 2 parts; both sides for more."""
    if parts == 1:
        return 0
    return max(low, high) if parts == 2 else low + high


def _halo_volume(shard: Sequence[int], sides: Sequence[tuple[int, int]], parts: Sequence[int]) -> int:
    """Elements a shard needs from its neighbours: its extended box minus itself (faces, edges and corners)."""
    extended = math.prod(s + _extension(low, high, p) for s, (low, high), p in zip(shard, sides, parts))
    return extended - math.prod(shard)


def lower_bound(windows: Sequence[Window], dims: Sequence[int], replicas: int = 1) -> int:
    """Bytes per device that any correct partitioned training step must exchange with neighbours, for `dims`.

    Per windowed op (convolution, pooling window): the forward pass needs, at
    the op's input, the shard's face area times the window's reach on each
    split side (plus edges and corners where two or more axes are split) for
    every input channel; the backward pass needs the same of the output
    gradient, per output channel, to form the input gradient (not for the
    image, which has none). Shards are those of the worst-placed device: an
    interior one receives both sides, with 2 parts each receives one.
    Gradients of the weights need no further halo (the forward halo can be kept).

    Args:
        windows: `windows(...)` of the model (global shapes, batch of one replica group).
        dims: input_partition_dims, batch first and channels last.
        replicas: data-parallel replicas sharing the batch.
    """
    parts = tuple(dims[1:-1])
    total = 0
    for op in windows:
        if len(op.in_spatial) != len(parts):
            continue
        batch = op.batch // replicas
        shard_in = [s // p for s, p in zip(op.in_spatial, parts)]
        forward = [(low, max(0, window - stride - low)) for window, stride, low in zip(op.window, op.strides, op.low)]
        total += _halo_volume(shard_in, forward, parts) * batch * op.in_channels * op.itemsize
        if op.needs_gradient:
            shard_out = [s // p for s, p in zip(op.out_spatial, parts)]
            backward = [((window - 1 - low) // stride, (low - 1) // stride + 1 if low > 0 else 0)
                        for window, stride, low in zip(op.window, op.strides, op.low)]
            total += _halo_volume(shard_out, backward, parts) * batch * op.out_channels * op.itemsize
    return total
