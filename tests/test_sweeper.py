"""Nodes that never come back, nodes that were only slow, and responses nobody collects.

Real ``ftpbc serve`` processes against pyftpdlib, with a short lease (3 s, heartbeat 0.5 s):

* a node killed while holding a claim, and never restarted, has that claim returned to the
  inbox by a live node once its heartbeat is older than the lease, and the request is answered;
* a node that was only slow (SIGSTOPped inside its handler past the lease, so its heartbeat went
  stale) loses its claim to a live node, and when it wakes up it withholds its reply: exactly one
  response exists;
* a node killed after committing a request, before exposing its response, and never restarted:
  a live node exposes the staged response;
* a staged response left by a dead node that never committed its request (it had lost its claim,
  or died mid-upload: the file may be torn) is removed, never exposed over the real answer;
* a response nobody collects within ``uncollected_after`` is archived as ``~uncollected``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ftpbc.client import Client
from tests.chaos import (
    ENDPOINT,
    Cluster,
    NodeProcess,
    load_client_config,
    make_cluster,
    read_invocations,
    run_cli,
)
from tests.servers.handle import ServerHandle
from tests.support import wait_until

LEASE = 3.0  # a 1 s stall of the test process on a loaded machine must not look like death
HEARTBEAT = 0.5


def _cluster(handle: ServerHandle, tmp_path: Path, **kw: float) -> Cluster:
    return make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                        repository=handle.fresh_dir(), server_root=handle.root, lease=LEASE,
                        heartbeat=HEARTBEAT, **kw)  # type: ignore[arg-type]


@pytest.fixture
def cluster(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Cluster:
    return _cluster(pyftpdlib_server, tmp_path)


@pytest.fixture
def checker(cluster: Cluster) -> Iterator[Client]:
    with Client(load_client_config(cluster, "checker"), connections=2) as client:
        yield client


def _log(node: NodeProcess) -> str:
    return node.log.read_text(errors="replace")


def _submit_then_crash(cluster: Cluster, checker: Client, body: bytes, crash_at: str) -> str:
    """Submit a request of ``body``; node "dead" takes it and is SIGKILLed at ``crash_at``, never
    to return.  Returns the request's id."""
    uid = checker.submit(ENDPOINT, body)
    dead = NodeProcess(cluster, "dead")
    dead.start(crash_at=crash_at)
    assert dead.wait(30) == -9
    return uid


@contextmanager
def _serving(cluster: Cluster, node_id: str) -> Iterator[NodeProcess]:
    """A node that serves while the block runs, then must stop cleanly."""
    node = NodeProcess(cluster, node_id)
    node.start()
    try:
        yield node
    finally:
        assert node.stop() == 0


def test_dead_nodes_claim_is_returned_after_the_lease(cluster: Cluster, checker: Client) -> None:
    uid = _submit_then_crash(cluster, checker, b"orphan", "claim.after-rename")
    assert cluster.files("inselect") == [f"req.{uid}~dead"]
    with _serving(cluster, "live") as live:
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:orphan"
        wait_until(lambda: "returned req." in _log(live) and "claimed by dead node dead" in _log(live),
                   timeout=10, what="the node to log why it returned the claim")
    # A claim returned from a dead node counts as a delivery: the name carries the count.
    [archived] = cluster.files("inarchive")
    assert archived.startswith(f"req.{uid};n=1~live~")
    # The dead node's own journal still names the claim; its recovery finds it already returned.
    out = run_cli(cluster, "recover", node_id="dead").stdout
    assert "claim never made or already returned" in out
    assert cluster.leftovers() == {} and cluster.pending() == {}


def test_slow_node_past_the_lease_does_not_answer_twice(cluster: Cluster, checker: Client) -> None:
    # 5 s: time enough to stop the node while its handler runs, however loaded the machine
    uid = checker.submit(ENDPOINT, b"sleep:5:slow")
    slow = NodeProcess(cluster, "slow")
    slow.start()
    live = NodeProcess(cluster, "live")
    try:
        wait_until(lambda: read_invocations(cluster.handler_logs()).starts[uid] == 1, timeout=30,
                   what="the slow node's handler to start")
        assert slow.proc is not None
        slow.proc.send_signal(signal.SIGSTOP)  # alive but silent: its heartbeat goes stale
        live.start()
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:sleep:5:slow"
        slow.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: "claim lost to another node before commit" in _log(slow), timeout=30,
                   what="the slow node to find its claim gone")
        # Its reply stayed staged for a node that might take the request over; the request was
        # served already, so the live node's sweeper removes it once it is a lease old.
        wait_until(lambda: cluster.files("outstage") == [], timeout=30,
                   what="the slow node's orphaned reply removed by a sweep")
    finally:
        if slow.proc is not None:
            slow.proc.send_signal(signal.SIGCONT)
        assert live.stop() == 0
        assert slow.stop() == 0
    inv = read_invocations(cluster.handler_logs())
    assert inv.returns[uid] == 2, "both handlers ran: the slow one's result must have been withheld"
    responses = [n for d in ("outbox", "outstage", "outselect", "outarchive") for n in cluster.files(d)]
    assert len(responses) == 1 and responses[0].startswith(f"resp.{uid}~checker~")
    [archived] = cluster.files("inarchive")
    assert archived.startswith(f"req.{uid};n=1~live~")
    assert cluster.leftovers() == {} and cluster.pending() == {}


def test_dead_nodes_committed_response_is_exposed(cluster: Cluster, checker: Client) -> None:
    uid = _submit_then_crash(cluster, checker, b"committed", "serve.after-commit")
    assert cluster.files("outstage") == [f"resp.{uid}~dead={len(b're:committed')}"]
    with _serving(cluster, "live") as live:
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:committed"
        wait_until(lambda: f"exposed resp.{uid} staged by dead node dead" in _log(live), timeout=10,
                   what="the node to log why it exposed the response")
    inv = read_invocations(cluster.handler_logs())
    assert inv.starts[uid] == 1, "the committed result is delivered, the handler not run again"
    [archived] = cluster.files("inarchive")
    assert archived.startswith(f"req.{uid}~dead~")
    assert cluster.leftovers() == {}


def test_uncommitted_staged_response_of_a_dead_node_is_removed(cluster: Cluster, checker: Client) -> None:
    uid = checker.submit(ENDPOINT, b"real")
    with _serving(cluster, "live") as live:
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:real"
        # What a node that lost its claim and died mid-upload leaves: a torn reply, staged under
        # its name, with no claim and no commit of its own (the request was archived by "live").
        torn = cluster.local("outstage", f"resp.{uid}~ghost")
        torn.write_bytes(b"re:re")
        wait_until(lambda: not torn.exists(), timeout=30, what="the sweeper to deal with the torn reply")
        # The node logs after it removed the file: wait for the line, do not race its write.
        wait_until(lambda: "staged by dead node ghost, which never committed its request" in _log(live),
                   timeout=10, what="the node to log why it removed the torn reply")
    assert cluster.files("outbox") == []
    responses = [n for n in cluster.files("outarchive") if n.startswith(f"resp.{uid}")]
    assert len(responses) == 1 and responses[0].startswith(f"resp.{uid}~checker~")
    assert cluster.local("outarchive", responses[0]).read_bytes() == b"re:real"
    assert cluster.leftovers() == {}


def test_uncollected_response_is_archived(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    cluster = _cluster(pyftpdlib_server, tmp_path, uncollected_after=1.0)
    with Client(load_client_config(cluster, "forgetful")) as client:
        uid = client.submit(ENDPOINT, b"nobody waits")
    with _serving(cluster, "n1") as node:
        wait_until(lambda: cluster.files("outarchive"), timeout=30, what="the response to be archived")
        wait_until(lambda: "uncollected for" in _log(node), timeout=10, what="the node to log it")
    [archived] = cluster.files("outarchive")
    assert archived.startswith(f"resp.{uid}~uncollected~")
    assert cluster.files("outbox") == []
    assert cluster.leftovers() == {} and cluster.pending() == {}
