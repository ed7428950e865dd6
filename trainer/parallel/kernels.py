"""Kernels fullres computes itself: exact reformulations of the ops XLA computes slowly on GPUs, chosen per run.

On one H200, nnU-Net's PlainConvUNet measured 2.8× (float32) to 7.6× (bfloat16) slower per step under fullres than
under PyTorch, where XLA's GPU compiler handles 3D weight gradients in bfloat16, transposed
convolutions and instance norm badly (jax-ml/jax#31662, openxla/xla#34273, jax-ml/jax#8537). Each candidate
here computes the same values as Keras's own op, behind the user's unchanged layers and weights, as the split ops
do (`split_ops`): the ops are swapped while the training step is traced, nothing is stored in the model.

    --set kernels.conv_weight_grad=taps     a convolution's weight gradient as one matrix product per kernel tap
                                            (GPU and CPU programs; a TPU program keeps XLA's: `for_platform`)
    --set kernels.conv_weight_grad=float32  XLA's weight gradient with its operands in float32 (mixed precision;
                                            GPU and CPU programs)
    --set kernels.conv_transpose=subpixel   transposed convolutions as a stride-1 convolution + depth-to-space
    --set kernels.conv_transpose=padded     transposed convolutions as interior padding + a stride-1 convolution
                                            (GPU and CPU programs)
    --set kernels.norm=fused                means and variances (GroupNorm, InstanceNorm, BatchNorm, LayerNorm)
                                            from one pass of shifted sums, with their own gradient
    --set kernels.xla_flags=NAME            a named set of XLA GPU compiler options (`FLAG_SETS`)
    --set kernels.choose=measure|fixed      time every candidate per layer on the run's device and keep the
                                            fastest (`trainer/engine/kernel_choice.py`; the default on a GPU), or
                                            the fields above for every layer (the default on a TPU and a CPU)

The fields' defaults are today's ops ("xla", "none"). Under `measure` a run's step is traced with a per-layer
choice (`using(config, layers)`): each op looks its own signature up (`kernel_layers.chosen`) and falls back to the field.

Example:
    >>> config = KernelsConfig(norm="fused")
    >>> with using(config):
    ...     current().norm
    'fused'
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools

from trainer.parallel import kernel_layers

CONV_WEIGHT_GRADS = ("xla", "taps", "float32")
CONV_TRANSPOSES = ("xla", "subpixel", "padded")
NORMS = ("xla", "fused")
# Compiler options per named set. Each name exists in the locked XLA (a compile with an unknown one is refused
# before anything runs: `test_kernels_config.py`). What each aims at (none of it measured on a GPU yet):
FLAG_SETS = {
    "none": {},
    # cuDNN's channels-last (NDHWC) layouts for every convolution, Keras's own: XLA's GPU layout heuristic kept all
    # 83 convolutions of nnU-Net's 3D step channels first, in bfloat16 too (deviceless h100x1, docs/layers.md).
    "conv_nhwc": {"xla_gpu_force_conv_nhwc": True},
    # cuDNN's runtime-compiled fusions of a convolution with its elementwise neighbours (bias, activation), and
    # cuDNN for fused matrix products.
    "cudnn_fusion": {"xla_gpu_use_runtime_fusion": True, "xla_gpu_cudnn_gemm_fusion_level": 2},
    # Every Triton tiling tried for the matrix products (the weight gradient's per-tap products with `taps`).
    "exhaustive_gemm": {"xla_gpu_exhaustive_tiling_search": True},
    # The per-tap products kept apart: XLA's dot merger otherwise joins the k^d products of a `taps` weight gradient
    # (they share the output's gradient) into one product over an im2col concatenation of the input, k^d times
    # its bytes (deviceless h100x1, 32³ bfloat16: one bf16[65536, 864] operand for a 3×3×3, 32-channel input).
    "taps_unmerged": {"xla_gpu_dot_merger_threshold_mb": 0},
    # cuBLAS, not Triton, for every matrix product.
    "cublas_gemm": {"xla_gpu_enable_triton_gemm": False},
    # The three that touch convolutions and products together.
    "conv_nhwc_fusion": {"xla_gpu_force_conv_nhwc": True, "xla_gpu_use_runtime_fusion": True,
                         "xla_gpu_cudnn_gemm_fusion_level": 2},
}
# The op kinds a run's choice is made for, each with the field that names its candidates (`candidates`).
KINDS = {"convolution": "conv_weight_grad", "transposed convolution": "conv_transpose", "normalization": "norm"}
CHOOSE = ("auto", "measure", "fixed")
OP_FIELDS = ("conv_weight_grad", "conv_transpose", "norm", "xla_flags")  # what the traced program computes


def allowed(field: str) -> tuple[str, ...]:
    """The values `kernels.FIELD` takes: one registry for the setting's check and for what `measure` times."""
    return {"conv_weight_grad": CONV_WEIGHT_GRADS, "conv_transpose": CONV_TRANSPOSES, "norm": NORMS,
            "xla_flags": tuple(FLAG_SETS), "choose": CHOOSE}[field]


@dataclasses.dataclass(frozen=True)
class KernelsConfig:
    """Which kernels a run's training step computes itself (`--set kernels.FIELD=VALUE`); recorded in the run.

    Args:
        conv_weight_grad: "xla" (XLA's convolution of the input with the output's gradient) or "taps": for each
            kernel tap one (C_in, C_out) matrix product of the shifted input and the output's gradient, in the
            compute dtype with float32 accumulation (`conv_taps.py`); the forward pass and the input's gradient
            stay XLA's. "float32": XLA's weight gradient with the input and the output's gradient cast up to
            float32 and the result cast back (`conv_taps.wide_weight_gradient`; a bfloat16 step's only).
            Convolutions with groups (depthwise) and channels-first stay XLA's.
        conv_transpose: "xla" (Keras's input-dilated convolution; already sub-pixel where the step is split),
            "subpixel": every transposed convolution as a stride-1 convolution and a depth-to-space
            (`subpixel.py`), split or not, or "padded": as interior padding and a stride-1 convolution
            (`padded_transpose.py`), split or not.
        norm: "xla" (`jnp.mean` then `jnp.var`: two passes, autodiff's gradient) or "fused": each mean and
            variance `keras.ops.moments` computes (GroupNormalization, BatchNormalization) from one pass of sums
            and sums of squares shifted close to the mean (by the mean of each device's first value), in at least
            float32, with a one-pass gradient of its own (`fused_norm.py`).
        xla_flags: a name in `FLAG_SETS`: the XLA GPU options the step is compiled with ("none": XLA's defaults).
        choose: "measure": time each candidate of every layer on the run's device and keep the fastest (the fields
            above are then what it is compared with, and what layers it does not reach keep); "fixed": the fields
            for every layer; "auto": "measure" on a GPU, "fixed" on a TPU or CPU (`resolved_choose`).
        cache: the JSON file that remembers measured choices per device kind and versions; "" for
            `$XDG_CACHE_HOME/fullres/kernels/choices.json` (~/.cache where unset).
        measure_seconds: how long `measure` may time candidates; the layers it does not reach keep the fields.
    """

    conv_weight_grad: str = "xla"
    conv_transpose: str = "xla"
    norm: str = "xla"
    xla_flags: str = "none"
    choose: str = "auto"
    cache: str = ""
    measure_seconds: float = 120.0

    def __post_init__(self):
        for name in (*OP_FIELDS, "choose"):
            if getattr(self, name) not in allowed(name):
                raise ValueError(f"kernels.{name} {getattr(self, name)!r} is not known; use one of "
                                 f"{', '.join(allowed(name))} (--set kernels.{name}=...).")
        if not self.measure_seconds >= 0:  # nan fails it too
            raise ValueError(f"kernels.measure_seconds must be a number >= 0, got {self.measure_seconds} "
                             "(--set kernels.measure_seconds=N).")

    def changed(self) -> dict:
        """The op fields that differ from today's ops, for a run's log ({} for the defaults)."""
        default = KernelsConfig()
        return {name: getattr(self, name) for name in OP_FIELDS if getattr(self, name) != getattr(default, name)}

    def resolved_choose(self, platform: str) -> str:
        """"measure" or "fixed" for a program on `platform` ("auto": measure on a GPU only)."""
        if self.choose != "auto":
            return self.choose
        return "measure" if platform in ("gpu", "cuda", "rocm") else "fixed"


def candidates(kind: str, platform: str) -> tuple[str, ...]:
    """Every value of `kind`'s field (`KINDS`) that a program on `platform` computes (`for_platform`): what
    `measure` times for a layer of that kind, read from the same tuples as the setting's check."""
    field = KINDS[kind]
    return tuple(value for value in allowed(field)
                 if getattr(for_platform(KernelsConfig(**{field: value}), platform), field) == value)


def from_dict(values: dict | None) -> KernelsConfig:
    """A recorded run's kernels (`train_config.json`); runs recorded before the setting existed used XLA's own."""
    return KernelsConfig(**(values or {})) if not isinstance(values, KernelsConfig) else values


def compiler_options(config: KernelsConfig | None) -> dict | None:
    """The XLA options `config.xla_flags` names, for `jax.jit(compiler_options=...)`; None for XLA's defaults.

    The options are DebugOptions fields of every XLA backend: the CPU and TPU compilers accept the GPU ones and
    ignore them, so the same step compiles for `fullres plan` on any target.
    """
    options = FLAG_SETS[(config or KernelsConfig()).xla_flags]
    return dict(options) if options else None


_CURRENT = contextvars.ContextVar("fullres_kernels", default=None)  # the KernelsConfig a step is traced with
_ORIGINAL = {}  # what `install` replaced: name -> the original function


def current() -> KernelsConfig:
    """The kernels the op being traced uses (`using`'s; today's ops outside it)."""
    return _CURRENT.get() or KernelsConfig()


@contextlib.contextmanager
def using(config: KernelsConfig | None, layers: dict | None = None):
    """Traces what runs inside with `config`'s kernels (Keras's own ops outside it), and each op whose signature
    `layers` names ({`Signature.key`: value}, a measured choice) with that value instead of the field's."""
    from trainer.parallel import split_ops

    config = config or KernelsConfig()
    install()
    token = _CURRENT.set(config)
    try:
        with split_ops.conv_transpose_form(config.conv_transpose), kernel_layers.choice(layers):
            yield
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def recording():
    """`kernel_layers.recording`, with the ops it notes routed through fullres (`install`) whatever the step's kernels."""
    from trainer.parallel import split_ops

    install()
    split_ops.install()
    with kernel_layers.recording() as found:
        yield found


def for_platform(config: KernelsConfig | None, platform: str) -> KernelsConfig:
    """`config` as a program for `platform` ("tpu", "gpu", "cuda", "cpu") computes it: a TPU program keeps XLA's
    weight gradients ("taps" and "float32" alike) and XLA's transposed convolutions for "padded". The TPU compiler
    computes them natively (bfloat16 is its own type, with float32 accumulation in the matrix unit), and it pads each
    narrow channel dimension to 128 lanes: measured on a v5e:2x2 slice (tests/trainer/plan/test_target_kernels.py,
    16³, 4-6 channels, split 2×2), 8.29 MiB per device with `taps`, 7.77 MiB with `padded` (the interior-padded
    activation), against XLA's 0.77 MiB."""
    config = config or KernelsConfig()
    if platform != "tpu":
        return config
    return dataclasses.replace(config, conv_weight_grad="xla",
                               conv_transpose="xla" if config.conv_transpose == "padded" else config.conv_transpose)


def traced(function, config: KernelsConfig | None, platform: str = "gpu", layers: dict | None = None):
    """`function`, its body traced under `using(config, layers)` for a program on `platform` (`for_platform`); same
    name, so the compiled program's op names read as before."""
    config = for_platform(config, platform)
    if not config.changed() and not layers:
        return function

    @functools.wraps(function)
    def with_kernels(*args, **kwargs):
        with using(config, layers):
            return function(*args, **kwargs)

    return with_kernels


def _conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
    """Keras's JAX `conv`, its weight gradient per tap under `conv_weight_grad="taps"`, in float32 under "float32"
    (the layer's own value in a measured choice)."""
    original = _ORIGINAL["conv"]
    from trainer.parallel import split_ops

    options = {"strides": strides, "padding": padding, "data_format": data_format, "dilation_rate": dilation_rate}
    value = kernel_layers.chosen("convolution", inputs, kernel, options,
                                 split_ops.split_of(len(inputs.shape) - 2)) or current().conv_weight_grad
    if value == "xla":
        return original(inputs, kernel, strides, padding, data_format, dilation_rate)
    from keras.src import backend

    from trainer.parallel import conv_taps

    if (backend.standardize_data_format(data_format) != "channels_last" or inputs.shape[-1] != kernel.shape[-2]
            or inputs.ndim not in (3, 4, 5)):
        return original(inputs, kernel, strides, padding, data_format, dilation_rate)  # groups, channels first
    return conv_taps.keras_conv(inputs, kernel, strides, padding, dilation_rate, value)


def _moments(x, axes, keepdims=False, synchronized=False):
    """Keras's JAX `moments`, in one pass under `norm="fused"` (the layer's own value in a measured choice)."""
    from trainer.parallel import split_ops

    original = _ORIGINAL["moments"]
    sorted_axes = tuple(sorted(a % len(x.shape) for a in ((axes,) if isinstance(axes, int) else axes)))
    value = kernel_layers.chosen("normalization", x, None, {"axes": sorted_axes, "keepdims": keepdims},
                                 split_ops.split_of(len(x.shape) - 2)) or current().norm
    if value != "fused" or synchronized:
        return original(x, axes, keepdims, synchronized)
    from trainer.parallel import fused_norm

    return fused_norm.keras_moments(x, axes, keepdims)


def install() -> None:
    """Routes Keras's JAX `conv` and `moments` through this module (once; they change only inside `using`)."""
    if _ORIGINAL:
        return
    from keras.src.backend.jax import nn

    _ORIGINAL["conv"], _ORIGINAL["moments"] = nn.conv, nn.moments
    nn.conv, nn.moments = _conv, _moments
