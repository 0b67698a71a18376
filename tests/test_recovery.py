"""One test per fault point: a real process SIGKILLed at that step, then recovery, then the invariants.

For each point of :data:`ftpbc.faults.POINTS` a request is run through with the process that
meets the point (the client, the serving node, the collecting client or ``ftpbc recover``)
started with ``FTPBC_CRASH_AT=<point>``.  It dies there; ``ftpbc recover`` for its node id (and
for a send, the journal listing before it) runs in a fresh process, then a normal node finishes
the work.  Then:

* the request is answered exactly once (one response archived, the right body), or, for a send
  rolled back, it is absent from every directory;
* the handler returned at most once when the crash came after its result was recorded;
* no file is left in any stage, box or select directory, and every journal is empty.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from tests.chaos import (
    ENDPOINT,
    REPO,
    Cluster,
    NodeProcess,
    load_client_config,
    make_cluster,
    read_invocations,
    run_cli,
)
from tests.servers.handle import ServerHandle
from tests.support import wait_until

#: a real FTP server; the fault points sit above the transport, so one server shows the logic
#: (the chaos test runs against pyftpdlib and vsftpd)
SERVERS = ["pyftpdlib"]

CHILD = """
import sys
from ftpbc.client import Client
from tests.chaos import load_client_config, Cluster
c = Cluster.from_json(sys.argv[1])
with Client(load_client_config(c, sys.argv[2])) as client:
    if sys.argv[3] == "submit":
        print(client.submit("echo", sys.argv[4].encode()), flush=True)
    else:
        print(client.collect("echo", sys.argv[4], timeout=20).decode(), flush=True)
"""


@pytest.fixture(params=SERVERS)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Cluster:
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                        repository=handle.fresh_dir(), server_root=handle.root)


def child(cluster: Cluster, node_id: str, action: str, arg: str, crash_at: str | None,
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, cluster.to_json(), node_id, action, arg], cwd=REPO,
                          env=cluster.env(None, crash_at), capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def checker(cluster: Cluster) -> Iterator[Client]:
    with Client(load_client_config(cluster, "checker"), connections=2) as client:
        yield client


def serve_until_crash(cluster: Cluster, point: str) -> None:
    node = NodeProcess(cluster, "n1")
    node.start(crash_at=point)
    try:
        code = node.wait(30)
    finally:
        node.kill()
    assert code == -9, f"the node should have been SIGKILLed at {point}; it exited {code}"


def recover(cluster: Cluster, node_id: str, crash_at: str | None = None) -> str:
    r = run_cli(cluster, "recover", node_id=node_id, crash_at=crash_at)
    if crash_at:
        assert r.returncode == -9, f"recover should have died at {crash_at}: {r.stdout}{r.stderr}"
    else:
        assert r.returncode == 0, r.stderr
    return r.stdout


def finish_with_node(cluster: Cluster, checker: Client, uid: str, body: bytes) -> None:
    """A normal node serves what is left; the checker collects ``uid``'s response."""
    node = NodeProcess(cluster, "n1")
    node.start()
    try:
        wait_until(node.ready, timeout=30, what="the node to serve")
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:" + body
    finally:
        assert node.stop() == 0


def assert_clean(cluster: Cluster) -> None:
    assert cluster.leftovers() == {}, "files left in stage/box/select directories"
    assert cluster.pending() == {}, "journal operations left pending"
    assert cluster.nonempty_journal_files() == []


def assert_answered_once(cluster: Cluster, uid: str) -> None:
    responses = [n for n in cluster.files("outarchive") if n.startswith(f"resp.{uid}~")]
    requests = [n for n in cluster.files("inarchive") if n.startswith((f"req.{uid}~", f"req.{uid};"))]
    assert len(responses) == 1, responses
    assert len(requests) == 1, requests
    assert_clean(cluster)


def returns(cluster: Cluster, uid: str) -> int:
    return read_invocations(cluster.handler_logs()).returns[uid]


# ---------------------------------------------------------------------- client: sending

@pytest.mark.parametrize("point", ["send.after-intent", "send.after-put"])
def test_send_killed_before_expose_is_rolled_back(cluster: Cluster, point: str) -> None:
    r = child(cluster, "cli", "submit", "hello", point)
    assert r.returncode == -9, r.stderr
    listing = run_cli(cluster, "journal", node_id="cli").stdout
    assert "1 pending operation(s)" in listing and ".send\tsend\t" in listing, listing
    uid = listing.split("\t")[1].removesuffix(".send")
    out = recover(cluster, "cli")
    if point == "send.after-put":
        assert "rolled back: staged file removed, never exposed" in out
    assert_clean(cluster)
    everywhere = [n for d in ("inbox", "instage", "inselect", "inarchive", "outbox", "outarchive")
                  for n in cluster.files(d) if uid in n]
    assert everywhere == []


def test_send_killed_after_expose_is_answered(cluster: Cluster, checker: Client) -> None:
    r = child(cluster, "cli", "submit", "hello", "send.after-expose")
    assert r.returncode == -9, r.stderr
    [name] = cluster.files("inbox")
    uid = name.removeprefix("req.")
    assert "already exposed" in recover(cluster, "cli")
    finish_with_node(cluster, checker, uid, b"hello")
    assert_answered_once(cluster, uid)


# ---------------------------------------------------------------------- provider: claim and serve

@pytest.mark.parametrize("point", ["claim.after-intent", "claim.after-rename"])
def test_provider_killed_before_handler_returns_request(cluster: Cluster, checker: Client,
                                                        point: str) -> None:
    uid = checker.submit(ENDPOINT, b"work")
    serve_until_crash(cluster, point)
    out = recover(cluster, "n1")
    if point == "claim.after-rename":
        # A claim that never got to its handler counts as a delivery: the name says so.
        assert cluster.files("inbox") == [f"req.{uid};n=1"]
        assert "returned as delivery 1 of 5" in out
    finish_with_node(cluster, checker, uid, b"work")
    assert_answered_once(cluster, uid)
    assert returns(cluster, uid) == 1


@pytest.mark.parametrize("point", ["serve.after-result", "serve.after-stage", "serve.after-commit",
                                   "serve.after-expose"])
def test_provider_killed_after_result_never_reruns_handler(cluster: Cluster, checker: Client,
                                                           point: str) -> None:
    uid = checker.submit(ENDPOINT, b"once")
    serve_until_crash(cluster, point)
    assert returns(cluster, uid) == 1
    listing = run_cli(cluster, "journal", node_id="n1").stdout
    assert f"{uid}.serve\tclaim > served" in listing, listing
    out = recover(cluster, "n1")
    assert "finished: recorded result delivered, handler not run again" in out
    finish_with_node(cluster, checker, uid, b"once")
    assert returns(cluster, uid) == 1, "the handler ran again after its result was recorded"
    assert_answered_once(cluster, uid)


@pytest.mark.parametrize("point", ["serve.after-result", "serve.after-stage"])
def test_a_result_recorded_before_the_claim_was_taken_is_delivered_by_the_next_node(
        cluster: Cluster, checker: Client, point: str) -> None:
    """Killed after recording (before or after staging); its claim goes back as a sweeper
    returns a dead node's, before it recovers.  Its recovery stages the recorded reply whole,
    and the node that serves the returned request delivers it: the handler ran once."""
    uid = checker.submit(ENDPOINT, b"kept")
    serve_until_crash(cluster, point)
    [claim] = cluster.files("inselect")
    cluster.local("inselect", claim).rename(cluster.local("inbox", f"req.{uid};n=1"))
    out = recover(cluster, "n1")
    assert "claim had been returned by another node; reply withheld" in out, out
    assert [n.split("~")[0] for n in cluster.files("outstage")] == [f"resp.{uid}"]
    other = NodeProcess(cluster, "n2")
    other.start()
    try:
        assert checker.collect(ENDPOINT, uid, timeout=30) == b"re:kept"
    finally:
        assert other.stop() == 0
    assert returns(cluster, uid) == 1, "the handler ran again after its result was recorded"
    assert_answered_once(cluster, uid)


# ---------------------------------------------------------------------- client: collecting

def _served(cluster: Cluster, checker: Client, body: bytes) -> str:
    uid = checker.submit(ENDPOINT, body)
    node = NodeProcess(cluster, "n1")
    node.start()
    try:
        wait_until(lambda: cluster.files("outbox") == [f"resp.{uid}"], timeout=30, what="the response")
    finally:
        assert node.stop() == 0
    return uid


@pytest.mark.parametrize("point", ["collect.after-intent", "collect.after-claim", "collect.after-read"])
def test_collector_killed_before_archive_gets_response_later(cluster: Cluster, checker: Client,
                                                             point: str) -> None:
    uid = _served(cluster, checker, b"later")
    r = child(cluster, "cli", "collect", uid, point)
    assert r.returncode == -9, r.stderr
    recover(cluster, "cli")
    assert cluster.files("outbox") == [f"resp.{uid}"], "the response must be back for a new collect"
    r = child(cluster, "cli2", "collect", uid, None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "re:later"
    assert_answered_once(cluster, uid)


def test_collector_killed_after_archive_leaves_nothing(cluster: Cluster, checker: Client) -> None:
    uid = _served(cluster, checker, b"done")
    r = child(cluster, "cli", "collect", uid, "collect.after-archive")
    assert r.returncode == -9, r.stderr
    recover(cluster, "cli")
    assert_answered_once(cluster, uid)


# ---------------------------------------------------------------------- recovery itself

@pytest.mark.parametrize("point", ["recover.before-op", "recover.after-op"])
def test_crash_during_recovery_is_recovered_by_next_run(cluster: Cluster, checker: Client,
                                                        point: str) -> None:
    uid = checker.submit(ENDPOINT, b"twice")
    serve_until_crash(cluster, "serve.after-commit")
    recover(cluster, "n1", crash_at=point)
    out = recover(cluster, "n1")
    if point == "recover.before-op":
        assert "finished: recorded result delivered" in out
    finish_with_node(cluster, checker, uid, b"twice")
    assert returns(cluster, uid) == 1
    assert_answered_once(cluster, uid)


def test_every_fault_point_has_a_test() -> None:
    from ftpbc.faults import POINTS

    source = Path(__file__).read_text()
    sides = ("send", "claim", "serve", "collect", "recover")
    exchange_points = [p for p in POINTS if p.split(".")[0] in sides]
    assert len(exchange_points) >= 15
    assert [p for p in exchange_points if f'"{p}"' not in source] == []


def test_unknown_fault_point_is_refused(tmp_path: Path) -> None:
    env = {"FTPBC_CRASH_AT": "send.nowhere", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", "import ftpbc.faults"], cwd=REPO, env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode != 0 and "unknown point 'send.nowhere'" in r.stderr
