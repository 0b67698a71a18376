"""The poll lock of the FTP BC spec: a thread lock (T_LOCK) plus a file lock (F_LOCK).

T_LOCK serialises the pollers of one endpoint inside one process; F_LOCK, a file in the shared
``state_dir``, serialises them across processes and hosts.  Both are *tried*, never waited for:
a poller that cannot get them skips its turn, as in the spec, because another poller is already
listing and claiming for this endpoint.

What the file lock needs on NFS: working POSIX locks (NFSv4, or NFSv3 with lockd).  Without
them every poller gets the lock and the endpoint degrades to ``lock: none``: still correct (a
claim is a rename, and exactly one rename of a file wins), only wasteful in lost claim races.

With ``node.coordination: server`` (no shared filesystem) the F_LOCK is a token file on the
FTP/SFTP server instead (:class:`~ftpbc.cluster.server.ServerLock`); the T_LOCK stays.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from ftpbc.cluster.heartbeat import is_dead
from ftpbc.private_files import open_private, private_dir

#: how long a dead-holder verdict stands, as a share of the lease (at most a second)
HOLDER_RECHECK = 0.1

log = logging.getLogger("ftpbc.locks")

_thread_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _registry_lock:
        return _thread_locks.setdefault(key, threading.Lock())


class CrossLock(Protocol):
    """The part of a poll lock that serialises processes and hosts (F_LOCK, or its stand-in on a
    server: see :mod:`ftpbc.cluster.server`).  Called under the T_LOCK only."""

    def acquire(self, wait: float) -> bool:
        """Take it, trying for ``wait`` seconds; False if another holder has it."""

    def release(self) -> None:
        """Give back what :meth:`acquire` took (never raises: a failure is logged)."""

    def bypass(self) -> bool:
        """After a failed :meth:`acquire`: may this poller go ahead anyway (a dead holder)?"""

    def close(self) -> None:
        """Free local resources (descriptors); the lock is not held."""


class PollLock:
    """Try-lock for one endpoint: the T_LOCK, plus a :class:`CrossLock` unless ``mode="none"``.

    Built from ``state_dir`` as below (the file lock), or by a
    :class:`~ftpbc.cluster.coordination.Coordination` with :meth:`over` (the server lock).

    With ``holder`` (this node's id) and ``lease``, the node that takes the file lock records its
    id beside it; a poller that finds the lock busy and its holder dead (no heartbeat younger
    than the lease: killed without its lock being released, as on a hung NFS client, or stopped)
    goes ahead without the file lock.  That is safe because the lock never guarded correctness,
    only efficiency: a claim is a rename, and exactly one rename of a file wins.  Without this, one
    frozen process holding the lock would stall the endpoint on every node.
    """

    def __init__(self, state_dir: Path, endpoint: str, mode: str, *, holder: str | None = None,
                 lease: float | None = None) -> None:
        path = Path(state_dir) / "locks" / f"{endpoint}.lock"
        cross = FileCrossLock(Path(state_dir), path, holder=holder, lease=lease) if mode == "file" else None
        self._setup(str(path.resolve()), cross)

    @classmethod
    def over(cls, key: str, cross: CrossLock | None) -> PollLock:
        """A poll lock whose T_LOCK is named ``key`` (one per process) and whose cross-process
        part is ``cross`` (None: the T_LOCK alone, ``lock: none``)."""
        lock = cls.__new__(cls)
        lock._setup(key, cross)
        return lock

    def _setup(self, key: str, cross: CrossLock | None) -> None:
        self._tlock = _thread_lock(key)
        self.cross = cross

    @contextmanager
    def attempt(self, wait: float = 0.0) -> Iterator[bool]:
        """Yield True while both locks are held (or the cross lock's holder is dead), else False."""
        got = self._tlock.acquire(timeout=wait) if wait > 0 else self._tlock.acquire(blocking=False)
        if not got:
            yield False
            return
        try:
            cross = self.cross
            if cross is None:
                yield True
                return
            if not cross.acquire(wait):
                yield cross.bypass()
                return
            try:
                yield True
            finally:
                cross.release()
        finally:
            self._tlock.release()

    def close(self) -> None:
        """Close the lock file now rather than when this object is dropped."""
        if self.cross is not None:
            self.cross.close()


class FileCrossLock:
    """F_LOCK: ``flock`` on ``<state_dir>/locks/<endpoint>.lock``, its holder named beside it in
    ``<endpoint>.holder`` (see :class:`PollLock` for the dead-holder rule)."""

    def __init__(self, state_dir: Path, path: Path, *, holder: str | None = None,
                 lease: float | None = None) -> None:
        self.state_dir = state_dir
        self._path = path
        self._holder_path = self._path.with_suffix(".holder")
        self._holder = holder
        self._lease = lease
        self._fd: int | None = None
        self._fd_pid = 0
        self._finalizer: Callable[[], object] | None = None
        self._hfd: int | None = None
        self._hfd_pid = 0
        self._hfd_finalizer: Callable[[], object] | None = None
        self._warned: str | None = None
        #: the last dead-holder verdict, and until when it stands
        self._verdict = False
        self._verdict_until = float("-inf")
        # 0700 (and state_dir itself, when created here): a local user who could write the lock
        # or holder file could stall an endpoint or make a live holder look dead
        private_dir(self._path.parent)

    def acquire(self, wait: float) -> bool:
        if not self._lock_file(wait):
            return False
        self._record_holder()
        return True

    def release(self) -> None:
        fcntl.flock(self._lock_fd(), fcntl.LOCK_UN)

    def bypass(self) -> bool:
        return self._holder_is_dead()

    def _lock_fd(self) -> int:
        """The lock file, opened once per process (a forked child opens its own: a flock belongs
        to the open file, which a child would otherwise share with its parent)."""
        pid = os.getpid()
        if self._fd is None or self._fd_pid != pid:
            self._fd = open_private(self._path, os.O_RDWR)
            self._fd_pid = pid
            # Closed when this lock is dropped (a node stopped), so that processes starting many
            # nodes (the tests) do not run out of descriptors.
            self._finalizer = weakref.finalize(self, _close_quietly, self._fd)
        return self._fd

    def _lock_file(self, wait: float) -> bool:
        """flock the lock file, trying for ``wait`` seconds; False if another process holds it.

        A flock on a descriptor kept open, not filelock.FileLock, which opens, locks, unlocks and
        closes the file on every poll, many times the cost of the flock alone; the lock is the
        same kind, so the two interoperate.  On NFS, Linux maps flock to POSIX locks (NFSv4, or
        lockd).
        """
        fd = self._lock_fd()
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(0.01, max(deadline - time.monotonic(), 0.0)))

    def _record_holder(self) -> None:
        """Name this node in the holder file, unless it already does.

        Read and compared under the lock (only a holder writes the file), and when another node
        held the lock since, overwritten in place with one write, padded with spaces to the old
        length, never truncated: opening it with O_TRUNC on every poll would make ext4 flush the
        file at each close, in the poller thread that bounds a node's consume rate; and a reader
        sees the old name or the new one, never an empty file.
        """
        if self._holder is None:
            return
        want = self._holder.encode("ascii")
        fd = self._holder_fd()
        if fd is None:
            return  # only the dead-holder bypass needs it; the lock itself is held
        try:
            old = os.pread(fd, 4096, 0)
            if old.strip() != want:
                os.pwrite(fd, want.ljust(len(old)), 0)
        except OSError:
            pass

    def _holder_fd(self) -> int | None:
        """The holder file, opened once per process as the lock file is (an open and a close
        per poll cost more than the read that is left); None if it cannot be opened."""
        pid = os.getpid()
        if self._hfd is None or self._hfd_pid != pid:
            try:
                self._hfd = open_private(self._holder_path, os.O_RDWR)
            except OSError:
                return None
            self._hfd_pid = pid
            self._hfd_finalizer = weakref.finalize(self, _close_quietly, self._hfd)
        return self._hfd

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        if self._hfd_finalizer is not None:
            self._hfd_finalizer()
        self._fd = self._hfd = None

    def _holder_is_dead(self) -> bool:
        """Whether the lock's holder looks dead, judged at most once per HOLDER_RECHECK of the
        lease: with several nodes polling one endpoint the lock is busy on most tries, and
        reading the holder file and its heartbeat on each one cost a node's poller more than
        its claims.  A holder dies over a lease, so a verdict a tenth of it old (at most a
        second) changes nothing that matters; a bypass taken on a stale verdict is a poll
        without the file lock, which the lock never guarded correctness against."""
        if self._holder is None or self._lease is None:
            return False
        now = time.monotonic()
        if now < self._verdict_until:
            return self._verdict
        self._verdict = self._judge_holder()
        self._verdict_until = now + min(HOLDER_RECHECK * self._lease, 1.0)
        return self._verdict

    def _judge_holder(self) -> bool:
        assert self._lease is not None
        fd = self._holder_fd()
        if fd is None:
            return False
        try:
            holder = os.pread(fd, 4096, 0).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return False
        if not holder or holder == self._holder or not is_dead(self.state_dir, holder, self._lease):
            return False
        if self._warned != holder:
            self._warned = holder
            log.warning("%s is held by node %s, which looks dead; polling without it",
                        self._holder_path.with_suffix(".lock"), holder)
        return True


def _close_quietly(fd: int) -> None:
    with suppress(OSError):
        os.close(fd)
