"""JAX's persistent compilation cache, switched on by `import trainer`: a second process reads what the first compiled."""

import json
import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Compiles one small program and reports where the cache is and how many compilations it answered.
PROGRAM = """
import json
import trainer
import jax
import jax.numpy as jnp

hits = []
jax.monitoring.register_event_listener(
    lambda event, **kwargs: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
# One small program: a weight's initial values, drawn flat (a 5-d draw compiles 6.7 s on XLA:CPU, the flat one
# well under a second, above the 0.1 s that fullres sets as the least compile time worth caching).
initial = jax.random.uniform(jax.random.PRNGKey(0), (3 * 3 * 3 * 4 * 8,))
print(json.dumps({"directory": jax.config.jax_compilation_cache_dir, "hits": len(hits),
                  "sum": float(jnp.sum(initial))}))
"""


def _run(home, **environment):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "XDG_CACHE"))}
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=REPOSITORY,
                            env={**clean, "HOME": str(home), "JAX_PLATFORMS": "cpu", **environment}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # four fresh processes
def test_a_second_process_reads_what_the_first_compiled(tmp_path):
    first = _run(tmp_path)
    directory = tmp_path / ".cache" / "fullres" / "jax"
    assert first["directory"] == str(directory) and first["hits"] == 0
    assert any(name.endswith("-cache") for name in os.listdir(directory)), os.listdir(directory)
    second = _run(tmp_path)
    assert second["hits"] >= 1 and second["sum"] == first["sum"]


@pytest.mark.slow
def test_an_empty_setting_switches_it_off_and_an_unwritable_home_is_no_error(tmp_path):
    assert _run(tmp_path, JAX_COMPILATION_CACHE_DIR="")["directory"] == ""
    assert not (tmp_path / ".cache").exists()
    home = tmp_path / "a-file"  # a home nothing can be made below (a read-only mode would not stop root)
    home.touch()
    off = _run(home)
    assert off["directory"] == "" and off["hits"] == 0
