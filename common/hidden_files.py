"""Files no reader takes: what operating systems, archives and tools leave beside the data, never data themselves.

One rule for every reader (`fullres preprocess ct|images|video`, `fullres predict`):
dotfiles (`.DS_Store`, macOS's AppleDouble `._case1.nii.gz` copies, `.git/`,
`.ipynb_checkpoints/`), Windows' `Thumbs.db` and `desktop.ini`, and the
`__MACOSX/` folder that unzipping a macOS zip leaves (it holds only AppleDouble
copies). They are left out, a hidden folder is not entered, and each is
counted once, so that the summary's `hidden_files_ignored` and the log say how
many were passed over.

Example:
    >>> [is_hidden(name) for name in ("._00000.jpg", "Thumbs.db", "__MACOSX", "00000.jpg", "case_1.nii.gz")]
    [True, True, True, False, False]
"""

from __future__ import annotations

import os

WINDOWS_NAMES = frozenset({"thumbs.db", "desktop.ini"})  # compared in lower case, as Windows names them
MACOS_ARCHIVE_FOLDER = "__MACOSX"
SAID = "hidden files (._*, .DS_Store, Thumbs.db, __MACOSX/)"  # how logs name them


def is_hidden(name: str) -> bool:
    """Whether the file or folder name `name` (not a path) is one no reader takes; see the module docstring."""
    return name.startswith(".") or name.lower() in WINDOWS_NAMES or name == MACOS_ARCHIVE_FOLDER


def list_folder(folder: str) -> tuple[list[str], int]:
    """(the names in `folder` that are not hidden, how many hidden ones were left out)."""
    names = os.listdir(folder)
    visible = [name for name in names if not is_hidden(name)]
    return visible, len(names) - len(visible)


def said(count: int) -> str:
    """`; N hidden files (...) ignored` for a log line, or "" when none were."""
    return f"; {count} {SAID} ignored" if count else ""
