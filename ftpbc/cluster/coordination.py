"""How the nodes of a cluster coordinate: poll locks, heartbeats and leases, cluster-wide sequences.

:class:`Coordination` is what the layers above (the runtime, the serving node, the sweeper) ask
for these; they never build a lock, a heartbeat or a liveness check themselves.  Two
implementations, chosen by ``node.coordination``:

``state_dir`` (the default): :class:`StateDirCoordination`
    Everything in ``node.state_dir``, a directory every node shares (NFS): ``flock`` poll locks,
    heartbeat files, sequence files under ``filelock``.  Cheap (a poll lock costs about a
    microsecond) and as strong as the shared filesystem's locks.

``server``: :class:`~ftpbc.cluster.server.ServerCoordination`
    Everything in ``node.coordination_dir`` on ``node.coordination_server`` (an FTP, FTPS, SFTP
    or file:// server of the configuration), for clusters whose hosts share no filesystem: only
    the transport's rename contract is used.  Each node's ``state_dir`` is then its own.

``docs/cluster.md`` describes both, their files, their guarantees and their costs.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.heartbeat import Heartbeat, HeartbeatInfo, is_dead, live_elsewhere, read_heartbeats
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.sequences import SequenceStore

log = logging.getLogger("ftpbc.cluster")

Health = Callable[[], "str | None"]


class Coordination(ABC):
    """What a process of one node identity uses to coordinate with the other nodes.

    ``poll_lock(key, mode)`` serialises the pollers of ``key`` (an endpoint, ``<endpoint>.sweep``
    or a transfer's journal key) across the cluster; ``mode`` is the endpoint's ``lock``: ``file``
    (the cluster-wide lock of this coordination) or ``none`` (the thread lock only).
    ``heartbeat`` tells the others this node is alive, ``is_dead`` asks whether another node is,
    ``heartbeats`` lists every node's (for ``ftpbc status``),
    ``sequences`` draws ``%0``-``%9`` (this node's own), ``%{0}``-``%{9}`` and ``%{name}`` (the
    cluster's).  Thread-safe.
    """

    #: this node's id
    node_id: str
    #: a node whose heartbeat is older than this (seconds) is dead
    lease: float

    @property
    @abstractmethod
    def sequences(self) -> SequenceStore:
        """The store every pattern of this process draws from."""

    @abstractmethod
    def poll_lock(self, key: str, mode: str) -> PollLock:
        """A try-lock for ``key`` (see :class:`~ftpbc.cluster.poll_lock.PollLock`)."""

    @abstractmethod
    def heartbeat(self, interval: float, *, health: Health | None = None) -> Heartbeat:
        """This node's heartbeat, beating every ``interval`` while ``health()`` returns None."""

    @abstractmethod
    def is_dead(self, node_id: str) -> bool:
        """True if ``node_id`` has no heartbeat younger than the lease."""

    @abstractmethod
    def live_elsewhere(self) -> str | None:
        """Who else runs this node's id (a live heartbeat of another process), as a sentence;
        None if nobody does."""

    @abstractmethod
    def heartbeats(self) -> list[HeartbeatInfo]:
        """Every heartbeat there is (serving nodes and clients), alive or dead, by node id; a
        heartbeat stays until its node stops cleanly, so a killed node is listed, dead."""

    @property
    @abstractmethod
    def where(self) -> str:
        """Where the cluster's state lives, for messages."""

    def close(self) -> None:  # noqa: B027 - nothing to release for the state directory
        """Release what this coordination holds open (connections)."""


class StateDirCoordination(Coordination):
    """Everything in ``state_dir``, shared by every node (today's behaviour, unchanged)."""

    def __init__(self, state_dir: Path, node_id: str, lease: float, *, local_sequences: Path) -> None:
        self.state_dir = Path(state_dir)
        self.node_id = node_id
        self.lease = lease
        self._sequences = SequenceStore(local_sequences, self.state_dir)

    @property
    def sequences(self) -> SequenceStore:
        return self._sequences

    def poll_lock(self, key: str, mode: str) -> PollLock:
        return PollLock(self.state_dir, key, mode, holder=self.node_id, lease=self.lease)

    def heartbeat(self, interval: float, *, health: Health | None = None) -> Heartbeat:
        return Heartbeat(self.state_dir, self.node_id, interval, health=health)

    def is_dead(self, node_id: str) -> bool:
        return is_dead(self.state_dir, node_id, self.lease)

    def live_elsewhere(self) -> str | None:
        return live_elsewhere(self.state_dir, self.node_id, self.lease)

    def heartbeats(self) -> list[HeartbeatInfo]:
        return read_heartbeats(self.state_dir, self.lease)

    @property
    def where(self) -> str:
        return f"state_dir {self.state_dir}"


class Peers:
    """Which nodes serve what, as their live heartbeats say: read at most once per ``refresh``
    seconds for every provider of this process, so that nodes sharing a box can each take a part
    of it (:class:`Share`).

    Only the first read is made by the caller; after it, the heartbeats are read again on a
    thread of their own (one at a time), and :meth:`serving` answers at once from the last
    read.  A poller asks while it holds the poll lock, which every node waits on: reading a
    dozen heartbeat files (clients beat too) over a slow link there held the lock, and so the
    whole cluster, for seconds at a time.

    Not guaranteed: agreement.  Nodes read the heartbeats at different moments; a node that just
    started or died is counted by some and not others for up to ``refresh`` (and a dead one until
    its lease ends).  Parts then overlap or leave a gap, which costs lost claim races or a part
    served later, never a message: a claim is still a rename that exactly one node wins.
    A failed read keeps the last answer (logged once per distinct error).
    """

    def __init__(self, coordination: Coordination, refresh: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._coordination = coordination
        self.node_id = coordination.node_id
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._due = float("-inf")
        #: a read has been made (the first, by a caller), and one is under way in the background
        self._read_once = False
        self._reading = False
        #: (endpoint or ``transfer:<name>``) -> live node ids serving it, sorted
        self._serving: dict[str, tuple[str, ...]] = {}
        self._failed: str | None = None

    def share(self, name: str, *, transfer: bool = False) -> Share:
        """This node's share of endpoint ``name`` (of transfer ``name``, with ``transfer``)."""
        return Share(self, f"transfer:{name}" if transfer else name)

    def serving(self, key: str) -> tuple[str, ...]:
        """The live nodes serving ``key`` (this node always among them), sorted by id."""
        with self._lock:
            if not self._read_once:
                self._read()
                self._read_once = True
                self._due = self._clock() + self._refresh
            elif not self._reading and self._clock() >= self._due:
                self._reading = True
                threading.Thread(target=self._read_in_background, name="ftpbc-peers", daemon=True).start()
            return self._serving.get(key, (self.node_id,))

    def _read_in_background(self) -> None:
        try:
            self._read()
        finally:
            # Due again ``refresh`` after this read ended, not after it began: a read slower
            # than ``refresh`` would otherwise be followed by the next at once, for ever.
            with self._lock:
                self._due = self._clock() + self._refresh
                self._reading = False

    def _read(self) -> None:
        try:
            beats = self._coordination.heartbeats()
        except Exception as exc:  # the poller that asked goes on with the last answer
            text = f"{type(exc).__name__}: {exc}"
            if text != self._failed:
                self._failed = text
                log.warning("cannot read the heartbeats in %s (nodes keep the parts they had): %s",
                            self._coordination.where, text)
            return
        self._failed = None
        serving: dict[str, set[str]] = {}
        for beat in beats:
            if not beat.alive or beat.serves is None:
                continue
            keys = [*beat.serves.endpoints, *(f"transfer:{t}" for t in beat.serves.transfers)]
            for key in keys:
                serving.setdefault(key, set()).add(beat.node_id)
        self._serving = {key: tuple(sorted(ids | {self.node_id})) for key, ids in serving.items()}


class Share:
    """This node's part of one box among the nodes serving it: a message is this node's when
    the CRC-32 of its file name, modulo the number of nodes, is this node's place among their
    sorted ids.  Every node computes the same split of the same names, so nodes that agree on
    who serves (see :class:`Peers`) never go for the same file."""

    def __init__(self, peers: Peers, key: str) -> None:
        self._peers = peers
        self.key = key
        #: this node's place and the number of nodes, as of the last :meth:`refresh`
        self.index = 0
        self.count = 1

    def refresh(self) -> int:
        """Ask who serves the box now (cheap: cached by :class:`Peers`); the number of nodes."""
        nodes = self._peers.serving(self.key)
        self.index, self.count = nodes.index(self._peers.node_id), len(nodes)
        return self.count

    def mine(self, name: str) -> bool:
        """Whether the message named ``name`` is in this node's part."""
        if self.count <= 1:
            return True
        return zlib.crc32(name.encode("utf-8", "surrogateescape")) % self.count == self.index
