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

* increments are serialised across threads and processes or nodes (``flock`` on
  ``<file>~lock`` through filelock, which NFS turns into a POSIX byte-range lock served by lockd
  or NFSv4: without working locks two nodes can hand out the same value);
* draws of one file that wait at the same moment in one process are carried out together, as a
  batch (group commit): one thread takes the lock, reads ``v``, writes ``v + n`` and hands the
  ``n`` waiting threads ``v`` .. ``v + n - 1``, in the order they asked.  So every value is
  still drawn while its caller waits, values are handed out in the order of the writes that
  reserved them, across threads, processes and nodes, and none is skipped without a failure;
* the new value is written to ``<file>~tmp``, fsynced, renamed over the file and the directory
  fsynced before any value of the batch is returned, so a crash at any point leaves the old or
  the new value, never an empty or torn file, and (with ``durable=True``) a value once returned
  is never returned again, even after a power loss;
* a file that does not hold a number raises :class:`SequenceError` naming it: never a reset;
* a thread waits for another process's lock at most ``lock_timeout``, and for the batches of
  other threads of its process at most ``2 * lock_timeout`` plus ten seconds (SequenceError).

Every directory, sequence, lock and temporary file is created private to the node's user
(``0700``/``0600`` whatever the umask: :mod:`ftpbc.private_files`).

Not guaranteed: values drawn by two sequences in one name are not taken atomically together;
gaps are allowed, duplicates never: a process killed after the rename but before using its
values (a whole batch's), a batch whose write failed after the rename, or a thread that gave up
waiting for its batch leaves values never used (values are unique, not necessarily all used).

Cluster-wide sequences elsewhere: a store built with ``shared=`` (a :class:`SharedSequences`)
hands ``%{0}``-``%{9}`` and ``%{name}`` to it and keeps only ``%0``-``%9`` in ``local_dir``.
``node.coordination: server`` keeps them on the FTP/SFTP server, one file per sequence whose
name holds the value (:mod:`ftpbc.cluster.server`).
"""

from __future__ import annotations

import os
import re
import threading
import time
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
#: seconds a batch's reads, writes and fsyncs may take, beyond its lock wait, before the threads
#: waiting for it give up (see SequenceStore._update)
_IO_ALLOWANCE = 10.0


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


@dataclass(eq=False)
class _Ticket:
    """One thread's draw (``set_to`` None) or set, waiting for a batch to carry it out."""

    set_to: int | None
    durable: bool
    #: the value the sequence held before the batch: what a draw yields
    value: int | None = None
    #: in a batch being carried out (no longer in the queue)
    taken: bool = False
    error: SequenceError | None = None
    done: bool = False


class _Group:
    """The draws and sets of one sequence file waiting in this process.

    One waiting thread at a time, the leader, takes the queue's head as a batch (every draw up
    to the next set, or one set), runs it under the file lock and answers each ticket of it;
    the others wait on ``cond`` for their answer or their turn to lead.  The queue holds at most
    one ticket per waiting thread.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.queue: list[_Ticket] = []
        self.busy = False

    def take(self) -> list[_Ticket]:
        """The next batch, removed from the queue (under ``cond``)."""
        if self.queue[0].set_to is not None:
            batch = self.queue[:1]
        else:
            n = next((i for i, t in enumerate(self.queue) if t.set_to is not None), len(self.queue))
            batch = self.queue[:n]
        del self.queue[:len(batch)]
        return batch


#: the tickets one leader carries out together (a module name: SequenceStore has a ``list`` method)
_Batch = list[_Ticket]
_Values = list[int]


class _PathLocks:
    """One (group of waiting draws, FileLock) pair per sequence file, for the whole process."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[_Group, FileLock]] = {}

    def get(self, path: Path, timeout: float) -> tuple[_Group, FileLock]:
        key = str(path)
        with self._guard:
            pair = self._locks.get(key)
            if pair is None:
                # thread_local=False: only a group's leader, one thread at a time, takes it.
                # fallback_to_soft=False: a "soft" existence lock would outlive a SIGKILLed holder.
                # A short poll keeps waiting processes close behind the holder (filelock polls).
                # mode: created 0600 whatever the umask (filelock fchmods a file it creates);
                # one left 0644 by an older version is tightened here, once per process.
                flock = FileLock(f"{key}{_LOCK_SUFFIX}", timeout=timeout, thread_local=False,
                                 poll_interval=0.0005, fallback_to_soft=False, mode=FILE_MODE)
                tighten(Path(f"{key}{_LOCK_SUFFIX}"), FILE_MODE)
                pair = (_Group(), flock)
                self._locks[key] = pair
            return pair

    def reset(self) -> None:
        # A forked child must not inherit a group some other parent thread was leading at fork time.
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
    ``lock_timeout`` bounds the wait for another process's lock (SequenceError after it), and,
    doubled plus ten seconds, a thread's wait for the batches of other threads of this process.
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
        """Draw (``new`` None: the file's value, the file then holding one more) or set ``new``
        (the value it replaced); what is returned was on disk before, its successor after.

        Concurrent draws of one file in this process share one batch: one lock take, one read,
        one write and its fsyncs for all of them, each handed its own value of the block the
        batch wrote past.  A thread waits for other threads' batches at most ``2 * lock_timeout``
        plus :data:`_IO_ALLOWANCE` seconds (SequenceError after, and a value its batch drew
        meanwhile is skipped, never handed out).
        """
        path = self._path(kind, endpoint, key)
        group, file_lock = _LOCKS.get(path, self.lock_timeout)
        ticket = _Ticket(new, self.durable)
        wait = 2 * self.lock_timeout + _IO_ALLOWANCE
        deadline = time.monotonic() + wait
        with group.cond:
            group.queue.append(ticket)
        while True:
            with group.cond:
                while (group.busy or ticket.taken) and not ticket.done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if not ticket.taken:
                            group.queue.remove(ticket)
                        raise SequenceError(
                            f"{path}: no draw finished within {wait:g} s (another thread of this "
                            "process holds the sequence: its lock or its disk is stuck)"
                            + ("; the value drawn for this call is skipped" if ticket.taken else ""))
                    group.cond.wait(left)
                if ticket.done:
                    if ticket.error is not None:
                        raise ticket.error
                    assert ticket.value is not None
                    return ticket.value
                batch = group.take()  # this thread leads the next batch
                for t in batch:
                    t.taken = True
                group.busy = True
            self._lead(group, path, kind, endpoint, file_lock, batch)

    def _lead(self, group: _Group, path: Path, kind: SequenceKind, endpoint: str | None,
              file_lock: FileLock, batch: _Batch) -> None:
        """Carry out ``batch`` and answer every ticket of it, also when it fails (each then gets
        the same SequenceError; another exception is re-raised after).

        The group is free for the next batch as soon as the file lock is released, before the
        directory fsync that makes this batch's rename durable: the next batch reads the value
        this one wrote and its own directory fsync covers both renames, and no value of this
        batch is handed out before this batch's directory fsync completed.
        """
        error: SequenceError | None = None
        values: _Values = []
        durable = any(t.durable for t in batch)
        try:
            try:
                values = self._reserve(path, kind, endpoint, file_lock, batch, durable)
            except SequenceError as exc:
                error = exc
            finally:
                with group.cond:
                    group.busy = False
                    group.cond.notify_all()
            if error is None and durable:
                try:
                    # Without this the rename may be lost on power failure and the old value
                    # come back.
                    _fsync_dir(path.parent)
                except OSError as exc:
                    error = SequenceError(f"{path}: cannot write sequence: {exc.strerror or exc}")
        except BaseException as exc:
            error = SequenceError(f"{path}: the draw failed: {exc!r}")
            raise
        finally:
            # A batch that failed after its rename leaves its values unused: a gap, never a repeat.
            with group.cond:
                for i, t in enumerate(batch):
                    t.value, t.error = (values[i], None) if error is None else (None, error)
                    t.done = True
                group.cond.notify_all()

    def _reserve(self, path: Path, kind: SequenceKind, endpoint: str | None, file_lock: FileLock,
                 batch: _Batch, durable: bool) -> _Values:
        """Under the file lock: read the value, write past ``batch``'s draws (or its set) and
        rename it over; the values of ``batch``, in order."""
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
            set_to = batch[0].set_to
            self._write(path, current + len(batch) if set_to is None else set_to, durable)
        finally:
            file_lock.release()
        return [current] if set_to is not None else list(range(current, current + len(batch)))

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

    def _write(self, path: Path, value: int, durable: bool) -> None:
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, f"{value}\n".encode("ascii"))
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)  # the directory is fsynced by the caller, after the lock
        except OSError as exc:
            raise SequenceError(f"{path}: cannot write sequence: {exc.strerror or exc}") from None
