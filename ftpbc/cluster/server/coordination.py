"""``coordination: server`` as a :class:`~ftpbc.cluster.coordination.Coordination`: the
heartbeats, poll locks and sequences of this package, over one transport (package docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.coordination import Coordination, Health
from ftpbc.cluster.heartbeat import Heartbeat
from ftpbc.cluster.server.heartbeat import ServerHeartbeat
from ftpbc.cluster.server.lock import ServerLocks
from ftpbc.cluster.server.sequences import ServerSequences
from ftpbc.sequences import SequenceStore
from ftpbc.transport.base import Transport


class ServerCoordination(ServerLocks, Coordination):
    """Locks, heartbeats and sequences in ``directory`` on the server behind ``transport``."""

    def __init__(self, transport: Transport, directory: str, node_id: str, lease: float, *,
                 lock_expiry: float = 10.0, local_sequences: Path, display: str | None = None,
                 lock_timeout: float = 30.0, host_time: Callable[[], float] = time.time) -> None:
        super().__init__(transport, directory, node_id, lease, lock_expiry=lock_expiry,
                         display=display, host_time=host_time)
        self._sequences = SequenceStore(local_sequences, local_sequences,
                                        shared=ServerSequences(self, lock_timeout=lock_timeout))

    # ------------------------------------------------------------------ the interface

    @property
    def sequences(self) -> SequenceStore:
        return self._sequences

    def heartbeat(self, interval: float, *, health: Health | None = None) -> Heartbeat:
        return ServerHeartbeat(self, interval, health=health)

    def is_dead(self, node_id: str) -> bool:
        return self.heartbeat_age(node_id) is None

    @property
    def where(self) -> str:
        return f"server {self.display}"

    def close(self) -> None:
        self.stop_renewing()
        self.transport.close()
