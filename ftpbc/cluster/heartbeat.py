"""Node heartbeats in ``state_dir``: how a live node tells that another one is dead.

Each node (serving or client) rewrites ``<state_dir>/heartbeats/<node-id>`` every
``heartbeat_interval``.  A node whose file is older than the lease, or missing, is dead, and a
live node may return its claims and clean its stage files.  Clocks: the file's modification
time is set by the file server that holds ``state_dir``, and compared with this host's clock, so
hosts must keep their clocks within a small fraction of the lease (NTP).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ftpbc.private_files import private_dir, write_private

log = logging.getLogger("ftpbc.heartbeat")


class Heartbeat:
    """Rewrites this node's heartbeat every ``interval`` while ``health()`` says all is well.

    ``health`` returns None while the node's loops make progress, else the reason (see
    :class:`~ftpbc.cluster.liveness.Liveness`): the heartbeat then stops, so that other nodes
    take this node's work over after the lease, and starts again once the loops recover.
    """

    def __init__(self, state_dir: Path, node_id: str, interval: float, *,
                 health: Callable[[], str | None] | None = None) -> None:
        self.dir = Path(state_dir) / "heartbeats"
        self.path = self.dir / node_id
        self.interval = interval
        self.health = health
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: str | None = None
        self._failing: str | None = None

    def beat(self) -> None:
        # 0700/0600 whatever the umask: another local user able to write here could keep a dead
        # node looking alive, or make a live one look dead.
        private_dir(self.dir)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        write_private(tmp, f"{os.getpid()} {time.time():.3f} {_HOST}\n".encode())
        os.replace(tmp, self.path)

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat_if_healthy()
            except Exception as exc:  # never dies: the next interval tries again
                if str(exc) != self._failing:
                    log.warning("heartbeat %s: cannot write it: %s: %s (other nodes will take this "
                                "node's work over after the lease)", self.path, type(exc).__name__, exc)
                self._failing = str(exc)

    def _beat_if_healthy(self) -> None:
        why = self.health() if self.health is not None else None
        if why is not None:
            if why.split(" made no progress", 1)[0] != (self._held or "").split(" made no progress", 1)[0]:
                log.error("heartbeat stopped: %s; other nodes will take this node's work over after "
                          "the lease", why)
            self._held = why
            return
        if self._held is not None:
            log.warning("heartbeat resumed: every loop makes progress again")
            self._held = None
        self.beat()
        if self._failing is not None:
            log.warning("heartbeat %s: written again", self.path)
            self._failing = None

    def stop(self, *, remove: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def live_elsewhere(state_dir: Path, node_id: str, lease: float) -> str | None:
    """Who else holds ``node_id`` (a heartbeat younger than ``lease`` from another host, or from
    another live process of this host), as a sentence; None if nobody does."""
    path = Path(state_dir) / "heartbeats" / node_id
    try:
        age = time.time() - path.stat().st_mtime
        fields = path.read_text(encoding="utf-8", errors="replace").split()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if age > lease or len(fields) < 2:
        return None
    host = fields[2] if len(fields) > 2 else _HOST
    pid = int(fields[0]) if fields[0].isdigit() else 0
    if host == _HOST and (pid == os.getpid() or not _alive(pid)):
        return None
    where = f"host {host}" if host != _HOST else f"process {pid} of this host"
    return (f"node id {node_id!r} is live on {where} (heartbeat {age:.0f} s ago in {path.parent}); give "
            f"this node another id (--node-id), or wait {lease - age:.0f} s if that node is gone")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HOST = socket.gethostname().replace(" ", "-") or "localhost"


def is_dead(state_dir: Path, node_id: str, lease: float) -> bool:
    """True if ``node_id`` has no heartbeat younger than ``lease`` seconds."""
    try:
        age = time.time() - (Path(state_dir) / "heartbeats" / node_id).stat().st_mtime
    except FileNotFoundError:
        return True
    return age > lease
