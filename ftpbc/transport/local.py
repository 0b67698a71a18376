"""A local or NFS-mounted directory as a transport (``file:///srv/exchange``).

Guarantees: ``rename`` is ``os.replace`` (atomic on POSIX filesystems, NFS included, which is
what makes staging-then-exposing safe); ``put`` writes, then fsyncs before returning when
``durable`` is on, so a file renamed into place after a crash is never empty or torn.

A shared repository is written by partners too, so nothing found in it is trusted:

* Below the base directory no symbolic link is ever followed.  Every path is walked one
  component at a time from a descriptor of the base directory, each opened with ``O_NOFOLLOW``
  (``openat``), so a link planted as a directory on the way (``inbox -> /home/app/.ssh``) or as
  the entry itself (``inbox/req.x -> ~/.netrc``) is refused with
  :class:`~ftpbc.errors.UnsafeEntry` instead of being read, written, renamed or deleted.  The base
  directory itself, from the operator's URL, may be or go through a link.
* ``get`` opens only regular files (``O_NOFOLLOW|O_NONBLOCK``, then ``fstat``): a fifo cannot
  block a reader and a device is never opened; either is an UnsafeEntry.
* ``put`` writes a new file under a random temporary name created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` in the target's directory and renames it over the target, so
  whatever was planted at the target's (predictable) name, a link or a hard link to a file
  elsewhere, is replaced, never written through.
* ``list`` reports regular files and directories only.  Links, fifos, sockets and devices are left
  out (each logged once, at WARNING), so no poller claims them.  ``list_refusing`` reports them
  instead, and ``move_refused`` moves one (the link itself: ``rename`` never follows it), so the
  message lifecycle can file what a partner planted in a box in the error directory.
  A regular file or directory whose name ftpbc cannot address (``\\``, a line break, bytes that
  are not UTF-8: the rule of :mod:`ftpbc.transport.names`) is left out too, logged once.
* ``rename`` refuses a source that is not a regular file or directory
  (:class:`~ftpbc.errors.UnsafeSource`, a SourceGone: the lifecycle skips it like a lost claim).

Not guaranteed: timeouts.  Local system calls cannot be interrupted from Python; on a hard-mounted
NFS share whose server is gone, an operation blocks until the server returns.  Mount with
``soft,timeo=...`` if you prefer an error to a wait.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import secrets
import stat as statmod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import BinaryIO

from ftpbc.errors import (
    AlreadyExists,
    NotFound,
    PermissionDenied,
    SourceGone,
    TransportError,
    UnsafeEntry,
    UnsafeSource,
)
from ftpbc.transport.base import Entry, Refused, Transport, Visit, normalize
from ftpbc.transport.names import OddName, listed_name

log = logging.getLogger(__name__)

CHUNK = 1 << 20
#: unsafe entries logged per transport (each once); beyond this, they are still skipped, silently
REPORTED_LIMIT = 10_000

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
#: the base directory: links allowed (the operator chose it)
_BASE = _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
#: a directory below the base, walked through
_WALK = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory below the base, to be listed
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a file to read: a fifo must not block the open, a link must not be followed
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: a new temporary file to write: never an existing file, never through a link
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_TEMP_PREFIX = ".ftpbc-put-"


def _kind(mode: int) -> str | None:
    """What an entry of ``mode`` is, if it is not a regular file or a directory."""
    if statmod.S_ISREG(mode) or statmod.S_ISDIR(mode):
        return None
    if statmod.S_ISLNK(mode):
        return "a symbolic link"
    if statmod.S_ISFIFO(mode):
        return "a fifo"
    if statmod.S_ISSOCK(mode):
        return "a socket"
    if statmod.S_ISCHR(mode) or statmod.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class LocalTransport(Transport):
    def __init__(self, base: str | Path, *, durable: bool = True) -> None:
        self.base = Path(base)
        self.durable = durable
        self.server = f"file://{self.base}"
        self._reported: set[str] = set()

    # ------------------------------------------------------------------ walking without links

    @staticmethod
    def _parts(path: str) -> list[str]:
        rel = normalize(path)
        return rel[1:].split("/") if rel != "/" else []

    def _open_dir(self, parts: Sequence[str], path: str, flags: int = _WALK) -> int:
        """A descriptor of directory ``parts`` under the base, no link followed on the way.

        NotFound if a component is missing or not a directory, UnsafeEntry if one is a link
        (or a fifo...).  ``flags`` apply to the last component (``_LIST`` to read it).
        """
        # The base directory may be a link: only what lies below it is the partners' to plant.
        fd = os.open(self.base, flags & ~os.O_NOFOLLOW if not parts else _BASE)
        try:
            last = len(parts) - 1
            for i, name in enumerate(parts):
                try:
                    nfd = os.open(name, flags if i == last else _WALK, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                        self._refuse_component(fd, name, "/" + "/".join(parts[:i + 1]))
                    raise
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _refuse_component(self, dir_fd: int, name: str, where: str) -> None:
        """Raise the error for ``name`` (in ``dir_fd``), which could not be opened as a directory."""
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kind = _kind(st.st_mode)
        if kind is not None:
            self._warn(where, kind)
            raise UnsafeEntry(f"{where} is {kind}; refusing to follow it", server=self.server,
                              path=where)
        raise NotFound(f"{where} is not a directory", server=self.server, path=where)

    def _check_entry(self, dir_fd: int, name: str, path: str, *,
                     error: type[UnsafeEntry] = UnsafeEntry) -> os.stat_result:
        """``lstat`` of ``name`` in ``dir_fd``; ``error`` if it is not a regular file or directory."""
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kind = _kind(st.st_mode)
        if kind is not None:
            self._warn(path, kind)
            raise error(f"{path} is {kind}; refusing to touch it", server=self.server, path=path)
        return st

    def _warn(self, path: str, kind: str) -> None:
        if path not in self._reported and len(self._reported) < REPORTED_LIMIT:
            self._reported.add(path)
            log.warning("%s: %s is %s, not a regular file or directory: ignored (a shared directory "
                        "holds something ftpbc will not follow or open)", self.server, path, kind)

    def _skip_name(self, path: str, name: str, why: OddName) -> None:
        # Keyed apart from _warn's paths: the same name may be both odd and, later, a link.
        key = "\0" + _child(path, name)
        if key not in self._reported and len(self._reported) < REPORTED_LIMIT:
            self._reported.add(key)
            log.warning("%s%s: skipped a listed entry: %s", self.server, path, why)

    @contextmanager
    def _mapped(self, path: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise NotFound("no such file or directory", server=self.server, path=path) from None
        except FileExistsError:
            raise AlreadyExists("already exists", server=self.server, path=path) from None
        except PermissionError:
            raise PermissionDenied("permission denied", server=self.server, path=path) from None
        except IsADirectoryError:
            raise TransportError("is a directory", server=self.server, path=path) from None
        except NotADirectoryError:
            raise NotFound("a parent is not a directory", server=self.server, path=path) from None
        except OSError as exc:
            raise TransportError(exc.strerror or str(exc), server=self.server, path=path) from None

    # ------------------------------------------------------------------ Transport API

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        out: builtins.list[Entry] = []
        self._scan(path, _collect(out), None, refuse_dirs=False)
        return out

    def list_refusing(self, path: str, *, refuse_dirs: bool = False,
                      timeout: float | None = None) -> tuple[builtins.list[Entry], builtins.list[Refused]]:
        out: builtins.list[Entry] = []
        refused: builtins.list[Refused] = []
        self._scan(path, _collect(out), refused, refuse_dirs=refuse_dirs)
        return out, refused

    def scan(self, path: str, visit: Visit, *, glob: str | None = None, refuse_dirs: bool = False,
             refused: builtins.list[Refused] | None = None, timeout: float | None = None) -> bool:
        """Streamed from ``scandir``: an entry is visited as it is read (``glob`` applied here)."""
        if glob is None:
            return self._scan(path, visit, refused, refuse_dirs=refuse_dirs)
        pattern = glob
        return self._scan(path, lambda e: not fnmatchcase(e.name, pattern) or visit(e), refused,
                          refuse_dirs=refuse_dirs)

    def _scan(self, path: str, visit: Visit, refused: builtins.list[Refused] | None, *,
              refuse_dirs: bool) -> bool:
        """Regular files and directories of ``path``, to ``visit``; what else is there goes to
        ``refused`` (the caller files it and says so) or, without one, is logged once and left
        out.  False once ``visit`` stopped the listing."""
        with self._mapped(path):
            fd = self._open_dir(self._parts(path), path, _LIST)
            try:
                with os.scandir(fd) as it:
                    for de in it:
                        try:
                            st = de.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # removed between readdir and stat: a snapshot may miss it
                        mode = st.st_mode
                        if statmod.S_ISREG(mode):
                            is_dir = False
                        elif statmod.S_ISDIR(mode) and not (refuse_dirs and refused is not None):
                            is_dir = True
                        elif refused is not None:
                            refused.append(Refused(de.name, _kind(mode) or "a directory"))
                            continue
                        else:
                            self._warn(_child(path, de.name), _kind(mode) or "special")
                            continue
                        try:
                            listed_name(de.name)
                        except OddName as exc:
                            self._skip_name(path, de.name, exc)
                            continue
                        if not visit(Entry(de.name, st.st_size,
                                           datetime.fromtimestamp(st.st_mtime, UTC), is_dir)):
                            return False
            finally:
                os.close(fd)
        return True

    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        parts = self._parts(path)
        if not parts:
            raise TransportError("is a directory", server=self.server, path=path)
        total = 0
        with self._mapped(path):
            dir_fd = self._open_dir(parts[:-1], path)
            try:
                temp = f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
                fd = os.open(temp, _CREATE, 0o666, dir_fd=dir_fd)
                try:
                    with open(fd, "wb") as fh:
                        while chunk := stream.read(CHUNK):
                            fh.write(chunk)
                            total += len(chunk)
                        if self.durable:
                            fh.flush()
                            os.fsync(fh.fileno())
                    # Whatever sits at the name (a file, a planted link) is replaced, not written.
                    os.replace(temp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except BaseException:
                    with suppress(OSError):
                        os.unlink(temp, dir_fd=dir_fd)
                    raise
            finally:
                os.close(dir_fd)
        return total

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        parts = self._parts(path)
        if not parts:
            raise TransportError("is a directory", server=self.server, path=path)
        with self._mapped(path):
            dir_fd = self._open_dir(parts[:-1], path)
            try:
                self._check_entry(dir_fd, parts[-1], path)  # a device is never even opened
                try:
                    fd = os.open(parts[-1], _READ, dir_fd=dir_fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # replaced by a link since the check
                        self._check_entry(dir_fd, parts[-1], path)
                    raise
            finally:
                os.close(dir_fd)
            with open(fd, "rb") as fh:
                mode = os.fstat(fh.fileno()).st_mode
                if statmod.S_ISDIR(mode):
                    raise IsADirectoryError(errno.EISDIR, "is a directory")
                if not statmod.S_ISREG(mode):
                    kind = _kind(mode) or "special"
                    self._warn(path, kind)
                    raise UnsafeEntry(f"{path} is {kind}; refusing to read it", server=self.server,
                                      path=path)
                return _copy(fh, stream)

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        self._rename(src, dst, any_source=False)

    def move_refused(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        # rename(2) moves a link itself and never opens a fifo or a device: whatever the entry
        # is, nothing outside the repository is read or written by moving it.  The directories
        # on the way are still walked without following links.
        self._rename(src, dst, any_source=True)

    def _rename(self, src: str, dst: str, *, any_source: bool) -> None:
        sparts, dparts = self._parts(src), self._parts(dst)
        if not sparts or not dparts:
            raise TransportError("cannot rename the base directory", server=self.server, path=src)
        try:
            src_fd = self._open_dir(sparts[:-1], src)
        except (FileNotFoundError, NotADirectoryError, NotFound) as exc:
            if isinstance(exc, UnsafeEntry):
                raise UnsafeSource(exc.reason, server=self.server, path=src) from None
            raise SourceGone("rename source is gone", server=self.server, path=src) from None
        except OSError as exc:
            with self._mapped(src):
                raise exc
        try:
            try:
                if any_source:
                    os.stat(sparts[-1], dir_fd=src_fd, follow_symlinks=False)
                else:
                    self._check_entry(src_fd, sparts[-1], src, error=UnsafeSource)
            except FileNotFoundError:
                raise SourceGone("rename source is gone", server=self.server, path=src) from None
            with self._mapped(dst):
                try:
                    dst_fd = self._open_dir(dparts[:-1], dst)
                except (FileNotFoundError, NotADirectoryError):
                    raise NotFound("rename target directory does not exist", server=self.server,
                                   path=dst) from None
            try:
                os.replace(sparts[-1], dparts[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except FileNotFoundError:
                try:
                    os.stat(sparts[-1], dir_fd=src_fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise SourceGone("rename source is gone", server=self.server, path=src) from None
                raise NotFound("rename target directory does not exist", server=self.server,
                               path=dst) from None
            except OSError as exc:
                with self._mapped(dst):
                    raise exc
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)

    def delete(self, path: str, *, timeout: float | None = None) -> None:
        parts = self._parts(path)
        if not parts:
            raise TransportError("is a directory", server=self.server, path=path)
        with self._mapped(path):
            dir_fd = self._open_dir(parts[:-1], path)
            try:
                self._check_entry(dir_fd, parts[-1], path)
                os.unlink(parts[-1], dir_fd=dir_fd)
            finally:
                os.close(dir_fd)

    def mkdir(self, path: str, *, timeout: float | None = None) -> None:
        parts = self._parts(path)
        with self._mapped(path):
            # The base directory comes from this node's own configuration, not from a partner:
            # create it when missing, as mkdir creates every missing parent.
            os.makedirs(self.base, exist_ok=True)
            fd = os.open(self.base, _BASE)
            try:
                for i, name in enumerate(parts):
                    try:
                        nfd = os.open(name, _WALK, dir_fd=fd)
                    except FileNotFoundError:
                        with suppress(FileExistsError):  # another node made it meanwhile: fine
                            os.mkdir(name, 0o777, dir_fd=fd)
                        nfd = self._open_made(fd, name, "/" + "/".join(parts[:i + 1]))
                    except OSError as exc:
                        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                            raise
                        self._refuse_made(fd, name, "/" + "/".join(parts[:i + 1]))
                        raise
                    os.close(fd)
                    fd = nfd
            finally:
                os.close(fd)

    def _open_made(self, dir_fd: int, name: str, where: str) -> int:
        try:
            return os.open(name, _WALK, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                self._refuse_made(dir_fd, name, where)
            raise

    def _refuse_made(self, dir_fd: int, name: str, where: str) -> None:
        st = self._check_entry(dir_fd, name, where)
        if not statmod.S_ISDIR(st.st_mode):
            raise AlreadyExists("exists and is not a directory", server=self.server, path=where)

    def stat(self, path: str, *, timeout: float | None = None) -> Entry:
        parts = self._parts(path)
        with self._mapped(path):
            if not parts:
                st = os.stat(self.base)
                name = self.base.name
            else:
                dir_fd = self._open_dir(parts[:-1], path)
                try:
                    st = self._check_entry(dir_fd, parts[-1], path)
                finally:
                    os.close(dir_fd)
                name = parts[-1]
        return Entry(name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC),
                     statmod.S_ISDIR(st.st_mode))


def _child(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def _copy(src: BinaryIO, dst: BinaryIO) -> int:
    total = 0
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        total += len(chunk)
    return total


def _collect(out: builtins.list[Entry]) -> Visit:
    """A visit that keeps every entry in ``out``."""
    def visit(e: Entry) -> bool:
        out.append(e)
        return True
    return visit
