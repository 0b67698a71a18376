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

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

_thread_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _registry_lock:
        return _thread_locks.setdefault(key, threading.Lock())


class PollLock:
    """Try-lock for one endpoint.  ``mode="none"`` keeps only the thread lock."""

    def __init__(self, state_dir: Path, endpoint: str, mode: str) -> None:
        path = Path(state_dir) / "locks" / f"{endpoint}.lock"
        self._tlock = _thread_lock(str(path.resolve()))
        self._flock: FileLock | None = None
        if mode == "file":
            path.parent.mkdir(parents=True, exist_ok=True)
            # thread_local=False: the lock is taken and released by the same poller thread,
            # but the T_LOCK already excludes other threads, so per-thread state adds nothing.
            self._flock = FileLock(str(path), thread_local=False)

    @contextmanager
    def attempt(self, wait: float = 0.0) -> Iterator[bool]:
        """Yield True while both locks are held, False (holding nothing) if either is busy."""
        got = self._tlock.acquire(timeout=wait) if wait > 0 else self._tlock.acquire(blocking=False)
        if not got:
            yield False
            return
        try:
            if self._flock is not None:
                try:
                    self._flock.acquire(timeout=wait)
                except Timeout:
                    yield False
                    return
                try:
                    yield True
                finally:
                    self._flock.release()
            else:
                yield True
        finally:
            self._tlock.release()
