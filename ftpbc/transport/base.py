"""The transport interface: the handful of storage primitives the message lifecycle is built on.

Everything ftpbc does to a server goes through :class:`Transport`.  Implementations:
FTP and FTPS (``ftp.py``), SFTP (``sftp.py``) and a local or NFS directory (``local.py``).

Paths
    Every path is absolute and POSIX-style (``/exchange/quote/inbox/req.x``), and is resolved
    under the *base directory* of the server's URL (``ftp://host/base`` or ``file:///srv/x``), so
    ``/`` is the base.  A path with a ``..`` segment or a NUL byte is refused with
    :class:`~ftpbc.errors.UnsafeNameError` before anything is sent.

Timeouts
    Every operation takes ``timeout`` (seconds).  ``None`` means the server's configured default.
    A timeout before the command was sent raises :class:`~ftpbc.errors.TransportTimeout`; after it
    was sent (no reply), :class:`~ftpbc.errors.OutcomeUnknown`.

The rename contract (the same for every implementation)
    ``rename(src, dst)`` moves ``src`` to ``dst`` in one step: afterwards either ``src`` is still
    where it was and ``dst`` untouched, or ``dst`` holds the former ``src``.

    * If ``src`` does not exist, :class:`~ftpbc.errors.SourceGone` is raised.  This is how a
      consumer learns it lost a claim race; it is not an error worth logging.
    * If ``dst`` already exists, it is **replaced**.  POSIX servers do this atomically
      (pyftpdlib, vsftpd, OpenSSH's ``posix-rename@openssh.com``, ``os.replace``).  On an SFTP
      server without ``posix-rename`` the implementation removes ``dst`` first, so a crash between
      the two steps leaves ``src`` in place and the old ``dst`` gone: the old target can be lost,
      never the file being moved.  ftpbc's own names never collide (they carry a UUID or a node
      identity), and ``protect`` moves an existing target aside before exposing, so replacement
      only ever happens on purpose.
    * A rename whose reply is lost raises :class:`~ftpbc.errors.OutcomeUnknown`; callers decide
      from the server's state whether it happened.

What is *not* guaranteed
    ``list`` is a snapshot: files may appear or vanish right after it.  ``mtime`` has the
    precision the server gives (seconds with MLSD or SFTP, minutes with some LIST formats) and
    may be ``None`` when the server gives none.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import BinaryIO

from ftpbc.errors import NotFound, TransportError
from ftpbc.paths import check_name, join, normalize

__all__ = ["Entry", "GlobRefused", "Refused", "Transport", "Visit", "check_name", "join", "normalize",
           "stream_position"]

#: what :meth:`Transport.scan` hands each entry to; False stops the listing there
Visit = Callable[["Entry"], bool]


class GlobRefused(TransportError):
    """The server would not list by a name glob (pyftpdlib: ``550``): list the whole
    directory instead.  The transport remembers it (``globs`` becomes False)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One directory entry.  ``mtime`` is timezone-aware UTC, or None when unknown; ``size``
    is -1 for a file listed without a size (an MLSD line with no ``size`` fact)."""

    name: str
    size: int
    mtime: datetime | None
    is_dir: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """An entry a listing left out because it is not safe to open (``file://``: a symbolic
    link, a fifo, a socket, a device; a directory where only files belong).  ``kind`` says
    which, as a phrase (``"a symbolic link"``)."""

    name: str
    kind: str


class Transport(ABC):
    """Storage primitives on one server.  Implementations are safe to share between threads."""

    #: Display name of the server, ``scheme://user@host:port`` (never a password).
    server: str

    @abstractmethod
    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        """Entries of directory ``path`` (without ``.`` and ``..``).  NotFound if it is missing."""

    #: whether :meth:`scan` can have the server select names by a glob (so that a slice of a
    #: huge directory costs the server a directory read, not a listing of every entry): True,
    #: False, or None while not known (FTP: known after the first glob listing)
    globs: bool | None = False

    def scan(self, path: str, visit: Visit, *, glob: str | None = None, refuse_dirs: bool = False,
             refused: builtins.list[Refused] | None = None, timeout: float | None = None) -> bool:
        """Hand the entries of directory ``path`` to ``visit`` as the listing comes in; True if
        the listing was read to its end, False if ``visit`` stopped it (returned False: the rest
        is not read, nor held in memory).

        ``glob`` (``*``, ``?``, matched case-sensitively against whole names) selects entries:
        by the server where it can (``globs``), else here; either way ``visit`` sees matching
        entries only.  A server that refuses globs raises GlobRefused (nothing was visited).
        Entries a listing refuses (see :meth:`list_refusing`) go to ``refused`` when given.
        The same bounds as :meth:`list` hold (``max_listing_entries``, bad lines skipped).  A
        listing retried after a dropped connection may hand an entry to ``visit`` twice.

        This default lists the whole directory first, then visits it: memory grows with the
        directory; the FTP, SFTP and local transports stream instead.
        """
        entries, left_out = self.list_refusing(path, refuse_dirs=refuse_dirs, timeout=timeout)
        if refused is not None:
            refused.extend(left_out)
        for e in entries:
            if glob is not None and not fnmatchcase(e.name, glob):
                continue
            if not visit(e):
                return False
        return True

    @abstractmethod
    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        """Write ``stream`` (read to its end, in chunks) to file ``path``; return bytes written.

        The file is replaced if it exists.  Readers may see a partial file while it is written:
        that is why the lifecycle always puts into a stage directory and renames into place.
        """

    @abstractmethod
    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        """Copy file ``path`` into ``stream`` in chunks; return bytes read.  NotFound if missing."""

    @abstractmethod
    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        """Move ``src`` to ``dst`` under the rename contract in this module's docstring."""

    def rename_each(self, pairs: Sequence[tuple[str, str]], *,
                    timeout: float | None = None) -> builtins.list[TransportError | None]:
        """Rename every ``(src, dst)`` of ``pairs`` as :meth:`rename` would, in order; return,
        per pair, None if it was renamed or the TransportError its rename raised.

        Nothing is raised for one pair: a :class:`~ftpbc.errors.SourceGone` (a race lost), an
        :class:`~ftpbc.errors.OutcomeUnknown` (the caller decides from the server's state) or
        any other error says what happened to that pair only, and the other pairs are renamed
        all the same.  An error other than OutcomeUnknown means that pair was not renamed.
        This default renames one pair after the other; a transport that can send several at
        once (FTP: every RNFR and RNTO in one write) does.
        """
        outcomes: builtins.list[TransportError | None] = []
        for src, dst in pairs:
            try:
                self.rename(src, dst, timeout=timeout)
                outcomes.append(None)
            except TransportError as exc:
                outcomes.append(exc)
        return outcomes

    @abstractmethod
    def delete(self, path: str, *, timeout: float | None = None) -> None:
        """Remove file ``path``.  NotFound if it does not exist."""

    @abstractmethod
    def mkdir(self, path: str, *, timeout: float | None = None) -> None:
        """Create directory ``path`` and any missing parents; an existing directory is fine."""

    @abstractmethod
    def stat(self, path: str, *, timeout: float | None = None) -> Entry:
        """The entry for ``path``.  NotFound if it does not exist."""

    def list_refusing(self, path: str, *, refuse_dirs: bool = False,
                      timeout: float | None = None) -> tuple[builtins.list[Entry], builtins.list[Refused]]:
        """``list``, and the entries it left out as unsafe to open (``refuse_dirs``: directories
        too, reported as refused rather than listed).

        Only a transport that can tell a link from a file refuses anything (``file://``); a
        remote server shows ftpbc what its own user may open, so here nothing is refused.
        """
        return self.list(path, timeout=timeout), []

    def move_refused(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        """Move an entry :meth:`list_refusing` refused to ``dst`` without opening or following
        it (a rename moves a link itself, never what it points to).  SourceGone if it is gone."""
        self.rename(src, dst, timeout=timeout)

    def exists(self, path: str, *, timeout: float | None = None) -> bool:
        try:
            self.stat(path, timeout=timeout)
        except NotFound:
            return False
        return True

    def close(self) -> None:  # noqa: B027 - optional for implementations without resources
        """Release connections.  The transport must not be used afterwards."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_position(stream: BinaryIO) -> int | None:
    """Where a seekable stream stands (to rewind it for a retry), or None if it cannot seek."""
    try:
        return stream.tell() if stream.seekable() else None
    except (AttributeError, OSError, ValueError):
        return None
