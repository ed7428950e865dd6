"""A run's measured kernel choice, layer by layer: each op of the kinds `kernels.KINDS` names computes its
`Signature` while the step is traced and looks it up in the choice (`chosen`); `recording` collects the signatures
of a traced step, which is how `trainer/engine/kernel_choice.py` finds what to measure.

Two layers with the same signature are the same computation on the device, so they share a choice: the choice
maps a signature's `key` to a value of its kind's field (`kernels.KINDS`), and an op it does not name keeps the
field's value.

Example:
    >>> import jax.numpy as jnp
    >>> with recording() as found:
    ...     chosen("normalization", jnp.zeros((2, 4, 4, 3)), None, {"axes": (1, 2), "keepdims": True}, (1, 1))
    >>> [signature.kind for _, signature in found], found[0][1].per_device_shape(replicas=2)
    (['normalization'], (1, 4, 4, 3))
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json

_CHOICE = contextvars.ContextVar("fullres_kernel_choice", default=None)  # {signature key: value} of a measured choice
_RECORDING = contextvars.ContextVar("fullres_kernel_recording", default=None)  # [(layer, Signature)] while `recording`


@contextlib.contextmanager
def choice(layers: dict | None):
    """Traces what runs inside with `layers` ({`Signature.key`: value}) as the measured choice (None: none)."""
    token = _CHOICE.set(dict(layers) if layers else None)
    try:
        yield
    finally:
        _CHOICE.reset(token)


@contextlib.contextmanager
def recording():
    """Collects `(layer, Signature)` for every op of `kernels.KINDS` traced inside (the layer: Keras's name scope
    path); `kernels.recording` also routes the ops through fullres, which a step with the default kernels does not."""
    found = []
    token = _RECORDING.set(found)
    try:
        yield found
    finally:
        _RECORDING.reset(token)


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a layer's op computes, as far as its speed goes: the kind, the input's shape as traced (the whole
    batch), the kernel's, the dtypes, the op's other arguments, and how many ways each spatial axis is split.

    `key` names it in a measured choice (`using(config, layers)`) and in the cache.
    """

    kind: str
    shape: tuple[int, ...]
    kernel: tuple[int, ...]  # () for a normalization
    dtype: str
    kernel_dtype: str
    options: tuple  # ((name, value), ...): strides, padding, dilation, data format; a normalization's axes
    split: tuple[int, ...]  # ways each spatial axis is split (1s unsplit)

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.shape, self.kernel, self.dtype, self.kernel_dtype, self.options,
                           self.split], separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> Signature:
        kind, shape, kernel, dtype, kernel_dtype, options, split = json.loads(key)
        return cls(kind, tuple(shape), tuple(kernel), dtype, kernel_dtype,
                   tuple((name, _frozen(value)) for name, value in options), tuple(split))

    def per_device_shape(self, replicas: int) -> tuple[int, ...]:
        """The input's block on one device of a run with `replicas` data-parallel replicas."""
        first = dict(self.options).get("data_format") == "channels_first"
        spatial = range(2, len(self.shape)) if first else range(1, len(self.shape) - 1)
        parts = dict(zip(spatial, self.split))
        return tuple(-(-size // (replicas if axis == 0 else parts.get(axis, 1))) for axis, size in enumerate(self.shape))

    @property
    def groups(self) -> int:
        """A convolution's groups (input channels ÷ the kernel's); 1 for the others."""
        if self.kind != "convolution":
            return 1
        first = dict(self.options).get("data_format") == "channels_first"
        return self.shape[1 if first else -1] // max(self.kernel[-2], 1)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def chosen(kind: str, x, kernel, options: dict, split: tuple[int, ...]) -> str | None:
    """The value the op being traced (of `kind`, on `x` with `kernel` and `options`, each spatial axis split as
    `split`) has in the run's measured choice; None where no choice names it (the field's value applies). While
    `recording`, its signature is noted."""
    layers, found = _CHOICE.get(), _RECORDING.get()
    if not layers and found is None:
        return None
    signature = Signature(kind, tuple(int(n) for n in x.shape), tuple(int(n) for n in getattr(kernel, "shape", ())),
                          str(x.dtype), str(getattr(kernel, "dtype", "")),
                          tuple((name, _frozen(json.loads(json.dumps(value)))) for name, value in options.items()),
                          tuple(split))
    if found is not None:
        from keras.src.backend.common import name_scope

        found.append((name_scope.current_path() or kind, signature))
    return (layers or {}).get(signature.key)
