"""Helpers the tests share."""

import importlib.util
import os
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(root) -> dict:
    """Every file under `root` (links not followed) with its bytes: what must survive a refusal unchanged."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, root)] = file.read()
    return found


def load_script(*path: str, with_its_folder: bool = False):
    """A script that is no package's module (`benchmarks/`, `docs/`), loaded from its path under the repository, as
    a module named after its file. `with_its_folder`: its folder goes first on sys.path, as when its command runs,
    for a script that imports its neighbours."""
    location = os.path.join(REPOSITORY, *path)
    if with_its_folder:
        sys.path.insert(0, os.path.dirname(location))
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(location))[0], location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
