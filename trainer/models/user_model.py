"""A user's own network: `FUNCTION(num_classes=..., in_channels=...)` in a Python file, trained as fullres trains its own.

`fullres train --model nets/my_net.py:build` (or `fullres.train(build, ...)`)
imports the file by its path under a name of its own (nothing of the user's
shadows or is shadowed by another module), calls the function, and checks once
what it returned: an (uncompiled) `keras.Model` that takes channels-last
`(B, D, H, W, C)` or `(B, H, W, C)` inputs and returns logits with
`num_classes` channels at the input's resolution. Anything else is refused in
one sentence naming the file, the function and the fix.

The file must be self-contained (imports of installed packages only): the run
keeps a copy of it (`engine.run_files`), and `fullres predict` rebuilds the
network from that copy, in another process, a container or a pipeline step.

How far the network downsamples is measured, not assumed: the forward pass is
traced once (`halo.windows`), and the coarsest convolution or pooling window
along each axis gives the levels (`downsampling_levels`), which the
partitioning's divisibility check and predict's padding use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import re
import sys

from trainer.models import network_contract

SOURCE_FORM = "FILE.py:FUNCTION"
# Tasks that train a user's network: segmentation's logits map one to one onto its labels, with the losses and Dice
# fullres has; detection would need anchors, per-level box and class heads and their targets (docs/detection.md).
TASKS = ("segmentation",)
PROBE_SIZE = 256  # voxels per spatial axis of the input the network is traced with (shapes only; nothing runs)


# The pipeline's train step gets the network as text (`--param model_code`) and writes it to a file of its own in a
# temporary folder of this prefix (`components.runtime.model_source`); a sentence names the parameter instead.
TEMPORARY_PREFIX = "fullres-network-"
_TEMPORARY_COPY = re.compile(r"(?:--model )?\S*/" + TEMPORARY_PREFIX + r"[^/\s]*/network\.py")


class UserModelError(ValueError):
    """The user's network cannot be loaded or does not keep the contract; the message names the file and the fix
    (the pipeline's temporary copy of it as `--param model_code`, what the user gave)."""

    def __init__(self, message: str):
        super().__init__(_TEMPORARY_COPY.sub("--param model_code", message))


@dataclasses.dataclass(frozen=True)
class UserModelConfig:
    """A network from the user's own file.

    Args:
        file: the Python file (a run's copy reads back as `RUN/model_source.py`).
        function: the function in it; `function(num_classes=..., in_channels=...)` returns a `keras.Model`.
        spatial_dims: 3 for volumes (NDHWC), 2 for images (NHWC).
        num_classes: output classes including background (class 0).
        in_channels: input channels (1 for CT).

    Example:
        >>> config = UserModelConfig(file="nets/my_net.py", function="build", num_classes=4)
        >>> config.source
        'nets/my_net.py:build'
    """

    file: str
    function: str
    spatial_dims: int = 3
    num_classes: int = 3
    in_channels: int = 1

    def __post_init__(self):
        if not self.file.endswith(".py"):
            raise UserModelError(f"--model {self.source}: {self.file} is not a Python file; pass {SOURCE_FORM}, "
                                 "e.g. --model nets/my_net.py:build.")
        if not self.function.isidentifier():
            raise UserModelError(f"--model {self.source}: {self.function!r} is not a function name; pass "
                                 f"{SOURCE_FORM}, e.g. --model nets/my_net.py:build.")
        if self.spatial_dims not in (2, 3):
            raise UserModelError(f"UserModelConfig.spatial_dims must be 2 or 3, got {self.spatial_dims}.")
        if self.num_classes < 2:
            raise UserModelError(f"UserModelConfig.num_classes must be >= 2 (background + one class), got "
                                 f"{self.num_classes}.")
        if self.in_channels < 1:
            raise UserModelError(f"UserModelConfig.in_channels must be >= 1, got {self.in_channels}.")

    @property
    def source(self) -> str:
        """`FILE.py:FUNCTION`, as `--model` takes it."""
        return f"{self.file}:{self.function}"

    @property
    def downsampling_levels(self) -> tuple[int, ...]:
        """How many times the network halves each spatial axis, measured from its traced forward pass (`measure`)."""
        return measure(self)


def parse_source(text: str) -> tuple[str, str]:
    """`"nets/my_net.py:build"` -> `("nets/my_net.py", "build")`.

    Raises:
        UserModelError: not of the form FILE.py:FUNCTION.
    """
    file, colon, function = text.strip().rpartition(":")
    if not colon or not file.endswith(".py") or not function.isidentifier():
        raise UserModelError(f"--model {text!r} is not {SOURCE_FORM}; pass a Python file and the function in it that "
                             "returns the network, e.g. --model nets/my_net.py:build.")
    return file, function


def check_task(task: str, source: str) -> None:
    """Refuses a user's network for a task other than segmentation, in one sentence.

    Raises:
        UserModelError: `task` is not in `TASKS`.
    """
    if task not in TASKS:
        raise UserModelError(f"--model {source}: fullres trains a network of your own for segmentation only; {task} "
                             "needs anchors, per-level box and class heads and their targets (docs/detection.md), so "
                             "train it with --task segmentation, or train fullres's RetinaNet.")


def settings(source: str, preset_model: dict) -> dict:
    """The model settings of `source` (FILE.py:FUNCTION) in place of a preset's model, keeping its sizes."""
    file, function = parse_source(source)
    return {"file": file, "function": function,
            **{name: preset_model[name] for name in ("spatial_dims", "num_classes", "in_channels")}}


def is_source(text: str | None) -> bool:
    """Whether `text` names a user's network (FILE.py:FUNCTION) rather than a built-in one or a run."""
    return bool(text) and ".py:" in text


_MODULES: dict[tuple[str, str], object] = {}  # (absolute path, sha256 of its text) -> the module, imported once
_GIVEN: dict[tuple[str, str], object] = {}  # (absolute path, name) -> a function handed over in this process


def register(function) -> str:
    """FILE.py:FUNCTION of a function handed over in this process (`fullres.plan(network, ...)`): later loads here
    use the function itself instead of importing its file again, which may be the very script that is running (and
    would run again); other processes (predict, a pipeline step) import the file (or the run's copy of it).

    Raises:
        UserModelError: not a function defined at the top level of a Python file.
    """
    file = inspect.getsourcefile(function) if inspect.isfunction(function) else None
    name = getattr(function, "__name__", repr(function))
    if file is None or not file.endswith(".py") or not os.path.isfile(file) or function.__qualname__ != name:
        raise UserModelError(f"{name} is not a function at the top level of a Python file; fullres rebuilds the "
                             "network from its file (and keeps a copy of it in the run), so define it in a .py file, "
                             f"or pass {SOURCE_FORM}.")
    _GIVEN[(os.path.abspath(file), name)] = function
    return f"{os.path.abspath(file)}:{name}"


def _digest(path: str, given: str | None = None, function: str = "build") -> str:
    """The SHA-256 of the user's file `path` (`given` as the user wrote it, for the sentence).

    Raises:
        UserModelError: it does not exist, or is a folder (`dir.py/`).
    """
    given = given or path
    if not os.path.isfile(path):
        what = "is a folder, not a Python file" if os.path.isdir(path) else "does not exist"
        raise UserModelError(f"--model {given}:{function}: {given} {what}; pass the path of the Python file that "
                             f"defines {function} ({SOURCE_FORM}).")
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


class _LeaveNoBytecode(importlib.machinery.SourceFileLoader):
    """Imports the user's file without writing `__pycache__/` beside it, as Python's own loader would wherever
    bytecode may be written: in the user's folder, or in a run folder (its copy, `model_source.py`). The file is
    compiled from its source each time; it is one small module."""

    def set_data(self, path, data, *, _mode=0o666):
        pass


def load_function(file: str, function: str):
    """The function `function` of the Python file `file`, imported under a name of its own (once per file text).

    Raises:
        UserModelError: the file is missing or does not import, or has no such function.
    """
    path = os.path.abspath(file)
    if (path, function) in _GIVEN:
        return _GIVEN[(path, function)]
    where = f"--model {file}:{function}"
    digest = _digest(path, file, function)
    module = _MODULES.get((path, digest))
    if module is None:
        name = f"fullres_user_model_{digest[:16]}"  # unique: never shadows a module of the user's or of fullres
        spec = importlib.util.spec_from_file_location(name, path, loader=_LeaveNoBytecode(name, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look a class's module up by its name
        try:
            spec.loader.exec_module(module)
        except Exception as error:  # the user's code: any error is theirs to fix, named in one sentence
            sys.modules.pop(name, None)
            line = next((f" (line {frame.lineno})" for frame in reversed(inspect.trace()) if frame.filename == path),
                        f" (line {error.lineno})" if isinstance(error, SyntaxError) else "")
            raise UserModelError(f"{where}: importing {file} failed{line} with {type(error).__name__}: {error}; fix "
                                 "the file (it may import installed packages, not files beside it: the run keeps "
                                 "a copy of this one file).") from None
        _MODULES[(path, digest)] = module
    found = getattr(module, function, None)
    if not callable(found):
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_"))
        raise UserModelError(f"{where}: {file} defines no function {function}"
                             + (f" (it defines {', '.join(defined)})" if defined else "")
                             + f"; name the function that returns the network, e.g. --model {file}:"
                             f"{defined[0] if defined else 'build'}.")
    return found


def build(config: UserModelConfig, dtype: str | None = None, remat: bool = False):
    """The user's network for `config`, built and checked (`check`).

    Args:
        dtype: a Keras dtype policy ("float32", "mixed_bfloat16"): the global policy while the function builds
            the network, so its layers take it unless they name their own.
        remat: build under `keras.RematScope(mode="full")`: every layer's activations are recomputed in the
            backward pass.

    Raises:
        UserModelError: the function fails, or returns something that breaks the contract.
    """
    import keras

    function = load_function(config.file, config.function)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype or previous)
    call = f"{config.function}(num_classes={config.num_classes}, in_channels={config.in_channels})"
    try:
        with keras.RematScope(mode="full") if remat else contextlib.nullcontext():
            model = function(num_classes=config.num_classes, in_channels=config.in_channels)
    except UserModelError:
        raise
    except Exception as error:  # the user's code
        raise UserModelError(f"--model {config.source}: {call} raised {type(error).__name__}: {error}; the function "
                             "must take num_classes and in_channels keyword arguments and return a keras.Model."
                             ) from None
    finally:
        keras.config.set_dtype_policy(previous)
    check(model, config)
    return model


def probe_shape(model, config: UserModelConfig) -> tuple[int, ...]:
    """The (1, *spatial, C) input the network is traced with: its declared size where it has one, else PROBE_SIZE."""
    declared = getattr(model, "inputs", None)
    spatial = (None,) * config.spatial_dims
    if declared and len(declared) == 1 and len(declared[0].shape) == config.spatial_dims + 2:
        spatial = tuple(declared[0].shape[1:-1])
    return (1, *(PROBE_SIZE if size is None else int(size) for size in spatial), config.in_channels)


def check(model, config: UserModelConfig) -> None:
    """Refuses a network that breaks the contract: not a `keras.Model`, several inputs or outputs, another input rank,
    or logits not of `num_classes` channels at the input's resolution (checked with shapes only).

    Raises:
        UserModelError: one sentence naming what the network does and what fullres needs.
    """
    import keras

    where = f"--model {config.source}"
    if not isinstance(model, keras.Model):
        raise UserModelError(f"{where} returned a {type(model).__name__}, not a keras.Model; return the network "
                             "(uncompiled), e.g. keras.Model(inputs, logits).")
    declared = getattr(model, "inputs", None)
    if declared and len(declared) != 1:
        raise UserModelError(f"{where}: the network takes {len(declared)} inputs; fullres feeds it one image tensor.")
    rank = config.spatial_dims + 2
    if declared and len(declared[0].shape) != rank:
        raise UserModelError(
            f"{where}: the network takes inputs of shape {tuple(declared[0].shape)}, but a {config.spatial_dims}D "
            f"model takes channels-last {('(B, D, H, W, C)' if rank == 5 else '(B, H, W, C)')}; build it for "
            f"{config.spatial_dims}D inputs, or set model.spatial_dims to match (--set model.spatial_dims=...).")
    if (wrong := network_contract.channels_problem(model, config.in_channels)) is not None:
        raise UserModelError(f"{where}: {wrong}.")
    shape = probe_shape(model, config)
    try:  # a symbolic call: shapes only, and it builds a subclassed model's variables
        output = model(keras.KerasTensor(shape))
    except Exception as error:  # the user's code, traced with shapes only
        raise UserModelError(f"{where}: the network cannot take a {shape} input ({type(error).__name__}: {error}); "
                             f"it must take channels-last inputs with in_channels={config.in_channels}.") from None
    if not isinstance(output, keras.KerasTensor):
        raise UserModelError(f"{where}: the network returns {network_contract.outputs(output)}; fullres trains one "
                             "output, the logits (B, ..., num_classes): return that tensor alone.")
    wanted = (*shape[:-1], config.num_classes)
    if tuple(output.shape) != wanted:
        raise UserModelError(
            f"{where}: the network turns a {shape} input into {tuple(output.shape)}; fullres segments with logits of "
            f"num_classes={config.num_classes} channels at the input's resolution, {wanted}.")


_LEVELS: dict[tuple, tuple[int, ...]] = {}  # (file text, function, classes, channels, dims) -> measured levels


def measure(config: UserModelConfig) -> tuple[int, ...]:
    """How many times the network halves each spatial axis: log2 of the input's size over the smallest size a
    convolution or pooling window sees along it, on the traced forward pass (once per file text and config).

    Raises:
        UserModelError: a downsampling by a factor that is not a power of two (fullres's divisibility check and
            predict's padding count halvings).
    """
    key = (_digest(os.path.abspath(config.file), config.file, config.function), config.function, config.num_classes,
           config.in_channels, config.spatial_dims)
    if key not in _LEVELS:
        from trainer.parallel import halo

        model = build(config)
        shape = probe_shape(model, config)
        state = _Weights([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
        smallest = list(shape[1:-1])
        try:
            windows = halo.windows(model, state, shape)
        except Exception as error:  # the user's code, run on the probe for the first time (check() only had shapes)
            said = " ".join(line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()
                            if line.strip() and not line.strip().startswith(("Arguments received", "•")))[:300]
            raise UserModelError(
                f"--model {config.source}: the network fails on a {shape} input, the one fullres traces it with to "
                f"count its downsamplings ({type(error).__name__}: {said}); make it take any size its strides "
                "divide, or declare its input's size in keras.Input.") from None
        for window in windows:
            if len(window.in_spatial) == config.spatial_dims:
                smallest = [min(s, i, o) for s, i, o in zip(smallest, window.in_spatial, window.out_spatial)]
        levels = []
        for size, least in zip(shape[1:-1], smallest):
            factor = math.log2(size / max(least, 1))
            if abs(factor - round(factor)) > 0.05:
                raise UserModelError(
                    f"--model {config.source}: the network shrinks a {size}-voxel axis to {least} at its coarsest, a "
                    "factor that is not a power of two; fullres's partitioning counts halvings, so downsample by "
                    "strides or pools of 2.")
            levels.append(round(factor))
        _LEVELS[key] = tuple(levels)
    return _LEVELS[key]


@dataclasses.dataclass(frozen=True)
class _Weights:
    """The variables `halo.windows` traces the forward pass with."""

    trainable: list
    non_trainable: list
