"""What outputs say about where a case came from: relative paths, never absolute; pseudonyms on request.

Folder names are often patient names (PACS exports name folders after
patients), and outputs travel (Dataflow, Cloud Storage). So records, dead
letters and the summary name a file by its path relative to the input (or
labels) location, never by an absolute path. With `--pseudonymize`, case ids
become keyed hashes, `case-` + the first 16 hex digits of HMAC-SHA256(key, case
id): stable for one key, meaningless without it. Dead letters for files that
belong to no case are named `file-` + the hash of their relative path, and their
details are scrubbed of the names found. The pseudonym ↔ source mapping goes to
`<output>.pseudonyms.json`, beside the output directory and never inside it, so
nothing that uploads or publishes the output carries it.

The key is read from `--pseudonymize-key-file`; without one it is generated once
(32 random bytes, hex) into `<output>.pseudonym-key` beside the mapping and
reused by later runs into the same output. Pass the same key file to every
data set that must share pseudonyms (train and eval splits).

No DICOM attribute other than geometry, pixel data, rescale and Modality is
read, so patient attributes (name, id, birth date, institution, accession,
physicians) are never copied.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets

MAPPING_MARKER = "fullres pseudonym mapping"
# Folder names that identify no one, and that pseudonyms and messages themselves contain: never cut out.
_GENERIC_NAMES = {"case", "cases", "file", "files", "image", "images", "label", "labels", "imagestr", "imagests",
                  "labelstr", "imaging", "segmentation", "data", "dicom", "nifti", "redacted"}


def relative_name(path: str, roots: tuple[str, ...]) -> str:
    """`path` as outputs name it: relative to the input root, or to the folder holding the labels root.

    Args:
        path: an absolute path, or `path:line` (a manifest row).
        roots: absolute input location, then (optionally) the labels location (a folder or a manifest).

    Example:
        >>> relative_name("/data/labels/case1.nii.gz", ("/data/images", "/data/labels"))
        'labels/case1.nii.gz'
    """
    match = re.fullmatch(r"(.*\.csv)(:\d+)", path)
    path, line = match.groups() if match else (path, "")
    path = os.path.abspath(path)
    for index, root in enumerate(roots):
        if path == root:  # the input is one file, or one series folder: keep its own name
            return os.path.basename(root) + line
        if path.startswith(root.rstrip(os.sep) + os.sep):
            relative = os.path.relpath(path, root)
            return (relative if index == 0 else os.path.join(os.path.basename(root), relative)) + line
    return os.path.basename(path) + line


def _prefixes(roots: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Replacements that turn absolute paths under `roots` into the names `relative_name` gives."""
    first = roots[0].rstrip(os.sep) if roots else ""
    replacements = []
    for index, root in enumerate(roots):
        root = root.rstrip(os.sep)
        if index == 0:
            replacements += [(root + os.sep, ""), (root, os.path.basename(root))]
        elif not root.startswith(first + os.sep):
            replacements.append((os.path.dirname(root) + os.sep, ""))
    return tuple(replacements)


def _components(name: str) -> list[str]:
    """The folder names and file stem of a relative name: what a patient's name could hide in."""
    parts = [part for part in re.split(r"[\\/]", name.split(":")[0]) if part not in ("", ".", "..")]
    if parts:
        parts[-1] = parts[-1].split(".")[0]
    return [part for part in parts if len(part) >= 3 and part.lower() not in _GENERIC_NAMES]


@dataclasses.dataclass(frozen=True)
class Scrubber:
    """Replaces identifying strings (absolute paths, original names) in free text, longest first.

    Example:
        >>> Scrubber((("/data/DOE^JOHN/ct", "case-1a2b"),))("cannot read /data/DOE^JOHN/ct/IM1.dcm")
        'cannot read case-1a2b/IM1.dcm'
    """

    replacements: tuple[tuple[str, str], ...] = ()
    masked: tuple[str, ...] = ()  # names left over after the replacements are cut out too

    def __call__(self, text: str) -> str:
        for old, new in sorted(self.replacements, key=lambda pair: -len(pair[0])):
            text = text.replace(old, new)
        for name in sorted(self.masked, key=len, reverse=True):
            text = text.replace(name, "<redacted>")
        return text

    def extended(self, replacements, masked=()) -> Scrubber:
        return Scrubber(self.replacements + tuple(replacements), self.masked + tuple(masked))


def load_or_create_key(path: str) -> bytes:
    """The pseudonymization key in `path`, created there (32 random bytes as hex, mode 0600) if it is missing."""
    if os.path.exists(path):
        with open(path, "rb") as file:
            key = file.read().strip()
        if len(key) < 16:
            raise ValueError(f"pseudonymization key file {path} holds {len(key)} bytes; it needs at least 16 "
                             "(delete it to have fullres generate one, or pass another --pseudonymize-key-file).")
        return key
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32) + "\n")
    with open(path, "rb") as file:
        return file.read().strip()


def pseudonym(key: bytes, text: str, prefix: str = "case") -> str:
    """`prefix-` + the first 16 hex digits of HMAC-SHA256(key, text)."""
    return f"{prefix}-{hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:16]}"


def is_pseudonym(text: str) -> bool:
    """Whether `text` is a name `pseudonym` gives (`case-` or `file-` + 16 hex digits).

    >>> is_pseudonym("case-0123456789abcdef"), is_pseudonym("DOE^JOHN")
    (True, False)
    """
    return re.fullmatch(r"(case|file)-[0-9a-f]{16}", text) is not None


def mapping_path(output: str) -> str:
    """Where the pseudonym ↔ source mapping of `output` goes: beside the output directory, never inside it."""
    return output.rstrip("/" + os.sep) + ".pseudonyms.json"


def key_path(output: str) -> str:
    """Where the generated key of `output` goes when no key file is given."""
    return output.rstrip("/" + os.sep) + ".pseudonym-key"


def write_mapping(path: str, mapping: dict) -> None:
    """Writes the mapping; a file at `path` that fullres did not write is refused, never overwritten."""
    if os.path.exists(path):
        try:
            with open(path) as file:
                ours = json.load(file).get("fullres") == MAPPING_MARKER
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise ValueError(f"{path} exists and is not a fullres pseudonym mapping; move it away or choose another "
                             "--output.")
    temporary = f"{path}.tmp-{secrets.token_hex(4)}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump({"fullres": MAPPING_MARKER, **mapping}, file, indent=2, sort_keys=True)
    os.replace(temporary, path)


@dataclasses.dataclass(frozen=True)
class Named:
    """Cases and dead letters as outputs will show them, and the mapping back (pseudonymized runs only).

    Attributes:
        cases: the cases, each volume's `name` set (and `case_id` replaced under pseudonymization).
        dead: the dead letters, with relative (or pseudonymous) sources and scrubbed details.
        scrubber: what workers apply to the details of their own dead letters.
        mapping: pseudonym -> original (case id, image, label), or {} without pseudonymization.
    """

    cases: list
    dead: list[dict]
    scrubber: Scrubber
    mapping: dict


def name_outputs(cases: list, dead: list[dict], roots: tuple[str, ...], key: bytes | None = None) -> Named:
    """Names every case and dead letter for the outputs: relative paths, and pseudonyms when `key` is given.

    Args:
        cases: `ct_io.CaseSource`s with absolute paths.
        dead: dead letters with absolute sources.
        roots: absolute input location, then (optionally) the labels location.
        key: the pseudonymization key, or None to keep case ids.
    """
    base = Scrubber(_prefixes(roots))
    replacements, masked, named_cases, mapping = [], [], [], {"cases": {}, "files": {}}
    for case in cases:
        image_name = relative_name(case.image.path, roots)
        label_name = relative_name(case.label.path, roots) if case.label is not None else ""
        case_id = case.case_id
        if key is not None:
            case_id = pseudonym(key, case.case_id)
            mapping["cases"][case_id] = {"case_id": case.case_id, "image": image_name, "label": label_name or None}
            replacements += [(repr(case.case_id), repr(case_id)), (image_name, case_id), (label_name, f"{case_id}/label")]
            masked += [case.case_id, *_components(image_name), *_components(label_name)]
            image_name, label_name = case_id, f"{case_id}/label"
        replacements += [(case.image.path, image_name)]
        label = None
        if case.label is not None:
            replacements.append((case.label.path, label_name))
            label = dataclasses.replace(case.label, name=label_name)
        named_cases.append(dataclasses.replace(case, case_id=case_id, image=dataclasses.replace(case.image, name=image_name),
                                               label=label))
    named_dead = []
    for letter in dead:
        source = relative_name(letter["source"], roots)
        if key is not None:
            hidden = pseudonym(key, source, "file")
            mapping["files"][hidden] = source
            replacements += [(letter["source"], hidden), (source, hidden)]
            masked += _components(source)
            source = hidden
        named_dead.append({**letter, "source": source})
    scrubber = base.extended([(old, new) for old, new in replacements if old], masked)
    named_dead = [{**letter, "detail": scrubber(letter["detail"])} for letter in named_dead]
    return Named(named_cases, named_dead, base, mapping if key is not None else {})


def case_scrubber(base: Scrubber, case, pseudonymized: bool, roots: tuple[str, ...]) -> Scrubber:
    """`base` plus the names of one case: what a worker applies to that case's dead-letter detail."""
    volumes = [volume for volume in (case.image, case.label) if volume is not None]
    masked = [part for volume in volumes for part in _components(relative_name(volume.path, roots))] if pseudonymized else []
    return base.extended([(volume.path, volume.name) for volume in volumes], masked)
