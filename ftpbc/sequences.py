"""Persisted sequence numbers (``%0``-``%9``, ``%{0}``-``%{9}``, ``%{name}``) and the transient one.

Each persisted sequence is one small file holding the *next* value as ASCII decimal (a newline
after it is optional).  A missing file is a fresh sequence: its first reference yields 0.  An
operator may write a start value into the file while nothing is running.

Layout::

    <local_dir>/endpoint-sequences/<endpoint-uuid>/sequence0..9    %0-%9   (this node only)
    <shared_dir>/endpoint-sequences/<endpoint-uuid>/sequence0..9   %{0}-%{9} (every node)
    <shared_dir>/sequences/<name>                                  %{name}  (every endpoint, node)

``<endpoint-uuid>`` is ``uuid5(NAMESPACE_URL, "ftpbc:endpoint:<name>")``: stable for a given
endpoint name, so renaming an endpoint starts its counters afresh.  Each endpoint directory also
holds a file ``endpoint`` with the endpoint's name, for operators and ``ftpbc seq show``.

Guarantees of :meth:`SequenceStore.next`:

* one increment is serialised across threads (a lock per file in this process) and processes or
  nodes (``flock`` on ``<file>~lock`` through filelock, which NFS turns into a POSIX byte-range
  lock served by lockd or NFSv4: without working locks two nodes can hand out the same value);
* the new value is written to ``<file>~tmp``, fsynced, renamed over the file and the directory
  fsynced before the old value is returned, so a crash at any point leaves the old or the new
  value, never an empty or torn file, and (with ``durable=True``) a value once returned is never
  returned again, even after a power loss;
* a file that does not hold a number raises :class:`SequenceError` naming it: never a reset.

Every directory, sequence, lock and temporary file is created private to the node's user
(``0700``/``0600`` whatever the umask: :mod:`ftpbc.private_files`).

Not guaranteed: values drawn by two sequences in one name are not taken atomically together; a
process killed after the rename but before using its value leaves a gap (values are unique, not
necessarily all used).

Cluster-wide sequences elsewhere: a store built with ``shared=`` (a :class:`SharedSequences`)
hands ``%{0}``-``%{9}`` and ``%{name}`` to it and keeps only ``%0``-``%9`` in ``local_dir``.
``node.coordination: server`` keeps them on the FTP/SFTP server, one file per sequence whose
name holds the value (:mod:`ftpbc.cluster.server`).
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal, Protocol

from filelock import FileLock, Timeout

from ftpbc.errors import SequenceError
from ftpbc.private_files import FILE_MODE, open_private, private_dir, tighten, write_private

SequenceKind = Literal["local", "shared", "global", "transient"]
KINDS: tuple[SequenceKind, ...] = ("local", "shared", "global", "transient")

#: the spec's ``<seq_name> =: (0-9a-zA-Z.-_)+``; "." and ".." are refused separately
SEQUENCE_NAME_RE = re.compile(r"[0-9A-Za-z._-]+")

_ENDPOINT_DIR = "endpoint-sequences"
_GLOBAL_DIR = "sequences"
_ENDPOINT_NAME_FILE = "endpoint"
# '~' is outside the sequence-name alphabet, so these can never collide with a sequence file.
_LOCK_SUFFIX = "~lock"
_TMP_SUFFIX = "~tmp"
_MAX_FILE_BYTES = 64


def check_sequence_name(name: str) -> str:
    """``name`` if it is a valid global sequence name, else :class:`SequenceError`."""
    if not SEQUENCE_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SequenceError(f"sequence name {name!r}: expected 1 or more of 0-9 A-Z a-z . _ - "
                            "(and not '.' or '..')")
    return name


def endpoint_uuid(endpoint: str) -> uuid.UUID:
    """The stable UUID naming ``endpoint``'s sequence directory."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"ftpbc:endpoint:{endpoint}")


@dataclass(frozen=True)
class SequenceInfo:
    """One sequence found on disk by :meth:`SequenceStore.list`."""

    kind: SequenceKind
    #: endpoint name (from the directory's ``endpoint`` file; the UUID if that is missing);
    #: None for global sequences
    endpoint: str | None
    #: counter digit ("0".."9") or global name
    key: str
    #: the file (a remote path for sequences kept on a server)
    path: PurePath
    #: the value the next reference will yield
    value: int

    @property
    def token(self) -> str:
        """How a pattern refers to it: ``%3``, ``%{3}`` or ``%{name}``."""
        return f"%{self.key}" if self.kind == "local" else f"%{{{self.key}}}"


class SharedSequences(Protocol):
    """Where a store keeps its cluster-wide sequences (kinds ``shared`` and ``global``) when not
    in ``shared_dir``.  Same contract as :class:`SequenceStore`'s methods of the same names:
    a value once returned by :meth:`next` is never returned again by any node."""

    def next(self, kind: SequenceKind, endpoint: str | None, key: str) -> int: ...

    def get(self, kind: SequenceKind, endpoint: str | None, key: str) -> int: ...

    def set(self, kind: SequenceKind, endpoint: str | None, key: str, value: int) -> None: ...

    def list(self) -> list[SequenceInfo]: ...

    def location(self, kind: SequenceKind, endpoint: str | None, key: str) -> PurePath:
        """Where the sequence lives (for ``ftpbc seq show``)."""


class _PathLocks:
    """One (thread lock, FileLock) pair per sequence file, for the whole process."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, FileLock]] = {}

    def get(self, path: Path, timeout: float) -> tuple[threading.Lock, FileLock]:
        key = str(path)
        with self._guard:
            pair = self._locks.get(key)
            if pair is None:
                # thread_local=False: the thread lock already gives one thread at a time the object.
                # fallback_to_soft=False: a "soft" existence lock would outlive a SIGKILLed holder.
                # A short poll keeps waiting processes close behind the holder (filelock polls).
                # mode: created 0600 whatever the umask (filelock fchmods a file it creates);
                # one left 0644 by an older version is tightened here, once per process.
                flock = FileLock(f"{key}{_LOCK_SUFFIX}", timeout=timeout, thread_local=False,
                                 poll_interval=0.0005, fallback_to_soft=False, mode=FILE_MODE)
                tighten(Path(f"{key}{_LOCK_SUFFIX}"), FILE_MODE)
                pair = (threading.Lock(), flock)
                self._locks[key] = pair
            return pair

    def reset(self) -> None:
        # A forked child must not inherit a thread lock some other parent thread held at fork time.
        self._guard = threading.Lock()
        self._locks = {}


_LOCKS = _PathLocks()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LOCKS.reset)


def _read_value(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise SequenceError(f"{path}: cannot read sequence: {exc.strerror or exc}") from None
    text = raw.decode("ascii", errors="replace").strip()
    if len(raw) > _MAX_FILE_BYTES or not text.isascii() or not text.isdigit():
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise SequenceError(f"{path}: expected a decimal number (the next value), found {shown!r}")
    return int(text)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SequenceStore:
    """Sequences of one node: ``local_dir`` is this node's own, ``shared_dir`` the cluster's.

    ``durable=False`` skips the fsyncs: a process crash still leaves the old or the new value, but
    a power loss may bring back an old value (for benchmarks and throwaway setups only).
    ``lock_timeout`` bounds the wait for another process's lock (SequenceError after it).
    ``shared``: keep the cluster-wide kinds there instead of in ``shared_dir``.
    """

    def __init__(self, local_dir: str | os.PathLike[str], shared_dir: str | os.PathLike[str], *,
                 durable: bool = True, lock_timeout: float = 30.0,
                 shared: SharedSequences | None = None) -> None:
        self.local_dir = Path(local_dir)
        self.shared_dir = Path(shared_dir)
        self.shared = shared
        self.durable = durable
        self.lock_timeout = lock_timeout
        self._transient_lock = threading.Lock()
        self._transient: dict[tuple[str, str], int] = {}
        # Directories known to exist: a stat per increment is measurable at thousands per second.
        self._made_dirs: set[Path] = set()

    # ----------------------------------------------------------------------------- addressing

    def path(self, kind: SequenceKind, endpoint: str | None, key: str) -> PurePath:
        """The file holding a persisted sequence (transient ones have none)."""
        if self.shared is not None and kind in ("shared", "global"):
            return self.shared.location(kind, endpoint, key)
        return self._path(kind, endpoint, key)

    def _path(self, kind: SequenceKind, endpoint: str | None, key: str) -> Path:
        if kind == "global":
            return self.shared_dir / _GLOBAL_DIR / check_sequence_name(key)
        if kind not in ("local", "shared"):
            raise SequenceError(f"{kind} sequence {key!r} has no file")
        if not endpoint:
            raise SequenceError(f"{kind} sequence {key!r} needs an endpoint name")
        if len(key) != 1 or not key.isdigit():
            raise SequenceError(f"{kind} sequence of endpoint {endpoint!r}: expected a digit 0-9, "
                                f"got {key!r}")
        base = self.local_dir if kind == "local" else self.shared_dir
        return base / _ENDPOINT_DIR / str(endpoint_uuid(endpoint)) / f"sequence{key}"

    # ----------------------------------------------------------------------------- operations

    def next(self, kind: SequenceKind, endpoint: str | None, key: str) -> int:
        """The sequence's current value, after which it holds that value plus one."""
        if kind == "transient":
            return self._next_transient(endpoint or "", key)
        if self.shared is not None and kind in ("shared", "global"):
            return self.shared.next(kind, endpoint, key)
        return self._update(kind, endpoint, key, None)

    def get(self, kind: SequenceKind, endpoint: str | None, key: str) -> int:
        """The value the next reference will yield (0 for a fresh sequence); no lock taken."""
        if kind == "transient":
            with self._transient_lock:
                return self._transient.get((endpoint or "", key), 0)
        if self.shared is not None and kind in ("shared", "global"):
            return self.shared.get(kind, endpoint, key)
        return _read_value(self._path(kind, endpoint, key))

    def set(self, kind: SequenceKind, endpoint: str | None, key: str, value: int) -> None:
        """Make the next reference yield ``value`` (under the same locks as :meth:`next`)."""
        if value < 0:
            raise SequenceError(f"sequence {key!r}: value must be 0 or more, got {value}")
        if kind == "transient":
            with self._transient_lock:
                self._transient[(endpoint or "", key)] = value
            return
        if self.shared is not None and kind in ("shared", "global"):
            self.shared.set(kind, endpoint, key, value)
            return
        self._update(kind, endpoint, key, value)

    def list(self) -> list[SequenceInfo]:
        """Every persisted sequence found on disk, endpoint ones first, sorted."""
        found: list[SequenceInfo] = []
        bases = [("local", self.local_dir)] + ([("shared", self.shared_dir)] if self.shared is None else [])
        for kind, base in bases:
            root = base / _ENDPOINT_DIR
            for ep_dir in sorted(root.iterdir()) if root.is_dir() else []:
                name_file = ep_dir / _ENDPOINT_NAME_FILE
                try:
                    endpoint = name_file.read_text(encoding="utf-8").strip() or ep_dir.name
                except OSError:
                    endpoint = ep_dir.name
                for digit in "0123456789":
                    path = ep_dir / f"sequence{digit}"
                    if path.exists():
                        found.append(SequenceInfo(kind, endpoint, digit, path,  # type: ignore[arg-type]
                                                  _read_value(path)))
        if self.shared is not None:
            listed = self.shared.list()
            return ([i for i in found if i.kind == "local"] + [i for i in listed if i.kind == "shared"]
                    + [i for i in listed if i.kind == "global"])
        global_dir = self.shared_dir / _GLOBAL_DIR
        for path in sorted(global_dir.iterdir()) if global_dir.is_dir() else []:
            if SEQUENCE_NAME_RE.fullmatch(path.name) and path.is_file():
                found.append(SequenceInfo("global", None, path.name, path, _read_value(path)))
        return found

    # ----------------------------------------------------------------------------- internals

    def _next_transient(self, endpoint: str, key: str) -> int:
        with self._transient_lock:
            value = self._transient.get((endpoint, key), 0)
            self._transient[(endpoint, key)] = value + 1
            return value

    def _update(self, kind: SequenceKind, endpoint: str | None, key: str, new: int | None) -> int:
        """Under both locks: read, write ``new`` (or read + 1), return what was read."""
        path = self._path(kind, endpoint, key)
        thread_lock, file_lock = _LOCKS.get(path, self.lock_timeout)
        with thread_lock:
            self._ensure_dir(path.parent, endpoint if kind != "global" else None)
            try:
                file_lock.acquire()
            except Timeout:
                raise SequenceError(f"{path}: could not lock {path}{_LOCK_SUFFIX} within "
                                    f"{self.lock_timeout:g} s (another process holds it)") from None
            except OSError as exc:
                raise SequenceError(f"{path}: cannot lock: {exc.strerror or exc}") from None
            try:
                current = _read_value(path)
                self._write(path, current + 1 if new is None else new)
                return current
            finally:
                file_lock.release()

    def _ensure_dir(self, directory: Path, endpoint: str | None) -> None:
        if directory in self._made_dirs:
            return
        try:
            existed = directory.is_dir()
            # 0700 whatever the umask (and tightened if it exists): who can write a sequence file
            # can make two messages get one name
            private_dir(directory)
            if endpoint is not None and not existed:
                write_private(directory / _ENDPOINT_NAME_FILE, (endpoint + "\n").encode())
            self._made_dirs.add(directory)
        except OSError as exc:
            raise SequenceError(f"{directory}: cannot create sequence directory: "
                                f"{exc.strerror or exc}") from None

    def _write(self, path: Path, value: int) -> None:
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, f"{value}\n".encode("ascii"))
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if self.durable:
                # Without this the rename may be lost on power failure and the old value come back.
                _fsync_dir(path.parent)
        except OSError as exc:
            raise SequenceError(f"{path}: cannot write sequence: {exc.strerror or exc}") from None
