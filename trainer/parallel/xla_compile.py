"""Compiling a lowered program around a known failure of XLA's GPU compiler.

XLA's GPU compiler (jax 0.10.2's CUDA 12 plug-in) cannot tile some matrix
products for Triton and stops with INTERNAL "Couldn't find output tile sizes
that satisfy hlo": SwinUNETR's window attention (`tests/trainer/zoo/`) at 32³
to 128³, on `h100x1` and `h100x4`. Without Triton's GEMMs, XLA hands those
products to cuBLAS and the program compiles. `compile` tries the default first
and, only on that message, compiles again without them; it says which it used,
so a plan can print it and training can run the program it got.

Example:
    >>> import jax, jax.numpy as jnp
    >>> compiled, options = compile(jax.jit(jnp.sin).lower(jnp.zeros(3)))
    >>> options
    {}
"""

from __future__ import annotations

TRITON_TILING = "Couldn't find output tile sizes"
WITHOUT_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}


def describe(options: dict | str) -> str:
    """What `options` (as `compile` gives them, or a plan row's "name=value" text) changed, for a plan's row or
    training's log ('' for the default: `WITHOUT_TRITON_GEMM` is the only change `compile` makes)."""
    if not options:
        return ""
    return ("compiled without Triton GEMMs (xla_gpu_enable_triton_gemm=false: XLA could not tile one of this "
            "step's matrix products for Triton, so cuBLAS computes them)")


def compile(lowered, options: dict | None = None):  # noqa: A001 (the name says what it does, as jax's own)
    """`(lowered.compile(...), the compiler options it needed)`.

    Args:
        lowered: a `jax.stages.Lowered`.
        options: compiler options known to be needed already (a program compiled before with them); `None` tries
            the default first.

    Raises:
        jax.errors.JaxRuntimeError: any other compiler error, as it came.
    """
    import jax

    if options:
        return lowered.compile(compiler_options=dict(options)), dict(options)
    try:
        return lowered.compile(), {}
    except jax.errors.JaxRuntimeError as error:
        if TRITON_TILING not in str(error):
            raise
    return lowered.compile(compiler_options=dict(WITHOUT_TRITON_GEMM)), dict(WITHOUT_TRITON_GEMM)
