"""The spatially partitioned trainer (Keras 3 on the JAX backend).

Keras reads `KERAS_BACKEND` once, when it is first imported — and importing
TensorFlow imports Keras — so the JAX backend is chosen here, before any
trainer module imports either, and a process that already loaded Keras on
another backend is stopped with the fix. TensorFlow's C++ start-up chatter is
silenced unless the user asked for it.

JAX's persistent compilation cache is switched on here too: every fullres
command is a fresh process (each pipeline step, a rerun, predict after train),
and without the cache each one compiles again what the last one compiled.
Measured on a 2-core CPU: building the demo UNet compiled its weight
initializers for 22 s in every process (one XLA program per weight shape;
3 s since `unet_layers.FlatGlorotUniform` draws them flat) and 0.05 s per
shape from the cache; the training step is the larger program every step of
a pipeline would compile again. The cache lives in
`$XDG_CACHE_HOME/fullres/jax` (`~/.cache/...`), is capped at 2 GiB by JAX's
own least-recently-used eviction (which also locks it between processes), and
gives back what the compiler gave (the same memory analysis and program text
that `fullres plan` reads). `JAX_COMPILATION_CACHE_DIR` set by the user wins;
set it empty to switch the cache off.

Exit: a fullres process holds the Python objects of TensorFlow, JAX and Keras
(millions), and Python's last garbage collections visit every one before the
modules are torn down: about 1 s of CPU in every command and pipeline step on
the 2-core machine (`import tensorflow`, then exit: 6.3 CPU-s, 5.2 with the
freeze; a 20-step smoke `fullres train`: 21.0 CPU-s, 19.9 with it; two runs
each, alternated, 2026-11-26). `gc.freeze()` as the last exit handler moves
them to the permanent generation, which those collections skip. Every other
exit handler still runs and reference counting still frees what it frees;
only objects that nothing but a reference cycle keeps are not freed, as under
`os._exit`: fullres closes its files in `with` blocks or explicitly, never in
a finalizer. `preprocessing` registers the same.
"""

import atexit
import gc
import os
import sys

# The last exit handler (registered before TensorFlow's, JAX's or Orbax's: they run first): see "Exit" above.
atexit.register(gc.freeze)

if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    raise RuntimeError(
        f"KERAS_BACKEND is set to {os.environ['KERAS_BACKEND']!r}; the fullres trainer runs on the JAX backend, "
        "so unset it or set KERAS_BACKEND=jax."
    )
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow only reads, parses and exports here, never computes a model: its
# oneDNN kernels buy nothing and announce themselves on every start.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# On a GPU, JAX's allocator takes 75 % of the memory unless told otherwise, and a step that needs more stops with
# out-of-memory where `fullres plan` said it fits: fullres lets it use 95 % (the rest is the CUDA context and the
# libraries' handles), and the plan counts that share (`plan.device_bytes.usable_bytes`). The user's setting wins.
GPU_MEMORY_FRACTION = "0.95"
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEMORY_FRACTION)


def _compilation_cache_directory() -> str:
    """The persistent compilation cache's folder, or "" where none can be made (a read-only home in a container)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "fullres", "jax")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return ""
    return directory if os.access(directory, os.W_OK) else ""


COMPILATION_CACHE = {
    "jax_compilation_cache_dir": _compilation_cache_directory(),
    "jax_compilation_cache_max_size": 2 * 1024**3,  # bytes; also what makes JAX lock the folder
    "jax_persistent_cache_min_compile_time_secs": 0.1,  # JAX's default, 1 s, leaves out most initializers
    "jax_persistent_cache_min_entry_size_bytes": 0,
}
for _name, _value in COMPILATION_CACHE.items():
    if _name.upper() in os.environ:  # the user's setting
        continue
    if "jax" in sys.modules:  # imported before fullres (a notebook, the tests): too late for the environment
        import jax

        jax.config.update(_name, _value)
    else:
        os.environ[_name.upper()] = str(_value)

if "keras" in sys.modules:
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(
            f"Keras was imported with the {keras.backend.backend()!r} backend before the fullres trainer; import "
            "`trainer` before TensorFlow or Keras, or set KERAS_BACKEND=jax."
        )
