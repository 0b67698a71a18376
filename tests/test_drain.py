"""More nodes never make a backlog drain worse: N nodes under the default ``lock: file`` all take
a share of a backlog, and the listings they make per message stay bounded as N grows.

Counted, not timed: each provider's own counters (``ProviderStats``: listings of the box, claim
races lost) over a whole drain.  Nodes that each listed and claimed from the head of the box
under the lock lost most of their claims to each other and listed again after every poll that
won nothing; nodes that split what they list (``cluster.coordination.Share``) claim their own
part without racing.  In-process nodes on pyftpdlib and vsftpd: what is counted sits above the
transport (listings and claims), and the two servers list differently (vsftpd by glob slices
once a box is large, pyftpdlib whole).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.cluster.coordination import Peers, StateDirCoordination
from ftpbc.cluster.heartbeat import Heartbeat, Serves
from ftpbc.model.message import Message
from ftpbc.node.provider import Provider
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

#: messages waiting when the nodes start
BACKLOG = 1000
WORKERS = 4
#: listings of the box per message served, over the whole drain, whatever the number of nodes
LISTINGS_PER_MESSAGE = 0.1
#: claim races lost per message served: nodes that split the box rarely go for the same file
LOST_PER_MESSAGE = 0.5


def _beat(state: Path, node_id: str, serves: Serves | None, *, age: float = 0.0) -> None:
    beat = Heartbeat(state, node_id, 1.0)
    beat.serves = serves
    beat.beat()
    if age:
        when = beat.path.stat().st_mtime - age
        os.utime(beat.path, (when, when))


def test_live_nodes_serving_a_box_split_it_into_disjoint_parts_that_cover_it(tmp_path: Path) -> None:
    """Which nodes share a box comes from their live heartbeats (dead nodes, clients and nodes
    serving something else are not counted), and the parts every node computes from that are
    disjoint and cover every name, whatever the name holds."""
    state = tmp_path / "state"
    _beat(state, "node-a", Serves(("ep",), ()))
    _beat(state, "node-b", Serves(("ep",), ()))
    _beat(state, "node-c", Serves(("ep", "other"), ("t",)))
    _beat(state, "node-d", Serves(("ep",), ()), age=120)  # dead: older than the lease
    _beat(state, "node-e", Serves(("other",), ()))
    _beat(state, "cli.client1", None)
    names = [f"msg.{uuid.uuid4()}" for _ in range(300)] + ["req.é;p=9", "x\udcff", ""]
    owners: Counter[str] = Counter()
    for me in ("node-a", "node-b", "node-c"):
        coordination = StateDirCoordination(state, me, 60.0, local_sequences=tmp_path / me)
        peers = Peers(coordination, refresh=60.0)
        assert peers.serving("ep") == ("node-a", "node-b", "node-c")
        assert peers.serving("transfer:t") == tuple(sorted({"node-c", me}))
        assert peers.serving("nobody") == (me,)
        share = peers.share("ep")
        assert share.refresh() == 3
        mine = [name for name in names if share.mine(name)]
        assert len(mine) > 50, f"{me}: {len(mine)} of {len(names)}"
        owners.update(mine)
    assert set(owners) == set(names)
    assert set(owners.values()) == {1}, "a name in two parts"


def test_a_node_that_stops_serving_leaves_the_split_at_the_next_read(tmp_path: Path) -> None:
    """The heartbeats are read once per refresh, not per poll; the next read after a node's
    heartbeat is gone (a clean stop) gives its part to the others."""
    state = tmp_path / "state"
    _beat(state, "node-b", Serves(("ep",), ()))
    now = [0.0]
    peers = Peers(StateDirCoordination(state, "node-a", 60.0, local_sequences=tmp_path / "a"),
                  refresh=5.0, clock=lambda: now[0])
    share = peers.share("ep")
    assert share.refresh() == 2
    (state / "heartbeats" / "node-b").unlink()
    now[0] = 4.9
    assert share.refresh() == 2  # not read again yet
    now[0] = 5.0
    # read again, in the background: the answer changes once that read is done
    wait_until(lambda: share.refresh() == 1, what="the split without node-b")
    assert all(share.mine(f"msg.{i}") for i in range(50))


class _GatedCoordination(StateDirCoordination):
    """Heartbeats read only once ``gate`` opens (a slow server), after the first read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.reads = 0
        #: reads after the first made on the thread that asked (the poller's, here the test's)
        self.on_caller = 0

    def heartbeats(self) -> Any:
        self.reads += 1
        if self.reads > 1:
            if threading.current_thread() is threading.main_thread():
                self.on_caller += 1
            else:
                self.gate.wait(30)
        return super().heartbeats()


def test_a_slow_heartbeat_read_never_holds_up_a_poller(tmp_path: Path) -> None:
    """A poller asks who shares its box while it holds the poll lock, which every node waits
    on: after the first read, it gets the last answer at once while the next read, however
    slow, runs on a thread of its own, and only one such read runs at a time."""
    state = tmp_path / "state"
    _beat(state, "node-b", Serves(("ep",), ()))
    now = [0.0]
    coordination = _GatedCoordination(state, "node-a", 60.0, local_sequences=tmp_path / "a")
    share = Peers(coordination, refresh=1.0, clock=lambda: now[0]).share("ep")
    assert share.refresh() == 2
    _beat(state, "node-c", Serves(("ep",), ()))
    now[0] = 1.0
    try:
        for _ in range(5):  # the read is due; it waits on the gate, the answers do not
            assert share.refresh() == 2
        wait_until(lambda: coordination.reads == 2, what="the background read to begin")
        assert share.refresh() == 2 and coordination.reads == 2  # one read at a time
    finally:
        coordination.gate.set()
    wait_until(lambda: share.refresh() == 3, what="the background read's answer")
    assert coordination.on_caller == 0


class Served:
    """Which node served each message (by name)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by: dict[str, list[str]] = {}

    def handler_of(self, node_id: str) -> Any:
        def handle(message: Message) -> bytes:
            with self.lock:
                self.by.setdefault(message.name, []).append(node_id)
            return b""
        return handle

    def count(self) -> int:
        with self.lock:
            return len(self.by)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_every_node_drains_a_share_with_bounded_listings(kind: str, nodes: int, tmp_path: Path,
                                                         request: pytest.FixtureRequest,
                                                         things: list[Any]) -> None:
    """N nodes with the default lock drain a backlog: every message served exactly once, every
    node serving some, listings and lost races per message below a bound that does not grow
    with N."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", "poll_interval": 0.2, "workers": WORKERS}}
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")  # the exchange area's directories
    inbox = handle.local(f"{base}/ep/inbox")
    stage = inbox.parent / "instage"
    names = [f"msg.{uuid.uuid4()}" for _ in range(BACKLOG)]
    for i, name in enumerate(names):
        (stage / name).write_bytes(b"x")
        os.utime(stage / name, (1_700_000_000 + i, 1_700_000_000 + i))
    served = Served()
    started: list[Node] = []
    for n in range(nodes):
        node_id = f"node-{n}"
        cfg = in_process_config(handle, tmp_path, node_id, endpoints)
        cfg = cfg.model_copy(update={"node": cfg.node.model_copy(update={"heartbeat_interval": 0.5,
                                                                        "lease": 5.0})})
        node = Node(cfg, handlers={"ep": served.handler_of(node_id)})
        things.append(node)
        node.start()
        started.append(node)
    providers = [node.providers["ep"] for node in started]
    assert all(isinstance(p, Provider) for p in providers)
    # Every node knows every other serves the box before the backlog arrives (as in a cluster
    # that was running when an outage ended), so what is counted is the drain, not start-up.
    wait_until(lambda: all(p.share is None or p.share.refresh() == nodes  # type: ignore[attr-defined]
                           for p in providers), timeout=30, what="every node to see the others")
    for name in names:
        os.rename(stage / name, inbox / name)
    wait_until(lambda: served.count() == BACKLOG, timeout=120, what="the backlog to be drained")
    with served.lock:
        twice = {name: by for name, by in served.by.items() if len(by) > 1}
        shares = Counter(by[0] for by in served.by.values())
    assert not twice, f"served more than once: {list(twice.items())[:3]}"
    assert sorted(served.by) == sorted(names)
    listings = sum(p.stats.listings for p in providers)
    lost = sum(p.stats.lost_races for p in providers)
    figures = (f"{kind}, {nodes} node(s): shares {dict(sorted(shares.items()))}, {listings} listings, "
               f"{lost} races lost for {BACKLOG} messages")
    print(figures)
    assert set(shares) == {f"node-{n}" for n in range(nodes)}, figures
    assert listings <= LISTINGS_PER_MESSAGE * BACKLOG, figures
    assert lost <= LOST_PER_MESSAGE * BACKLOG, figures
