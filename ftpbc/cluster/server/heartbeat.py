"""Heartbeats on the coordination server: this node's beat, and every node's read back (package
docstring: "Clocks"; the ``state_dir`` side is :mod:`ftpbc.cluster.heartbeat`)."""

from __future__ import annotations

import io
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.coordination import Health
from ftpbc.cluster.heartbeat import Heartbeat, HeartbeatInfo, beat_info, process_alive
from ftpbc.cluster.server.area import ServerArea
from ftpbc.cluster.server.clock import CLOCK_SLACK, FirstSeen, server_seconds
from ftpbc.cluster.server.names import HOST, beat_stamp
from ftpbc.errors import FtpbcError, NotFound
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.cluster")

_DIGITS_RE = re.compile(r"[0-9]{1,9}")


class ServerHeartbeats(ServerArea):
    """The heartbeat files in ``heartbeats/``, read on the server's clock: whose beat is how old,
    who is dead, who else runs this node id."""

    def __init__(self, transport: Transport, directory: str, node_id: str, lease: float, *,
                 lock_expiry: float = 10.0, display: str | None = None,
                 host_time: Callable[[], float] = time.time) -> None:
        super().__init__(transport, directory, node_id, lease, lock_expiry=lock_expiry,
                         display=display, host_time=host_time)
        self._future_beats = FirstSeen()

    def heartbeat_path(self, node_id: str) -> str:
        return f"{self.dir}/heartbeats/{node_id}"

    def heartbeat_age(self, node_id: str) -> float | None:
        """Seconds since ``node_id``'s last beat on the server's clock; None if it has none
        younger than the lease (dead)."""
        try:
            entry = self.transport.stat(self.heartbeat_path(node_id))
        except NotFound:
            return None
        # A server without file times: the beat's own estimate of the server's time.
        stamp = server_seconds(entry.mtime) if entry.mtime is not None else self._written_at(node_id)
        age = self._age(node_id, stamp, self.clock.now())
        return None if age > self.lease else age

    def _age(self, node_id: str, stamp: float, now: float) -> float:
        """A beat's age from the time the server (or, without file times, the beat itself) gives
        it.  A time in the future by more than :data:`CLOCK_SLACK` was not given by a beat (an
        mtime set by hand, a forged line): it counts as written when this process first saw it,
        so it goes stale after the lease like any other beat, however far ahead it claims to be.
        A node that beats again gives its file a time that is not in the future, which ends the
        count.  Counted per node, not per time claimed: a listing and a stat may show the same
        file's time differently (a listing's date alone, for a date far ahead)."""
        if stamp > now + CLOCK_SLACK:
            return now - self._future_beats.at(node_id, now)
        self._future_beats.forget(node_id)
        return max(now - stamp, 0.0)

    def _written_at(self, node_id: str) -> float:
        buf = io.BytesIO()
        try:
            self.transport.get(self.heartbeat_path(node_id), buf)
        except NotFound:
            return 0.0
        return beat_stamp(buf.getvalue().decode("ascii", "replace"))

    def heartbeats(self) -> list[HeartbeatInfo]:
        """Every heartbeat file in ``heartbeats/``, alive or dead; ages on the server's clock.
        Reading them may write ``clock/<node-id>`` (to learn the server's clock), nothing else."""
        try:
            entries = self.transport.list(f"{self.dir}/heartbeats")
        except NotFound:
            return []
        now = self.clock.now()
        out: list[HeartbeatInfo] = []
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir or e.name.startswith("."):
                continue
            text = self._read_beat(e.name)
            if text is None:
                continue  # removed since the listing: a node that stopped cleanly
            # A server without file times: the beat's own estimate of the server's time.
            stamp = server_seconds(e.mtime) if e.mtime is not None else beat_stamp(text)
            out.append(beat_info(e.name, text, self._age(e.name, stamp, now), self.lease, host_field=3))
        return out

    def _read_beat(self, node_id: str) -> str | None:
        """A heartbeat file's text; None if it is gone.  A beat is put over the file in place
        (not staged), so a read may catch it half written: a whole one ends with a line break,
        and a torn one is read again (the next beat is an interval away, the write milliseconds)."""
        text = ""
        for _ in range(3):
            buf = io.BytesIO()
            try:
                self.transport.get(self.heartbeat_path(node_id), buf)
            except NotFound:
                return None
            text = buf.getvalue().decode("ascii", "replace")
            if text.endswith("\n"):
                break
        return text

    def live_elsewhere(self) -> str | None:
        """Who else runs this node id (a live heartbeat from another host or process), as a
        sentence; None if nobody does (or the server cannot tell yet)."""
        path = self.heartbeat_path(self.node_id)
        try:
            age = self.heartbeat_age(self.node_id)
            if age is None:
                return None
            buf = io.BytesIO()
            self.transport.get(path, buf)
        except FtpbcError:
            return None
        fields = buf.getvalue().decode("ascii", "replace").split()
        pid = int(fields[0]) if fields and _DIGITS_RE.fullmatch(fields[0]) else 0
        host = fields[3] if len(fields) > 3 else "?"
        if host == HOST and (pid == os.getpid() or not process_alive(pid)):
            return None
        where = f"host {host}" if host != HOST else f"process {pid} of this host"
        return (f"node id {self.node_id!r} is live on {where} (heartbeat {age:.0f} s ago in "
                f"{self.display}/heartbeats); give this node another id (--node-id), or wait "
                f"{self.lease - age:.0f} s if that node is gone")


class ServerHeartbeat(Heartbeat):
    """This node's heartbeat file on the coordination server.

    Each beat writes ``heartbeats/<node-id>`` (pid, this host's time, its estimate of the
    server's time, host name; then, for a serving node, what it serves: see
    :class:`~ftpbc.cluster.heartbeat.Serves`) and reads back the mtime the server gave it: other nodes judge
    the beat by that mtime, and this process learns the server's clock from it.
    """

    def __init__(self, coordination: ServerHeartbeats, interval: float, *,
                 health: Health | None = None) -> None:
        # ``dir`` and ``path`` name the remote file in the base class's messages.
        super().__init__(Path(coordination.dir), coordination.node_id, interval, health=health)
        self.coordination = coordination
        self.remote = coordination.heartbeat_path(coordination.node_id)

    def beat(self) -> None:
        c = self.coordination
        before = c.clock.host_time()
        estimate = before + (c.clock.offset or 0.0)
        line = f"{os.getpid()} {before:.3f} {estimate:.3f} {HOST}\n{self.extra_lines()}"
        c.put_bytes(self.remote, line.encode("ascii", "replace"))
        after = c.clock.host_time()
        c.clock.sample(c.transport.stat(self.remote).mtime, before, after)

    def start(self) -> None:
        if self.lease is not None:
            self.lease.arm()
        try:
            self.leased_beat()
        except FtpbcError as exc:  # a server not reachable yet: the next interval tries again
            log.warning("heartbeat %s: cannot write it yet: %s: %s", self.remote, type(exc).__name__, exc)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.path.name}", daemon=True)
        self._thread.start()

    def stop(self, *, remove: bool = True) -> None:
        super().stop(remove=False)
        if remove:
            try:
                self.coordination.transport.delete(self.remote)
            except NotFound:
                pass
            except FtpbcError as exc:
                log.warning("heartbeat %s: cannot remove it (it goes stale after the lease): %s",
                            self.remote, exc)
