"""Node heartbeats in ``state_dir``: how a live node tells that another one is dead.

Each node (serving or client) rewrites ``<state_dir>/heartbeats/<node-id>`` every
``heartbeat_interval``.  A node whose file is older than the lease, or missing, is dead, and a
live node may return its claims and clean its stage files.  Clocks: the file's modification
time is set by the file server that holds ``state_dir``, and compared with this host's clock, so
hosts must keep their clocks within a small fraction of the lease (NTP).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class Heartbeat:
    def __init__(self, state_dir: Path, node_id: str, interval: float) -> None:
        self.dir = Path(state_dir) / "heartbeats"
        self.path = self.dir / node_id
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(f"{os.getpid()} {time.time():.3f}\n", encoding="ascii")
        os.replace(tmp, self.path)

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError:
                pass  # the next beat retries; a node that cannot beat for a lease looks dead

    def stop(self, *, remove: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def is_dead(state_dir: Path, node_id: str, lease: float) -> bool:
    """True if ``node_id`` has no heartbeat younger than ``lease`` seconds."""
    try:
        age = time.time() - (Path(state_dir) / "heartbeats" / node_id).stat().st_mtime
    except FileNotFoundError:
        return True
    return age > lease
