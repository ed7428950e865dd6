"""The windowed ops of a network's training forward pass (convolutions, pooling windows): what a split exchanges.

Every windowed op needs, on each device, the neighbours' rows within its reach; its backward pass needs the same
of the output gradient. `windows` reads them from the traced forward pass; the plan adds up the least halo they
need for a layout (`layout_measure.lower_bound`), a user's network's levels are measured from them
(`user_model`), and a split they would reach across is refused (`thin_shards`).
"""

from __future__ import annotations

import dataclasses

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
