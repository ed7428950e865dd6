"""`xla_compile`: a program XLA's GPU compiler can only compile without Triton's GEMMs runs as compiled so.

The compiler's failure itself is the target tier's (tests/trainer/plan/test_gpu_compile_fallback.py, the CUDA
plug-in on SwinUNETR); here, on the CPU, what training does with a program that needed the option: the step runs
that program, never the jitted function (compiled by default, it would fail on the GPU), and says so once.
"""

import jax
import jax.numpy as jnp
import numpy as np

from trainer.parallel import distributed, xla_compile


def test_a_program_compiled_without_triton_gemms_is_the_one_the_step_runs():
    jitted = jax.jit(lambda x: jnp.sin(x) * 2)
    shape = jax.ShapeDtypeStruct((3,), jnp.float32)
    compiled, options = xla_compile.compile(jitted.lower(shape), xla_compile.WITHOUT_TRITON_GEMM)
    assert options == {"xla_gpu_enable_triton_gemm": False}
    lines = []
    step = distributed.RunTogether(jitted, "train step", lines.append)
    step.prime(compiled, shape, options=options)
    for value in (1.0, 0.5):
        np.testing.assert_allclose(step(jnp.full(3, value)), np.sin(np.full(3, value)) * 2, rtol=1e-6)
    assert jitted._cache_size() == 0  # the default-compiled jitted function never ran
    assert lines == [f"train step: {xla_compile.describe(options)}"]


def test_without_options_one_process_calls_the_jitted_function_and_keeps_nothing():
    jitted = jax.jit(lambda x: x + 1)
    shape = jax.ShapeDtypeStruct((2,), jnp.float32)
    compiled, options = xla_compile.compile(jitted.lower(shape))
    assert options == {} and xla_compile.describe(options) == ""
    lines = []
    step = distributed.RunTogether(jitted, "train step", lines.append)
    step.prime(compiled, shape, options=options)
    np.testing.assert_allclose(step(jnp.zeros(2)), [1.0, 1.0])
    assert jitted._cache_size() == 1 and lines == []
