"""Publishing a conversion's output: its staging directory swapped in, on a local disk or an object store.

Only the files a previous conversion wrote are deleted (its manifest,
`common.output_guard`); `summary.json`, the completion marker, goes in last.
"""

from __future__ import annotations

import json
import os
import uuid

from apache_beam.io.filesystems import FileSystems

from common import output_guard


def is_local(path: str) -> bool:
    return "://" not in path


def list_files(directory: str, pattern: str = "*") -> list:
    """File metadata under `directory` (any Beam filesystem); empty if there is none."""
    try:
        return FileSystems.match([FileSystems.join(directory, pattern)])[0].metadata_list
    except Exception:  # Beam raises BeamIOError for a pattern that matches nothing on some filesystems
        return []


def write_json(path: str, content) -> None:
    with FileSystems.create(path) as file:
        file.write(json.dumps(content, indent=2).encode())


def publish(staging: str, output: str, last: str = "summary.json") -> None:
    """Swaps `staging` in as `output`, deleting only the files a previous conversion wrote there.

    Local: two directory renames, then the old output's own files are deleted.
    Object store: a manifest covering old and new files first (so an interrupted
    swap is still recognised as fullres's), delete the old files, move the new
    ones in with `last` (the completion marker) after everything else, then the
    manifest of the new files.

    Raises:
        output_guard.OutputRefused: `output` holds files fullres did not write
            (they may have appeared while the pipeline ran); nothing is deleted.
    """
    old_files = output_guard.conversion_files(output)
    new_files = [name for name in _names(staging) if name != output_guard.MARKER]
    output_guard.write_marker(staging, "tfrecords", new_files)
    if is_local(output):
        if os.path.exists(output):
            old = f"{output}.old-{uuid.uuid4().hex[:8]}"
            os.rename(output, old)
            os.rename(staging, output)
            for name in old_files:
                os.remove(os.path.join(old, name))
            os.rmdir(old)  # empty now; rmdir, unlike rmtree, could never take a file fullres did not write
        else:
            os.rename(staging, output)
        return
    output_guard.write_marker(output, "tfrecords", sorted(set(old_files) | set(new_files)))
    stale = [FileSystems.join(output, name) for name in old_files if name != output_guard.MARKER]
    if stale:
        FileSystems.delete(stale)
    for name in sorted(new_files, key=lambda name: name == last):
        FileSystems.rename([FileSystems.join(staging, name)], [FileSystems.join(output, name)])
    output_guard.write_marker(output, "tfrecords", new_files)
    FileSystems.delete([FileSystems.join(staging, output_guard.MARKER)])


def _names(directory: str) -> list[str]:
    """The names of the files in `directory` (local or object store)."""
    if is_local(directory):
        return sorted(os.listdir(directory))
    return sorted(m.path.rsplit("/", 1)[-1] for m in list_files(directory))
