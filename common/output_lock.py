"""One writer per output: `lock(output)` holds an exclusive `flock` on `OUTPUT.fullres-lock` beside the output while a
command writes it, so two runs never write one output at once. The kernel releases the lock when its holder dies, so
a crashed run never leaves a stale lock behind. What may be written where is `output_guard`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket

from common import output_guard


LOCK_SUFFIX = ".fullres-lock"


@contextlib.contextmanager
def lock(output: str, option: str = "--output"):
    """Holds `OUTPUT.fullres-lock` (beside the output) while the body writes the output.

    Object stores have no locks; there the body runs unguarded. A file system
    without `flock` support (some network mounts) is used unguarded as well.

    Raises:
        output_guard.OutputRefused: another live process holds the lock, or `output` lies under a regular file.
    """
    if not output_guard.is_local(output):
        yield
        return
    output_guard.check_parents(output, option)  # the lock is taken before the command's own output checks
    path = os.path.abspath(output).rstrip("/") + LOCK_SUFFIX
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 200).decode(errors="replace").strip() or "another process"
            os.close(descriptor)
            raise output_guard.OutputRefused(f"{option} {output} is being written by another fullres run ({holder}); wait for "
                                f"it to finish, or choose another {option}.") from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(descriptor)
                raise
            break  # no locks on this file system
        # The holder before us may have removed the file between our open and our lock: lock the file in place.
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.close(descriptor)
