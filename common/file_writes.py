"""Writing a file whole or not at all, and naming in one sentence a write the machine refused.

`whole` writes under a temporary name beside the file (`.fullres-partial.NAME`)
and renames it over the file only when the block ends: a kill or a full disk
leaves the previous file, never half of a new one. `write_failure` turns the
operating system's refusal (disk full, quota, permission, read-only) into a
sentence naming the place and the fix, also when a Beam worker hands it back
as text.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

WRITE_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
                errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                errno.EROFS: "the file system is read-only"}
# Beam hands a worker's failure back as text; these are the messages of the errors above.
_WRITE_ERROR_TEXT = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                     "Permission denied": errno.EACCES, "Read-only file system": errno.EROFS}


class OutputWriteFailed(RuntimeError):
    """Writing the output failed for a reason of the machine (disk full, permission denied), not of the data."""


PARTIAL_PREFIX = ".fullres-partial."  # a file being written: `.fullres-partial.a.nii.gz`, renamed to `a.nii.gz` when whole


@contextlib.contextmanager
def whole(path: str, temporary: str | None = None):
    """Yields the name to write `path` under (`.fullres-partial.NAME` beside it, or `temporary`); when the block
    ends it is renamed over `path`, and when the block raises (a full disk) it is removed and `path` keeps what
    it held before."""
    temporary = temporary or partial_path(path)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def write_whole(path: str, content: bytes) -> None:
    """Writes `content` to `path` whole or not at all (`whole`)."""
    with whole(path) as temporary, open(temporary, "wb") as file:
        file.write(content)


def partial_path(path: str) -> str:
    """The name `path` has while it is written (`write_whole`): same folder and ending, so readers of it still know it."""
    return os.path.join(os.path.dirname(path), PARTIAL_PREFIX + os.path.basename(path))


def write_failure(error: BaseException, output: str, option: str = "--output") -> str | None:
    """One sentence for a failure to write `output` (disk full, permission denied), or None for any other error.

    Looks through the exception's causes, and through the text of errors a Beam
    worker handed back, for the operating system's error.
    """
    seen = set()
    current: BaseException | None = error
    code, path = None, None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_ERRORS:
            code, path = current.errno, current.filename
            break
        current = current.__cause__ or current.__context__
    if code is None:
        text = str(error)
        code = next((c for message, c in _WRITE_ERROR_TEXT.items() if message in text), None)
        found = re.search(r"(?:No space left on device|Permission denied|Read-only file system|Disk quota exceeded)"
                          r":\s*'([^']+)'", text)
        path = found.group(1) if found else None
    if code is None:
        return None
    where = os.fspath(path) if path else output
    if code in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space there or choose an {option} on a disk with room, then run again"
    elif code == errno.EROFS:
        fix = f"choose an {option} on a writable disk"
    else:
        fix = f"choose an {option} you may write to, or fix the permissions of {os.path.dirname(where) or where}"
    return f"{WRITE_ERRORS[code]} while writing {where}; {fix}."
