"""The server's clock, as a process of ``coordination: server`` sees it (package docstring:
"Clocks"), and how long this process has been looking at a time it cannot check."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime

log = logging.getLogger("ftpbc.cluster")

#: how long a clock estimate is trusted before it is measured again (the heartbeat measures it
#: at every beat; this is for processes that do not beat)
CLOCK_RESYNC = 300.0
#: how far two processes' estimates of the server's clock may differ (an mtime's whole second,
#: plus an upload's round trip): a claimed time is believed up to this far past what it may be
CLOCK_SLACK = 2.0


def server_seconds(mtime: datetime) -> float:
    """A listing's mtime as seconds: whole seconds (FTP, SFTP) stand for the middle of that second."""
    return mtime.timestamp() + (0.5 if mtime.microsecond == 0 else 0.0)


class ServerClock:
    """The server's clock as seen from this process: this host's time plus a measured offset."""

    def __init__(self, probe: Callable[[], tuple[datetime | None, float, float]], *,
                 host_time: Callable[[], float] = time.time) -> None:
        self._probe = probe
        #: this host's clock (seconds since 1970)
        self.host_time = host_time
        self._offset: float | None = None
        self._measured = -CLOCK_RESYNC
        self._lock = threading.Lock()
        self._warned = False

    def sample(self, mtime: datetime | None, before: float, after: float) -> None:
        """A file was written between ``before`` and ``after`` (this host's time) and the server
        gave it ``mtime``."""
        if mtime is None:
            if not self._warned:
                self._warned = True
                log.warning("the coordination server gives no file times: using this host's clock, "
                            "so the hosts' clocks must agree (see docs/cluster.md)")
            offset = 0.0
        else:
            offset = server_seconds(mtime) - (before + after) / 2
        with self._lock:
            self._offset = offset
            self._measured = time.monotonic()

    def now(self) -> float:
        """The server's time now, in seconds since 1970."""
        if self._offset is None or time.monotonic() - self._measured > CLOCK_RESYNC:
            self.sample(*self._probe())
        return self.host_time() + (self._offset or 0.0)

    @property
    def offset(self) -> float | None:
        """Server minus this host, in seconds (None before the first measurement)."""
        return self._offset


class FirstSeen:
    """When this process first saw each of a set of claims, on the server's clock.

    A time written by someone else (a lock's expiry in its name, a heartbeat's mtime) is a
    claim; one too far in the future cannot be checked against the clock, only against how long
    this process has been looking at it.  Per process: a process that starts anew starts
    counting anew.  Bounded: past ``limit`` claims the oldest are forgotten (counted anew).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        return key in self._seen

    def at(self, key: str, now: float) -> float:
        """When ``key`` was first seen; ``now`` if this is the first time."""
        with self._lock:
            first = self._seen.get(key)
            if first is None:
                while len(self._seen) >= self.limit:
                    del self._seen[next(iter(self._seen))]
                first = self._seen[key] = now
            return first

    def forget(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def keep(self, keys: Iterable[str]) -> None:
        """Forget every claim but ``keys`` (those still in sight)."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._seen if k not in wanted]:
                del self._seen[key]

