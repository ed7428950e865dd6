"""Imports run one way: pipelines -> components -> trainer / preprocessing, never back."""

import subprocess
import sys

import pytest

CHECK = """
import importlib, pkgutil, sys
for package in ("common", "preprocessing", "trainer"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(info.name)
        upward = sorted(name for name in sys.modules if name.split(".")[0] in ("pipelines", "components"))
        assert not upward, f"importing {info.name} imported {upward}"
import runpy
sys.argv = ["trainer", "train", "--help"]  # `python -m trainer train --help`: the train command, from the trainer
try:
    runpy.run_module("trainer", run_name="__main__")
except SystemExit as done:
    assert done.code in (0, None), done.code
upward = sorted(name for name in sys.modules if name.split(".")[0] in ("pipelines", "components"))
assert not upward, f"python -m trainer train imported {upward}"
print("ok")
"""


@pytest.mark.slow  # a fresh process imports TensorFlow, JAX, Keras and Beam
def test_library_packages_import_neither_pipelines_nor_components():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok") and "Usage: fullres train" in result.stdout, result.stderr[-3000:]
