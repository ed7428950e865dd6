"""fullres's top-level package names belong to fullres alone in its environment."""

import importlib.metadata
import importlib.util
import os

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "preprocessing", "components", "pipelines", "fullres")


@pytest.mark.parametrize("name", PACKAGES)
def test_no_other_distribution_provides_the_name_and_it_imports_from_fullres(name):
    # An editable install (uv sync) lists no top-level names for fullres itself, so the name maps to
    # fullres or to nothing; any other distribution here would shadow or be shadowed by ours.
    assert set(importlib.metadata.packages_distributions().get(name, [])) <= {"fullres"}
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin == os.path.join(REPOSITORY, name, "__init__.py")
