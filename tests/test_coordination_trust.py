"""``coordination: server`` does not trust what is written in the coordination directory.

Whoever can write there (the threat model of docs/security.md) may plant any name or time: a
lock held "until the year 5000", a heartbeat from the future, a sequence file that holds no
value.  On real servers, the files planted through the server's own directory, each test shows
that a node is neither stalled for ever, nor kept looking alive, nor crashed or looping.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.cluster.server import CLOCK_SLACK, MAX_VALUE, ServerCoordination, ServerLock, Token, beat_stamp
from ftpbc.errors import SequenceError
from ftpbc.transport import open_transport
from tests.servers.handle import ServerHandle
from tests.support import wait_until

SERVERS = ["pyftpdlib", "vsftpd", "sshd"]
EXPIRY = 2.0
LEASE = 3.0


@pytest.fixture(params=SERVERS)
def handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


class Nodes:
    """Coordinations of distinct nodes in one fresh directory, and the directory's files as the
    server keeps them (what an attacker with write access plants)."""

    def __init__(self, handle: ServerHandle, tmp_path: Path) -> None:
        self.handle = handle
        self.tmp_path = tmp_path
        self.dir = f"{handle.fresh_dir()}/.ftpbc-cluster"
        self.made: list[ServerCoordination] = []

    def __call__(self, node_id: str) -> ServerCoordination:
        c = ServerCoordination(open_transport(self.handle.config()), self.dir, node_id, LEASE,
                               lock_expiry=EXPIRY, local_sequences=self.tmp_path / node_id)
        self.made.append(c)
        return c

    def local(self, *parts: str) -> Path:
        return self.handle.local("/".join((self.dir, *parts)))

    def files(self, *parts: str) -> list[str]:
        d = self.local(*parts)
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


@pytest.fixture
def nodes(handle: ServerHandle, tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(handle, tmp_path)
    try:
        yield n
    finally:
        for c in n.made:
            c.close()


def cross(c: ServerCoordination) -> ServerLock:
    lock = c.poll_lock("echo", "file").cross
    assert isinstance(lock, ServerLock)
    return lock


# ---------------------------------------------------------------------- locks

@pytest.mark.parametrize("forged", ["{lock}~ghost+1~99999999999999", "{lock}~ghost"],
                         ids=["expiry-in-the-year-5138", "garbled-name"])
def test_a_forged_lock_name_is_taken_over_within_lock_expiry(nodes: Nodes, forged: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    maker = cross(nodes("node-a"))
    assert maker.acquire(0)
    maker.release()
    [free] = [n for n in nodes.files("locks", "echo") if n.startswith("lock.")]
    name = forged.format(lock=free)
    nodes.local("locks", "echo", free).rename(nodes.local("locks", "echo", name))

    lb = cross(nodes("node-b"))
    caplog.set_level(logging.WARNING, logger="ftpbc.cluster")
    assert not lb.acquire(0)  # first seen now: held, for lock_expiry at most
    seen = time.monotonic()
    wait_until(lambda: lb.acquire(0), timeout=EXPIRY + CLOCK_SLACK + 5, interval=0.05,
               what="node-b to take the forged lock over")
    waited = time.monotonic() - seen
    # believed for lock_expiry + the slack after node-b first listed it (clock known to ~1 s)
    assert EXPIRY - 1.2 <= waited <= EXPIRY + CLOCK_SLACK + 2.5, waited
    [held] = [t for n in nodes.files("locks", "echo") if (t := Token.parse(n)) is not None]
    assert held.node == "node-b"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one warning, not one per poll
    assert name in warnings[0] and "took over" in warnings[0]
    if "+1~" in name:
        assert "node ghost (process 1), without a live heartbeat" in warnings[0]
    lb.release()
    # Given back under a name of its own: an ordinary lock again.
    assert cross(nodes("node-c")).acquire(0)


def test_a_lock_file_deleted_under_its_marker_is_replaced(nodes: Nodes,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    maker = cross(nodes("node-a"))
    assert maker.acquire(0)
    maker.release()
    [free] = [n for n in nodes.files("locks", "echo") if n.startswith("lock.")]
    nodes.local("locks", "echo", free).unlink()  # its marker stays: "in use, out of sight"

    lb = cross(nodes("node-b"))
    caplog.set_level(logging.WARNING, logger="ftpbc.cluster")
    assert not lb.acquire(0)
    wait_until(lambda: lb.acquire(0), timeout=EXPIRY + CLOCK_SLACK + 8, interval=0.05,
               what="node-b to replace the lost token")
    files = nodes.files("locks", "echo")
    assert f"token.{free[5:]}" not in files and len(files) == 2, files
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"token {free[5:]} is gone" in warnings[0], warnings
    lb.release()


# ---------------------------------------------------------------------- heartbeats

def test_a_heartbeat_from_the_future_dies_after_the_lease(nodes: Nodes) -> None:
    a = nodes("node-a")
    a.heartbeat(1.0).beat()  # one beat, then no more
    far = time.time() + 10 * 365 * 86400
    os.utime(nodes.local("heartbeats", "node-a"), (far, far))
    b = nodes("node-b")
    assert not b.is_dead("node-a")  # counted as written now, when first seen
    seen = time.monotonic()
    wait_until(lambda: b.is_dead("node-a"), timeout=LEASE + CLOCK_SLACK + 5, interval=0.1,
               what="the future heartbeat to go stale")
    assert time.monotonic() - seen >= LEASE - 1.2
    [info] = b.heartbeats()
    assert info.node_id == "node-a" and not info.alive
    # A real beat afterwards is judged afresh: alive again.
    a.heartbeat(1.0).beat()
    assert not b.is_dead("node-a")


def test_a_heartbeat_line_claiming_no_finite_time_is_old() -> None:
    """Servers without file times: the beat's own line gives its time; nan or inf is none."""
    assert beat_stamp("1 2 nan host\n") == 0.0
    assert beat_stamp("1 2 inf host\n") == 0.0
    assert beat_stamp("garbage") == 0.0
    assert beat_stamp("1 2 1700000000.5 host\n") == 1700000000.5


# ---------------------------------------------------------------------- sequences

def draw(c: ServerCoordination) -> int:
    return c.sequences.next("global", None, "ack")


@pytest.mark.parametrize("planted", ["ack.0001", "ack.x", "ack.99999999999999999999"])
def test_a_sequence_value_that_is_no_value_fails_the_draw_naming_it(nodes: Nodes, planted: str) -> None:
    a = nodes("node-a")
    assert draw(a) == 0
    nodes.local("sequences", "ack.1").rename(nodes.local("sequences", planted))
    b = nodes("node-b")
    started = time.monotonic()
    with pytest.raises(SequenceError) as err:
        draw(b)
    assert time.monotonic() - started < 10  # not the lock timeout (30 s), not for ever
    message = str(err.value)
    assert "\n" not in message and f"'{planted}'" in message and "/sequences/ack" in message
    # Setting the sequence repairs it; the planted file is no value and stays ignored.
    b.sequences.set("global", None, "ack", 7)
    assert draw(b) == 7 and draw(a) == 8


def test_a_sequence_at_its_largest_value_fails_the_draw(nodes: Nodes) -> None:
    a = nodes("node-a")
    assert draw(a) == 0
    nodes.local("sequences", "ack.1").rename(nodes.local("sequences", f"ack.{MAX_VALUE}"))
    with pytest.raises(SequenceError, match=f"ack.{MAX_VALUE}: the sequence is at its largest value"):
        draw(nodes("node-b"))
    with pytest.raises(SequenceError, match="value must be 0 to"):
        a.sequences.set("global", None, "ack", MAX_VALUE + 1)
