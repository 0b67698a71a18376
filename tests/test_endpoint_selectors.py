"""Selectors on served endpoints (``selector:`` in YAML): a serving node claims only the messages
its selector selects; the others stay in the inbox for other consumers, untouched, and a box of
only such messages does not make the node poll any faster than an empty one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.config.loader import load_config
from ftpbc.errors import ConfigError
from ftpbc.model.message import Message
from ftpbc.node.provider import Provider
from ftpbc.node.serve import Node
from tests.cluster import Started, in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until


class Seen:
    """The regions of the messages a handler was called with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.regions: list[object] = []

    def handler(self, message: Message) -> bytes:
        with self.lock:
            self.regions.append(message.properties.get("region"))
        return b""

    def got(self) -> list[object]:
        with self.lock:
            return list(self.regions)


@pytest.fixture
def started() -> Iterator[Started]:
    with Started() as s:
        yield s


def _box(handle: ServerHandle, repo: str, directory: str = "inbox") -> list[tuple[str, int, int]]:
    path = handle.local(f"{repo}/{directory}")
    if not path.exists():
        return []
    out = []
    for p in path.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:  # renamed away (claimed, committed) since the listing
            continue
        out.append((p.name, st.st_size, st.st_mtime_ns))
    return sorted(out)


def _provider(node: Node) -> Provider:
    provider = node.providers["ep"]
    assert isinstance(provider, Provider)
    return provider


def test_two_nodes_with_disjoint_selectors_each_serve_only_theirs(
        server: ServerHandle, tmp_path: Path, started: Started) -> None:
    repo = f"{server.fresh_dir()}/ep"
    common = {"repository": repo, "poll_interval": 0.05, "workers": 2}
    client = started.add(Client(in_process_config(server, tmp_path, "cli", {"ep": common})))
    for i in range(24):
        region = ("eu", "us", None)[i % 3]
        client.send("ep", b"x", priority=i % 10, properties={"region": region} if region else {})
    # a message nobody selects that expires on its way: filed by the expiry all the same
    client.send("ep", b"late", ttl=0.001)
    # On a local directory the browse may come within the millisecond the late one lives.
    wait_until(lambda: len(client.browse("ep", selector="region IS NULL")) == 8, timeout=10,
               what="the late message past its expiration")
    nobody = [w.name for w in client.browse("ep", selector="region IS NULL")]
    assert len(nobody) == 8
    eu, us = Seen(), Seen()
    nodes = {}
    for node_id, seen, selector in (("a", eu, "region = 'eu'"), ("b", us, "region <> 'eu'")):
        cfg = in_process_config(server, tmp_path, node_id, {"ep": {**common, "selector": selector}})
        nodes[node_id] = started.add(Node(cfg, handlers={"ep": seen.handler}))
        nodes[node_id].start()
    wait_until(lambda: len(eu.got()) == 8 and len(us.got()) == 8, timeout=60, what="each node's messages")
    wait_until(lambda: len(_box(server, repo, "inexpired")) == 2, timeout=60,
               what="the expired message filed (with its .reason)")
    # Every node has listed the box twice more since: the unselected messages were in each listing.
    polls = {n: _provider(node).stats.polls for n, node in nodes.items()}
    wait_until(lambda: all(_provider(node).stats.polls >= polls[n] + 2 for n, node in nodes.items()),
               timeout=30, what="two more polls of each node")
    assert eu.got() == ["eu"] * 8 and us.got() == ["us"] * 8
    # never claimed, returned, redelivered or filed: the same names, nothing else left over
    assert [name for name, _, _ in _box(server, repo)] == sorted(nobody)
    # A handled message's commit may still be on its way (its fsync and rename come after the
    # handler, off the worker's slot), whatever the polls since.
    wait_until(lambda: _box(server, repo, "inselect") == [], timeout=30, what="the last commits")
    assert _box(server, repo, "inerror") == []
    for node in nodes.values():
        stats = _provider(node).stats
        assert stats.lost_races == 0 and stats.failed == 0


def test_a_node_whose_selector_matches_nothing_leaves_the_box_alone_and_does_not_spin(
        server: ServerHandle, tmp_path: Path, started: Started) -> None:
    repo = f"{server.fresh_dir()}/ep"
    poll = 0.1
    common = {"repository": repo, "poll_interval": poll, "workers": 2}
    client = started.add(Client(in_process_config(server, tmp_path, "cli", {"ep": common})))
    for i in range(10):
        client.send("ep", b"x", priority=i, properties={"region": "us"})
    before = _box(server, repo)
    seen = Seen()
    cfg = in_process_config(server, tmp_path, "a", {"ep": {**common, "selector": "region = 'eu'"}})
    node = started.add(Node(cfg, handlers={"ep": seen.handler}))
    node.start()
    provider = _provider(node)
    # A window of the node's own polls (each lists the box once): a node that took the box for
    # work would poll again at once (the 2 ms backoff after a poll that found work); one that
    # sees an empty box waits poll_interval between polls.
    first = provider.stats.polls
    opened = time.monotonic()
    wait_until(lambda: provider.stats.polls >= first + 6, timeout=30, what="six polls")
    window = time.monotonic() - opened
    assert window >= 5 * poll * 0.9, f"6 polls in {window:.3f} s: the node spins"
    assert seen.got() == [] and provider.stats.lost_races == 0 and provider.in_flight == 0
    assert _box(server, repo) == before
    assert _box(server, repo, "inselect") == []
    # still there for another consumer: a node without a selector serves them
    other = Seen()
    node_b = started.add(Node(in_process_config(server, tmp_path, "b", {"ep": common}),
                              handlers={"ep": other.handler}))
    node_b.start()
    wait_until(lambda: len(other.got()) == 10, timeout=60, what="the other node to serve them")
    assert seen.got() == []


def test_an_invalid_endpoint_selector_is_refused_at_load(tmp_path: Path) -> None:
    cfg = tmp_path / "ftpbc.yaml"
    cfg.write_text(f"servers:\n  s: {{url: 'file://{tmp_path}/area'}}\nendpoints:\n  ep:\n    server: s\n"
                   "    repository: /ep\n    selector: \"weight > 'heavy'\"\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    text = str(caught.value)
    assert text.startswith(f"{cfg}:7: endpoints.ep.selector: ")
    assert "column 8" in text and "\n" not in text
    cfg.write_text(cfg.read_text(encoding="utf-8").replace("'heavy'", "2500"), encoding="utf-8")
    assert load_config(cfg).endpoints["ep"].selector == "weight > 2500"
