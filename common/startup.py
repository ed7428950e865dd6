"""A fullres process's start: Python's cyclic garbage collector rests while a module is being imported.

A fullres command imports TensorFlow, JAX, Keras and their dependencies, a
million and more Python objects. While it does, the collector of reference
cycles runs a full collection each time the heap has grown by a quarter, and
each one walks every object imported so far. Measured on the 2-core machine
(`import trainer, tensorflow, jax, keras, trainer.train, orbax.checkpoint,
keras_hub`, three runs each, alternated, 2026-11-26): 6.5-7.5 CPU-s as Python
does it, 5.0-5.8 with the collector resting during imports; every pipeline
step, CLI command and trainer process pays that once.

Only the cyclic collector waits: reference counting frees what it frees as
always, and the collector runs again as soon as the outermost import statement
returns. A process whose collector was off before an import keeps it off.
`fullres` (`pipelines.cli.main`), `python -m trainer` (the processes the local
launcher starts) and every pipeline step call `collect_after_imports` first; a
Python session that imports fullres as a library keeps Python's own behaviour.
"""

from __future__ import annotations

import builtins
import gc

_MARK = "_fullres_collects_after_imports"


def collect_after_imports() -> None:
    """From now on in this process, the cyclic garbage collector is off while an import statement runs.

    Idempotent. Imports through `importlib.import_module` are not covered (they do not go through
    `builtins.__import__`); threads importing at once may see the collector back on before they are done.
    """
    if getattr(builtins.__import__, _MARK, False):
        return
    original = builtins.__import__

    def import_without_collecting(*args, **kwargs):
        if not gc.isenabled():  # off already: the caller's, or an import within an import
            return original(*args, **kwargs)
        gc.disable()
        try:
            return original(*args, **kwargs)
        finally:
            gc.enable()

    setattr(import_without_collecting, _MARK, True)
    builtins.__import__ = import_without_collecting
