"""The `Example:` blocks in docstrings run as tests, so they stay true.

Run here (not with `--doctest-modules`) so they see the 8 virtual devices and
the JAX backend that tests/conftest.py sets up before anything imports JAX.
"""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("common", "preprocessing", "trainer", "components", "pipelines", "fullres")


def _modules_with_examples() -> list[str]:
    names = []
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            spec = importlib.util.find_spec(info.name)
            with open(spec.origin, encoding="utf-8") as file:
                if ">>>" in file.read():
                    names.append(info.name)
    return names


MODULES = _modules_with_examples()
SLOW = {"trainer.models.unet"}  # builds and runs 3D UNets: about a minute on 2 cores


def test_the_examples_are_found():
    assert {"trainer.tasks.metrics", "trainer.parallel.partitioning", "preprocessing.ct.ct_transforms"} <= set(MODULES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in MODULES])
def test_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"
