"""Where a benchmark's JSON goes, checked before any row runs: a GPU measurement is not lost at its end to a folder,
a path under a file or a place that cannot be written (device_check.py and peer/peer_bench.py ask it)."""

from __future__ import annotations

import os
import tempfile


def path_problem(path: str, about: str) -> str | None:
    """Why the result cannot be written to `path`, in one sentence, or None. `about` is the command's name, which
    its JSON begins with: an existing file is replaced only where the command wrote it."""
    if os.path.isdir(path):
        return f"--json {path} is a folder; name a file in it, e.g. {os.path.join(path, about + '.json')}"
    parent = os.path.dirname(os.path.abspath(path))
    above = parent
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        return f"--json {path} lies under {above}, which is a file, not a folder; name a file in a folder"
    if above != parent:
        return f"--json {path}: its folder {parent} does not exist; create it, or name a file in a folder that exists"
    if os.path.exists(path) and about not in open(path, encoding="utf-8", errors="replace").read(200):
        return f"--json {path} exists and is not a {about} result; name a new file"
    try:  # written for real (root is let into a read-only folder's permissions, not into a read-only file system)
        with (open(path, "r+", encoding="utf-8") if os.path.exists(path) else tempfile.TemporaryFile(dir=parent)):
            pass
    except OSError as error:
        return f"--json {path} cannot be written ({error.strerror}); name a file in a folder you can write to"
    return None
