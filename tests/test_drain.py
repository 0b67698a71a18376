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
