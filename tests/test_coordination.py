"""``node.coordination: server``: poll locks, heartbeats and sequences on the FTP/SFTP server.

In one process, against the real servers of the rig (file://, pyftpdlib, vsftpd, OpenSSH):
each simulated node has a :class:`ServerCoordination` of its own, with its own transport and so
its own connections, as separate hosts would.  The same on separate hosts (network namespaces,
``ftpbc serve`` processes) is ``tests/test_hosts.py``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.cluster.coordination import StateDirCoordination
from ftpbc.cluster.factory import open_coordination
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.cluster.server import ServerCoordination, ServerLock, Token
from ftpbc.config.loader import parse_config
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError
from ftpbc.exchange.runtime import Runtime
from ftpbc.node.serve import Node
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.transport import open_transport
from tests.servers.handle import ServerHandle
from tests.support import wait_until

SERVERS = ["local", "pyftpdlib", "vsftpd", "sshd"]


@pytest.fixture(params=SERVERS)
def handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


class Nodes:
    """Makes coordinations of distinct nodes in one fresh directory; closes them all."""

    def __init__(self, handle: ServerHandle, tmp_path: Path) -> None:
        self.handle = handle
        self.tmp_path = tmp_path
        self.dir = f"{handle.fresh_dir()}/.ftpbc-cluster"
        self.made: list[ServerCoordination] = []

    def __call__(self, node_id: str, *, lease: float = 30.0, lock_expiry: float = 2.0,
                 now: Callable[[], float] | None = None) -> ServerCoordination:
        c = ServerCoordination(open_transport(self.handle.config()), self.dir, node_id, lease,
                               lock_expiry=lock_expiry, local_sequences=self.tmp_path / node_id,
                               host_time=now or time.time)
        self.made.append(c)
        return c

    def files(self, *parts: str) -> list[str]:
        d = self.handle.local("/".join((self.dir, *parts)))
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def close(self) -> None:
        for c in self.made:
            c.close()


@pytest.fixture
def nodes(handle: ServerHandle, tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(handle, tmp_path)
    try:
        yield n
    finally:
        n.close()


def holder(nodes: Nodes, key: str = "quote") -> str | None:
    """The node holding ``key``'s lock, from the server's files."""
    [token] = [t for name in nodes.files("locks", key) if (t := Token.parse(name)) is not None]
    return token.node


def cross(c: ServerCoordination, key: str = "quote") -> ServerLock:
    """The server part of a poll lock (the T_LOCK would serialise threads of this process)."""
    lock = c.poll_lock(key, "file").cross
    assert isinstance(lock, ServerLock)
    return lock


# ---------------------------------------------------------------------- locks

def test_lock_is_a_token_renamed_to_its_holder_and_back(nodes: Nodes) -> None:
    a, b = nodes("node-a"), nodes("node-b")
    la, lb = cross(a), cross(b)
    assert la.acquire(0)
    [held, marker] = nodes.files("locks", "quote")
    token = Token.parse(held)
    assert token is not None and token.node == "node-a" and token.run == a.run
    assert marker == f"token.{token.id}"
    # Its expiry is on the server's clock, lock_expiry ahead (the clock is known to a second).
    assert abs(token.expiry - (a.clock.now() + a.lock_expiry)) < 1.5
    assert not lb.acquire(0)
    la.release()
    assert nodes.files("locks", "quote") == [f"lock.{token.id}", marker]
    assert lb.acquire(0)
    assert holder(nodes) == "node-b"
    assert not la.acquire(0)
    lb.release()
    # mode none: the thread lock alone, nothing on the server
    assert a.poll_lock("other", "none").cross is None


def test_lock_mode_file_excludes_threads_of_one_process(nodes: Nodes) -> None:
    a = nodes("node-a")
    one, two = a.poll_lock("quote", "file"), a.poll_lock("quote", "file")
    with one.attempt() as held:
        assert held
        with two.attempt() as again:
            assert again is False  # the T_LOCK
    with two.attempt() as held:
        assert held


@pytest.mark.parametrize("handle", ["local", "pyftpdlib", "vsftpd"], indirect=True)
def test_nodes_racing_for_a_new_lock_never_hold_it_together(nodes: Nodes) -> None:
    """Four nodes start on a directory with no token: they all create one at once, and still
    only one holds the lock at any time; in the end one token is left."""
    racers = [cross(nodes(f"node-{i}")) for i in range(4)]
    holding: list[str] = []
    overlaps: list[list[str]] = []
    taken: Counter[int] = Counter()
    guard = threading.Lock()
    start = threading.Barrier(len(racers))
    stop_at = [0.0]

    def race(i: int, lock: ServerLock) -> None:
        start.wait()
        stop_at[0] = stop_at[0] or time.monotonic() + 3.0
        while time.monotonic() < stop_at[0]:
            if not lock.acquire(0):
                continue
            with guard:
                holding.append(f"node-{i}")
                if len(holding) > 1:
                    overlaps.append(list(holding))
            taken[i] += 1
            with guard:
                holding.remove(f"node-{i}")
            lock.release()

    with ThreadPoolExecutor(len(racers)) as pool:
        list(pool.map(race, range(len(racers)), racers))
    assert overlaps == []
    assert sum(taken.values()) >= 10, taken
    # A token created late beside a used one stays unused; the next node that lists the
    # directory while the other is free removes the extra one.
    late = cross(nodes("node-late"))
    wait_until(lambda: late.acquire(0), timeout=10, interval=0.05, what="the lock to be free")
    late.release()
    tokens = [t for name in nodes.files("locks", "quote") if (t := Token.parse(name)) is not None]
    assert len(tokens) == 1 and not tokens[0].held, tokens
    assert nodes.files("locks", "quote") == [tokens[0].name, f"token.{tokens[0].id}"]


@pytest.mark.parametrize("handle", ["local", "pyftpdlib"], indirect=True)
def test_an_extra_free_token_left_by_a_node_that_stopped_never_locks_the_others_out(nodes: Nodes) -> None:
    """Two nodes created a token each at once; the one with the larger id saw its token alone,
    used it and stopped using the lock.  The node that knows the smaller token takes the lock
    (removing the extra one), instead of giving its own back on every try."""
    a, b = nodes("node-a"), nodes("node-b")
    la, lb = cross(a), cross(b)
    assert lb.acquire(0)  # node-b makes the first token and holds it alone
    lb.release()
    [b_token] = [t.id for name in nodes.files("locks", "quote") if (t := Token.parse(name)) is not None]
    small = "0" * len(b_token)  # a token created at the same moment, with the smaller id
    directory = nodes.handle.local(f"{nodes.dir}/locks/quote")
    (directory / f"lock.{small}").write_bytes(b"")
    (directory / f"token.{small}").write_bytes(b"")
    la._token = small  # node-a created it, so node-a tries it first
    assert la.acquire(2.0), nodes.files("locks", "quote")
    assert holder(nodes) == "node-a"
    la.release()
    assert nodes.files("locks", "quote") == [f"lock.{small}", f"token.{small}"]
    assert lb.acquire(3.0)  # node-b finds its token gone (after a rescan) and takes the one left
    lb.release()


def test_abandoned_lock_is_taken_over_after_its_expiry_not_before(nodes: Nodes) -> None:
    a, b = nodes("node-a", lock_expiry=3.0), nodes("node-b", lock_expiry=3.0)
    la, lb = cross(a), cross(b)
    assert la.acquire(0)
    taken = time.monotonic()
    a.close()  # its renewer stops: from here on it is a holder that died without giving it back
    wait_until(lambda: lb.acquire(0), timeout=10, interval=0.05, what="node-b to take the lock over")
    waited = time.monotonic() - taken
    # lock_expiry 3 s on the server's clock, known to within its mtime's second
    assert 3.0 - 1.2 <= waited <= 3.0 + 2.5, waited
    assert holder(nodes) == "node-b"
    lb.release()


def test_live_holder_renews_its_lock(nodes: Nodes) -> None:
    a, b = nodes("node-a", lock_expiry=1.5), nodes("node-b", lock_expiry=1.5)
    la, lb = cross(a), cross(b)
    assert la.acquire(0)
    first = nodes.files("locks", "quote")
    taken = time.monotonic()
    refused = [0]

    def held_for_three_expiries() -> bool:
        assert not lb.acquire(0), "node-b took a lock its live holder kept renewing"
        refused[0] += 1
        return time.monotonic() - taken > 4.5

    wait_until(held_for_three_expiries, timeout=15, interval=0.1, what="4.5 s of a held lock")
    assert nodes.files("locks", "quote") != first  # renamed to later expiries
    la.release()
    assert lb.acquire(0)
    lb.release()


def test_clocks_of_hosts_may_differ(nodes: Nodes) -> None:
    """A node whose clock is an hour ahead and one whose clock is an hour behind agree on leases
    and lock expiries: every time compared is the server's."""
    ahead = nodes("ahead", lease=5.0, now=lambda: time.time() + 3600)
    behind = nodes("behind", lease=5.0, now=lambda: time.time() - 3600)
    ahead.heartbeat(1.0).beat()
    behind.heartbeat(1.0).beat()
    assert abs(ahead.clock.now() - behind.clock.now()) < 2.0
    assert not behind.is_dead("ahead") and not ahead.is_dead("behind")
    la, lb = cross(ahead), cross(behind)
    assert lb.acquire(0)
    assert not la.acquire(0)  # an hour ahead, it still sees the lock as held, not expired
    lb.release()


# ---------------------------------------------------------------------- heartbeats

def test_heartbeat_on_the_server_and_the_lease(nodes: Nodes) -> None:
    a, b = nodes("node-a", lease=3.0), nodes("node-b", lease=3.0)
    hb = a.heartbeat(1.0)
    hb.start()
    try:
        assert nodes.files("heartbeats") == ["node-a"]
        assert not b.is_dead("node-a")
        assert b.is_dead("node-z")
        assert a.clock.offset is not None and abs(a.clock.offset) < 2.0  # one machine
    finally:
        hb.stop(remove=False)
    # No beat any more: dead once the lease has passed, on the server's clock.
    stopped = time.monotonic()
    wait_until(lambda: b.is_dead("node-a"), timeout=10, interval=0.1, what="node-a's lease to end")
    assert time.monotonic() - stopped >= 3.0 - 2.0
    hb2 = a.heartbeat(1.0)
    hb2.start()
    assert not b.is_dead("node-a")
    hb2.stop()  # removed: dead at once
    assert nodes.files("heartbeats") == []
    assert b.is_dead("node-a")


def test_live_elsewhere_names_the_other_holder_of_a_node_id(nodes: Nodes) -> None:
    a = nodes("node-a")
    hb = a.heartbeat(1.0)
    hb.beat()
    assert a.live_elsewhere() is None  # this very process
    # The same id from another (simulated) host: its heartbeat says so.
    a.put_bytes(a.heartbeat_path("node-a"), b"4242 0 0 some-other-host\n")
    message = nodes("node-a").live_elsewhere()
    assert message is not None and "host some-other-host" in message and "--node-id" in message


# ---------------------------------------------------------------------- sequences

def test_sequences_are_files_whose_names_hold_their_values(nodes: Nodes) -> None:
    a, b = nodes("node-a"), nodes("node-b")
    assert [a.sequences.next("global", None, "ack") for _ in range(3)] == [0, 1, 2]
    assert nodes.files("sequences") == ["ack.3", "ack~created"]
    assert b.sequences.next("global", None, "ack") == 3
    assert a.sequences.next("global", None, "ack") == 4  # its remembered value was stale
    b.sequences.set("global", None, "ack", 100)
    assert a.sequences.get("global", None, "ack") == 100
    assert a.sequences.next("global", None, "ack") == 100
    # %{3} of an endpoint, %3 of this node (local, in journal_dir), and a name drawing both
    name = Pattern.parse("ACK_%{ack}_%{3}_%3").expand(ExpandContext(endpoint="quote", store=b.sequences))
    assert name.name == "ACK_101_0_0"
    infos = {(i.kind, i.endpoint, i.key): i.value for i in b.sequences.list()}
    assert infos == {("local", "quote", "3"): 1, ("shared", "quote", "3"): 1, ("global", None, "ack"): 102}
    assert str(b.sequences.path("global", None, "ack")).startswith(nodes.dir)


def test_sequence_drawn_by_racing_nodes_gives_each_value_once(nodes: Nodes) -> None:
    count, per = 4, 40
    coordinations = [nodes(f"node-{i}") for i in range(count)]
    start = threading.Barrier(count)

    def draw(c: ServerCoordination) -> list[int]:
        start.wait()
        return [c.sequences.next("global", None, "race") for _ in range(per)]

    with ThreadPoolExecutor(count) as pool:
        drawn = [v for values in pool.map(draw, coordinations) for v in values]
    assert sorted(drawn) == list(range(count * per))
    assert nodes.files("sequences") == [f"race.{count * per}", "race~created"]


# ---------------------------------------------------------------------- configuration and wiring

BASE = """
servers:
  a: {{url: "file:///tmp/x"}}
  b: {{url: "file:///tmp/y"}}
endpoints:
  quote: {{server: b, repository: /q}}
node:
  id: n1
{node}"""


def config(node: str) -> Config:
    return parse_config(BASE.format(node=node), source="ftpbc.yaml")


def test_configuration_errors_are_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        config("  coordination: server\n  coordination_dir: relative/dir\n")
    assert str(err.value).startswith("ftpbc.yaml:10: node.coordination_dir: ")
    assert "absolute" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"ftpbc.yaml:9: node.coordination: "):
        config("  coordination: nfs\n")
    with pytest.raises(ConfigError, match=r"coordination_server is only used with coordination: server"):
        config("  coordination_server: a\n")
    with pytest.raises(ConfigError, match=r"node.coordination_dir: .*'\.\.'"):
        config("  coordination: server\n  coordination_dir: /x/../y\n")
    with pytest.raises(ConfigError) as err:
        open_coordination(config("  coordination: server\n  coordination_server: c\n"), open_transport)
    assert str(err.value) == ("ftpbc.yaml: node.coordination_server: unknown server 'c' (defined: a, b)")


def test_coordination_server_defaults_to_the_first_endpoints(tmp_path: Path) -> None:
    c = open_coordination(config(f"  state_dir: {tmp_path}\n"), open_transport)
    assert isinstance(c, StateDirCoordination)
    c = open_coordination(config("  coordination: server\n"), open_transport)
    try:
        assert isinstance(c, ServerCoordination)
        assert c.where == "server file:///tmp/y/.ftpbc-cluster" and c.dir == "/.ftpbc-cluster"
    finally:
        c.close()
    c = open_coordination(config("  coordination: server\n  coordination_server: a\n"
                                 "  coordination_dir: /cluster/./x/\n"), open_transport)
    try:
        assert isinstance(c, ServerCoordination) and c.where == "server file:///tmp/x/cluster/x"
    finally:
        c.close()


def _config(handle: ServerHandle, tmp_path: Path, node_id: str, **endpoint: Any) -> Config:
    return Config.model_validate({
        "node": {"id": node_id, "state_dir": str(tmp_path / node_id / "state"),
                 "journal_dir": str(tmp_path / node_id / "journals"), "coordination": "server",
                 "coordination_dir": f"{endpoint.pop('base')}/.cluster", "heartbeat_interval": 1,
                 "lease": 10},
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {"echo": {"server": "srv", **endpoint}},
    })


@pytest.mark.parametrize("handle", ["pyftpdlib", "sshd"], indirect=True)
def test_nodes_and_clients_with_coordination_server(handle: ServerHandle, tmp_path: Path) -> None:
    """Two nodes and a client, each with a private state_dir: the locks, heartbeats and the
    cluster-wide sequence of the message names are on the server, nothing is in state_dir."""
    base = handle.fresh_dir()
    endpoint = {"base": base, "repository": f"{base}/echo", "handler": "examples.handlers:echo",
                "poll_interval": 0.05, "workers": 2, "message_name": "%{msgs}-%u"}
    configs = [_config(handle, tmp_path, n, **dict(endpoint)) for n in ("node-a", "node-b", "client")]
    with Node(configs[0]) as a, Node(configs[1]) as b, Client(configs[2]) as client:
        assert isinstance(a.runtime.coordination, ServerCoordination)
        replies = [client.request("echo", f"hello {i}", timeout=30) for i in range(20)]
        cluster = handle.local(f"{base}/.cluster")
        assert sorted(p.name for p in (cluster / "heartbeats").iterdir()) == ["client", "node-a", "node-b"]
        assert sorted(p.name for p in (cluster / "locks").iterdir()) == ["echo", "echo.sweep"] or \
            sorted(p.name for p in (cluster / "locks").iterdir()) == ["echo"]
        assert sorted(p.name for p in (cluster / "sequences").iterdir()) == ["msgs.20", "msgs~created"]
        assert b.node_id == "node-b"
    assert replies == [f"hello {i}".encode() for i in range(20)]
    archived = sorted(p.name.split("-", 1)[0] for p in handle.local(f"{base}/echo/inarchive").iterdir())
    assert archived == sorted(f"req.{i}" for i in range(20))
    for n in ("node-a", "node-b", "client"):
        state = tmp_path / n / "state"
        assert not state.exists() or list(state.iterdir()) == [], f"{n} wrote into its state_dir"
    assert sorted(p.name for p in (handle.local(f"{base}/.cluster") / "heartbeats").iterdir()) == []


def test_runtime_state_dir_coordination_is_unchanged(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    cfg = Config.model_validate({
        "node": {"id": "n1", "state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "j")},
        "servers": {"srv": pyftpdlib_server.config(name="srv")},
        "endpoints": {"echo": {"server": "srv", "repository": "/r"}},
    })
    runtime = Runtime(cfg)
    try:
        c = runtime.coordination
        assert isinstance(c, StateDirCoordination)
        lock = c.poll_lock("echo", "file")
        assert isinstance(lock, PollLock)
        with lock.attempt() as held:
            assert held and (tmp_path / "state" / "locks" / "echo.lock").exists()
        assert runtime.sequences.next("global", None, "x") == 0
        assert (tmp_path / "state" / "sequences" / "x").read_text() == "1\n"
        assert c.is_dead("nobody")
    finally:
        runtime.close()
