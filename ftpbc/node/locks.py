"""The poll lock of the FTP BC spec: a thread lock (T_LOCK) plus a file lock (F_LOCK).

T_LOCK serialises the pollers of one endpoint inside one process; F_LOCK, a file in the shared
``state_dir``, serialises them across processes and hosts.  Both are *tried*, never waited for:
a poller that cannot get them skips its turn, as in the spec, because another poller is already
listing and claiming for this endpoint.

What the file lock needs on NFS: working POSIX locks (NFSv4, or NFSv3 with lockd).  Without
them every poller gets the lock and the endpoint degrades to ``lock: none``: still correct (a
claim is a rename, and exactly one rename of a file wins), only wasteful in lost claim races.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from ftpbc.node.heartbeat import is_dead

log = logging.getLogger("ftpbc.locks")

_thread_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _registry_lock:
        return _thread_locks.setdefault(key, threading.Lock())


class PollLock:
    """Try-lock for one endpoint.  ``mode="none"`` keeps only the thread lock.

    With ``holder`` (this node's id) and ``lease``, the node that takes the file lock records its
    id beside it; a poller that finds the lock busy and its holder dead (no heartbeat younger
    than the lease: killed without its lock being released, as on a hung NFS client, or stopped)
    goes ahead without the file lock.  That is safe because the lock never guarded correctness,
    only efficiency: a claim is a rename, and exactly one rename of a file wins.  Without this, one
    frozen process holding the lock would stall the endpoint on every node.
    """

    def __init__(self, state_dir: Path, endpoint: str, mode: str, *, holder: str | None = None,
                 lease: float | None = None) -> None:
        self.state_dir = Path(state_dir)
        path = self.state_dir / "locks" / f"{endpoint}.lock"
        self._holder_path = path.with_suffix(".holder")
        self._holder = holder
        self._lease = lease
        self._tlock = _thread_lock(str(path.resolve()))
        self._flock: FileLock | None = None
        self._warned: str | None = None
        if mode == "file":
            path.parent.mkdir(parents=True, exist_ok=True)
            # thread_local=False: the lock is taken and released by the same poller thread,
            # but the T_LOCK already excludes other threads, so per-thread state adds nothing.
            self._flock = FileLock(str(path), thread_local=False)

    @contextmanager
    def attempt(self, wait: float = 0.0) -> Iterator[bool]:
        """Yield True while both locks are held (or the file lock's holder is dead), else False."""
        got = self._tlock.acquire(timeout=wait) if wait > 0 else self._tlock.acquire(blocking=False)
        if not got:
            yield False
            return
        try:
            if self._flock is None:
                yield True
                return
            try:
                self._flock.acquire(timeout=wait)
            except Timeout:
                yield self._holder_is_dead()
                return
            try:
                self._record_holder()
                yield True
            finally:
                self._flock.release()
        finally:
            self._tlock.release()

    def _record_holder(self) -> None:
        if self._holder is None:
            return
        try:
            self._holder_path.write_text(self._holder, encoding="ascii")
        except OSError:
            pass  # only the dead-holder bypass needs it; the lock itself is held

    def _holder_is_dead(self) -> bool:
        if self._holder is None or self._lease is None:
            return False
        try:
            holder = self._holder_path.read_text(encoding="ascii").strip()
        except OSError:
            return False
        if not holder or holder == self._holder or not is_dead(self.state_dir, holder, self._lease):
            return False
        if self._warned != holder:
            self._warned = holder
            log.warning("%s is held by node %s, which looks dead; polling without it",
                        self._holder_path.with_suffix(".lock"), holder)
        return True
