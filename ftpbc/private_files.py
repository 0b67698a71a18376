"""Files and directories private to the node's user: 0600 and 0700 whatever the umask.

What a node keeps on its own disk (journals, the state directory's locks and heartbeats,
sequence files) can be as sensitive as the messages themselves (a journal holds response
bodies), and even a lock or heartbeat file another local user may write is a way to disturb the
node.  The umask is the operator's, often 022, so modes are set explicitly: directories are
created ``0700`` and tightened if they already exist more open, files are opened with ``0600``
and ``fchmod``-ed when the umask took bits away or an older version left them ``0644``.

A low-level module (nothing of ftpbc below it) so that the journal, the cluster state and the
sequence store share one implementation.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

#: directories and files private to the node's user
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create directory ``path`` (and missing parents) with mode 0700; tighten it if it exists.

    Parents created here are 0700 as well (``mkdir -p`` would give them the umask's mode).  An
    existing parent is left as it is: the operator chose it (a shared mount, a home directory),
    and the directory created inside it alone keeps everything below it private.
    """
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass  # created meanwhile by another process or thread; tightened below
        tighten(directory, DIR_MODE)
    if not missing:
        tighten(path, DIR_MODE)


def tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` if its permission bits differ (a directory or regular file).

    A path owned by another user cannot be changed: that is logged, not raised, because the
    caller can still work (another node's user may own a shared state directory's entries).
    """
    try:
        st = os.stat(path, follow_symlinks=False)
        if stat.S_IMODE(st.st_mode) != mode and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            os.chmod(path, mode, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except PermissionError:
        log.warning("%s: cannot restrict its mode to %o (not its owner?)", path, mode)


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with mode 0600, explicitly (also for an existing file)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away; an old file had more
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Replace the contents of ``path`` with ``data``, the file created (or made) 0600.

    No fsync: callers that need durability (the sequence store) write their own way.
    """
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
