"""The coordination directory on the server, as one process of ``coordination: server`` reaches
it: the transport, this process's identity (node id and run), the server's clock, and the few
writes every part makes (a directory made once, a small file put)."""

from __future__ import annotations

import io
import os
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime

from ftpbc.cluster.server.clock import ServerClock
from ftpbc.cluster.server.names import HOST
from ftpbc.errors import NotFound
from ftpbc.transport.base import Entry, Transport


class ServerArea:
    """``directory`` on the server behind ``transport``, for node ``node_id``.

    The base of :class:`~ftpbc.cluster.server.coordination.ServerCoordination`: what the
    heartbeats, locks and sequences built on it share.  Thread-safe.
    """

    def __init__(self, transport: Transport, directory: str, node_id: str, lease: float, *,
                 lock_expiry: float = 10.0, display: str | None = None,
                 host_time: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.dir = "/" + "/".join(p for p in directory.split("/") if p)
        self.node_id = node_id
        self.lease = lease
        self.lock_expiry = lock_expiry
        #: this process among the runs of this node id (a restarted node takes its locks back)
        self.run = secrets.token_hex(3)
        self.display = display or f"{transport.server}{self.dir}"
        self.clock = ServerClock(self._probe_clock, host_time=host_time)
        self._made: set[str] = set()
        self._made_lock = threading.Lock()

    def ensure_dir(self, path: str) -> None:
        """mkdir once per process."""
        if path in self._made:
            return
        self.transport.mkdir(path)
        with self._made_lock:
            self._made.add(path)

    def listing(self, directory: str) -> list[Entry]:
        """The entries of ``directory``, created if missing (then empty)."""
        try:
            return self.transport.list(directory)
        except NotFound:
            self.ensure_dir(directory)
            return []

    def put_bytes(self, path: str, data: bytes) -> None:
        """Write a small file, its directory made first (once per process: servers answer a put
        into a missing directory variously, vsftpd with 553)."""
        self.ensure_dir(path.rsplit("/", 1)[0] or "/")
        self.transport.put(path, io.BytesIO(data))

    def _probe_clock(self) -> tuple[datetime | None, float, float]:
        path = f"{self.dir}/clock/{self.node_id}"
        before = self.clock.host_time()
        self.put_bytes(path, f"{os.getpid()} {before:.3f} {HOST}\n".encode("ascii", "replace"))
        after = self.clock.host_time()
        return self.transport.stat(path).mtime, before, after
