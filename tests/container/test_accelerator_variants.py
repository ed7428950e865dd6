"""The gpu and tpu images stay buildable: their JAX plug-in resolves against the lock.

No accelerator is here, so the test is the Dockerfile's own install step as a dry
run: `uv pip install --dry-run --constraint <the lock, exported>` of the plug-in at
the locked JAX version must resolve, add the plug-in, and change no locked package.
It asks the package index (as the image build does), so it is a `container` test.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

import pytest

from pipelines import image

pytestmark = pytest.mark.container

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN_PACKAGES = {"gpu": "jax-cuda12-plugin", "tpu": "libtpu"}


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in UV
    assert uv, "uv is not on PATH; run the tests with `python3 -m uv run pytest`"
    return uv


@pytest.mark.slow  # exports the lock and asks the package index
@pytest.mark.parametrize("accelerator", ["gpu", "tpu"])
def test_the_plugin_resolves_against_the_lock(accelerator, tmp_path):
    uv = _uv()
    constraints = tmp_path / "locked.txt"
    exported = subprocess.run([uv, "export", "--locked", "--no-dev", "--no-hashes", "--no-emit-project", "--quiet",
                               "-o", str(constraints)], capture_output=True, text=True, cwd=REPOSITORY, timeout=300)
    assert exported.returncode == 0, exported.stderr
    requirement = image.plugin_requirement(accelerator, importlib.metadata.version("jax"))
    resolved = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--python", sys.executable, "--constraint",
         str(constraints), requirement],
        capture_output=True, text=True, cwd=REPOSITORY, timeout=600,
        env={**os.environ, "UV_DEFAULT_INDEX": image.package_index()})
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    changes = resolved.stdout + resolved.stderr
    assert re.search(rf"^ \+ {PLUGIN_PACKAGES[accelerator]}==", changes, flags=re.M), changes[-3000:]
    # Only additions: no locked package would be removed, upgraded or downgraded.
    assert not re.search(r"^ [-~] ", changes, flags=re.M), changes[-3000:]


def test_the_dockerfile_installs_the_plugins_the_test_resolves():
    dockerfile = open(os.path.join(REPOSITORY, "Dockerfile")).read()
    for accelerator, extra in image.JAX_PLUGINS.items():
        assert f"{accelerator}) extra={extra} ;;" in dockerfile
    assert '--constraint /tmp/locked.txt "jax[$extra]==${JAX_VERSION}"' in dockerfile
