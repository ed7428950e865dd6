"""Every third-party package the library imports is declared in pyproject.toml, not merely installed by another."""

import ast
import importlib.metadata
import os
import re
import sys
import tomllib

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("common", "preprocessing", "trainer", "components", "pipelines", "fullres")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_level_names() -> set[str]:
    names = set()
    for package in PACKAGES:
        for directory, _, files in os.walk(os.path.join(REPOSITORY, package)):
            for file_name in files:
                if file_name.endswith(".py"):
                    with open(os.path.join(directory, file_name), encoding="utf-8") as file:
                        tree = ast.parse(file.read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            names.update(alias.name.split(".")[0] for alias in node.names)
                        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}


def test_every_imported_package_is_declared():
    with open(os.path.join(REPOSITORY, "pyproject.toml"), "rb") as file:
        declared = {_normalized(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0])
                    for spec in tomllib.load(file)["project"]["dependencies"]}
    providers = importlib.metadata.packages_distributions()
    undeclared = {name: providers.get(name) for name in _imported_top_level_names()
                  if not declared & {_normalized(d) for d in providers.get(name, [])}}
    assert undeclared == {}
