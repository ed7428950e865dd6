"""Output safety for every command that writes: fullres replaces only what it wrote itself.

Before anything is read, a command checks its output location:

- it must not equal, contain or lie inside an input (symlinks resolved);
- it must not be an existing file;
- an existing, non-empty directory must be one fullres wrote: a conversion
  output (its `.fullres-output` manifest lists the files it holds; an older
  output is recognised by holding shards and nothing but fullres's own file
  names), a training run (a `train_config.json` fullres wrote), demo
  data (the marker lists every file, in every subfolder), or a demo / pipeline
  root (the marker);
- a single file a command replaces (`pipeline compile`) must be one fullres wrote.

A conversion replaces its output by deleting exactly the files the manifest
lists; anything else found there makes it refuse, naming the file and the fix.
`output_lock.lock(output)` keeps two runs from writing one output at once.

Every refusal is one sentence: what, where, and the fix.
"""

from __future__ import annotations

import json
import os
import re

from common import file_writes

MARKER = ".fullres-output"
# What a conversion writes (preprocessing.beam.conversion): shards, dead letters, summary, label map.
CONVERSION_NAMES = re.compile(r"^(data-\d+-of-\d+\.tfrecord(\.gz)?|dead_letter\.jsonl|notes\.json|summary\.json|label_map\.json)$")
# kfp.local names each run directory `<pipeline>-YYYY-MM-DD-HH-MM-SS-micros`.
PIPELINE_RUN = re.compile(r"^.+-\d{4}(-\d{2}){5}-\d{6}$")


class OutputRefused(ValueError):
    """The output location is unsafe to write; the message says why and what to do."""


def is_local(path: str) -> bool:
    return "://" not in path


def _resolve(path: str) -> str:
    """Absolute, symlinks resolved (local); normalized without a trailing slash (object stores)."""
    return os.path.realpath(os.path.expanduser(path)) if is_local(path) else path.rstrip("/")


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _location(pattern: str) -> str:
    """The directory of a file pattern: `data/train-*.tfrecord` -> `data`; a plain path is its own location."""
    if not any(c in pattern for c in "*?["):
        return pattern
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return head if head.endswith("/") else (os.path.dirname(head) or ".")


def check_outside_inputs(output: str, inputs: dict[str, str | None], option: str = "--output") -> None:
    """Refuses an output that equals, contains or lies inside one of `inputs` ({name: path or pattern}).

    Raises:
        OutputRefused: naming the input and asking for another output.
    """
    target = _resolve(output)
    for name, given in inputs.items():
        if not given:
            continue
        location = _resolve(_location(given))
        if target == location:
            relation = "is"
        elif _inside(location, target):
            relation = "contains"
        elif _inside(target, location):
            relation = "lies inside"
        else:
            continue
        raise OutputRefused(
            f"{option} {output} {relation} the {name} {location}; fullres would replace or mix its files with "
            f"yours, so choose an {option} outside {location} (e.g. {os.path.dirname(location)}/fullres-output)."
        )


def _check_not_a_file(output: str, option: str) -> None:
    if is_local(output) and (os.path.isfile(output) or (os.path.lexists(output) and not os.path.isdir(output))):
        raise OutputRefused(f"{option} {output} is an existing file, not a directory; fullres does not replace files "
                            f"it did not write, so pass a new directory path as {option}.")
    check_parents(output, option)


def check_parents(output: str, option: str) -> None:
    """Refuses a local `output` under a regular file: no folder can be made there (NotADirectoryError)."""
    parent = os.path.dirname(os.path.abspath(output)) if is_local(output) else ""
    while parent and not os.path.lexists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise OutputRefused(f"{option} {output} lies under {parent}, which is a file, not a folder; pass an {option} "
                            "whose parent folders are folders (or do not exist yet).")


def _entries(directory: str) -> list[str]:
    """The names in `directory` (a local directory, or a prefix on an object store); [] if there is none."""
    if is_local(directory):
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([FileSystems.join(directory, "**")])[0].metadata_list
    except Exception:  # Beam raises BeamIOError for a pattern that matches nothing on some filesystems
        return []
    prefix = directory.rstrip("/") + "/"
    return sorted(m.path[len(prefix):] for m in found if m.path.startswith(prefix))


def _files_below(directory: str) -> list[str]:
    """Every file under `directory`, in every subfolder, as relative paths ([] if there is none); links not followed."""
    if not is_local(directory):
        return _entries(directory)  # an object store's listing is recursive already
    found = []
    for folder, subfolders, names in os.walk(directory):
        links = [n for n in subfolders if os.path.islink(os.path.join(folder, n))]  # a link is an entry, not a folder
        found += [os.path.relpath(os.path.join(folder, n), directory) for n in names + links]
    return sorted(found)


def read_marker(directory: str) -> dict | None:
    """The content of `directory`'s marker (`.fullres-output`), or None when it has none or it is not JSON."""
    content = _read_json(directory, MARKER)
    return content if isinstance(content, dict) else None


def _read_json(directory: str, name: str):
    """The JSON content of `directory/name`, or None if it is missing or not JSON."""
    path = os.path.join(directory, name) if is_local(directory) else directory.rstrip("/") + "/" + name
    try:
        if is_local(directory):
            with open(path) as file:
                return json.load(file)
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path) as file:
            return json.loads(file.read().decode())
    except (OSError, ValueError):
        return None
    except Exception:  # Beam's object-store errors
        return None


def _foreign(output: str, names: list[str], option: str, fix: str) -> OutputRefused:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return OutputRefused(f"{option} {output} holds files fullres did not write ({shown}); fullres never deletes or "
                         f"overwrites them, so {fix}.")


def conversion_files(output: str, option: str = "--output") -> list[str]:
    """The files a conversion may delete to replace `output`: exactly those a previous conversion wrote.

    Returns:
        Names relative to `output` ([] when it does not exist or is empty).

    Raises:
        OutputRefused: `output` is a file, or holds anything fullres did not write.
    """
    _check_not_a_file(output, option)
    names = _entries(output)
    if not names:
        return []
    fix = f"pass a new or empty directory as {option}, or move those files away"
    marker = read_marker(output)
    if isinstance(marker, dict) and marker.get("kind") == "tfrecords":
        listed = set(marker.get("files", [])) | {MARKER}
    elif any(CONVERSION_NAMES.match(n) and n.startswith("data-") for n in names):
        # Written before the manifest existed: recognised by its shards (Beam's names), and fullres's own names only.
        listed = {n for n in names if CONVERSION_NAMES.match(n)}
    else:  # without a shard, a `summary.json` or `label_map.json` is as likely a user's as fullres's: never replaced
        listed = set()
    unknown = [n for n in names if n not in listed]
    if unknown:
        raise _foreign(output, unknown, option, fix)
    return names


def check_conversion_output(output: str, inputs: dict[str, str | None], option: str = "--output") -> None:
    """Everything a conversion checks before it reads: no overlap with inputs, and a replaceable output."""
    check_outside_inputs(output, inputs, option)
    conversion_files(output, option)


def write_marker(directory: str, kind: str, files: list[str] | None = None) -> None:
    """Marks `directory` as written by fullres (`kind`: tfrecords, demo, pipeline-root), listing its files."""
    content = json.dumps({"written_by": "fullres", "kind": kind, "files": sorted(files or [])}, indent=2).encode()
    if is_local(directory):
        file_writes.write_whole(os.path.join(directory, MARKER), content)
        return
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(directory.rstrip("/") + "/" + MARKER) as file:
        file.write(content)


def check_run_directory(output: str, inputs: dict[str, str | None], option: str = "--output") -> None:
    """`fullres train`: a new or empty directory, or a fullres run (resumed); never one holding other files."""
    check_outside_inputs(output, inputs, option)
    _check_not_a_file(output, option)
    names = _entries(output)
    if names and not _is_train_config(_read_json(output, "train_config.json")):
        raise _foreign(output, names, option, f"pass a new or empty directory as {option}, or the output of an "
                                              "earlier `fullres train` to resume it")


def _is_train_config(content) -> bool:
    """Whether `content` (parsed `train_config.json`) is a TrainConfig fullres wrote, not a user's file of that name."""
    return (isinstance(content, dict) and content.get("task", "segmentation") in ("segmentation", "detection")
            and isinstance(content.get("model"), dict) and isinstance(content.get("partition"), dict))


def check_owned_directory(output: str, kind: str, inputs: dict[str, str | None], option: str = "--output") -> None:
    """`demo` and pipeline roots: a new or empty directory, or one fullres marked as `kind` (or clearly wrote).

    Older outputs, written before the marker, are recognised by their layout: a
    demo directory holds `summary.json` and `pipeline-root/`; a pipeline root
    holds only kfp.local run directories.
    """
    check_outside_inputs(output, inputs, option)
    _check_not_a_file(output, option)
    names = [n for n in _entries(output) if n != MARKER]
    if not names:
        return
    marker = read_marker(output)
    if marker is not None and marker.get("kind") == kind:
        return
    if kind == "demo" and {"summary.json", "pipeline-root"} <= set(names):
        return
    if kind == "pipeline-root" and all(PIPELINE_RUN.match(n) for n in names):
        return
    files = [n for n in _files_below(output) if n != MARKER] or names  # name the files themselves, not their folder
    raise _foreign(output, files, option, f"pass a new or empty directory as {option}")


def demo_data_files(output: str, kind: str, planned: list[str] = (), option: str = "--output") -> list[str]:
    """`fullres demo-data`: a new or empty directory, or one whose `kind` marker lists every file below it.

    Args:
        planned: the files this run will write (relative paths); a foreign file
            among them is named first, as the one in the way.

    Returns:
        The files an earlier run of `kind` wrote there (which this run may replace).

    Raises:
        OutputRefused: `output` is a file, or holds a file (in any subfolder) fullres did not write.
    """
    _check_not_a_file(output, option)
    names = [n for n in _files_below(output) if n != MARKER]
    marker = read_marker(output)
    listed = set(marker.get("files", [])) if isinstance(marker, dict) and marker.get("kind") == kind else set()
    unknown = sorted((n for n in names if n not in listed), key=lambda n: n not in set(planned))
    if unknown:
        raise _foreign(output, unknown, option, f"pass a new or empty directory as {option}, or move those files away")
    return names


def check_own_file(directory: str, name: str, header: bytes, made: str, option: str) -> None:
    """Refuses `directory/name` unless it is absent or begins with `header` (what fullres writes there).

    Args:
        made: what fullres did to write such a file, for the sentence ("compile").

    Raises:
        OutputRefused: naming the file and the fix.
    """
    path = os.path.join(directory, name)
    if not os.path.lexists(path):
        return
    try:
        with open(path, "rb") as file:
            ours = os.path.isfile(path) and not os.path.islink(path) and file.read(len(header)) == header
    except OSError:
        ours = False
    if not ours:
        raise OutputRefused(f"{option} {directory} holds {name}, which fullres did not {made}; fullres never overwrites "
                            f"it, so pass another {option}, or move {name} away.")


def check_listed_output(output: str, kind: str, inputs: dict[str, str | None], option: str = "--output",
                        below: bool = False) -> list[str]:
    """`fullres predict`: a new or empty directory, or one whose `kind` marker lists every file it holds (`below`:
    in every subfolder too, named by relative paths, as a video's masks are).

    Returns:
        The files an earlier run of `kind` wrote there (which this run may replace).

    Raises:
        OutputRefused: `output` overlaps an input, is a file, or holds a file fullres did not write.
    """
    check_outside_inputs(output, inputs, option)
    _check_not_a_file(output, option)
    names = [n for n in (_files_below(output) if below else _entries(output)) if n != MARKER]
    marker = read_marker(output) or {}
    listed = set(marker.get("files", [])) if marker.get("kind") == kind else set()
    unknown = [n for n in names if n not in listed]
    if unknown:
        raise _foreign(output, unknown, option, f"pass a new or empty directory as {option}, or move those files away")
    return names
