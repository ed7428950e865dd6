"""Helpers the tests share."""

import os


def snapshot(root) -> dict:
    """Every file under `root` (links not followed) with its bytes: what must survive a refusal unchanged."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, root)] = file.read()
    return found
