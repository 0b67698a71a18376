"""Browsing: ``Client.browse`` and ``ftpbc browse`` show the messages waiting in an inbox in the
order a serving node takes them (priority, then arrival), through a selector and a limit, with
their bodies if asked, and claim, move or change none of them."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.exchange.browse import Waiting
from ftpbc.exchange.layout import delivery_order
from tests.cluster import Started, in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, run_ftpbc

#: (priority, region) of the messages sent, in the order they arrive
SENT = [(4, "eu"), (9, "us"), (0, "eu"), (4, "us"), (9, "eu"), (7, "eu"), (0, "us"), (4, "eu"),
        (9, "us"), (7, "us"), (4, "eu"), (0, "eu")]
#: arrival times (file times) a minute apart within the last hour: vsftpd's LIST shows a recent
#: file's time to the minute (an older one's to the day)
FIRST = int(time.time()) // 60 * 60 - 3600
STEP = 60


@pytest.fixture
def started() -> Iterator[Started]:
    with Started() as s:
        yield s


def _fill(handle: ServerHandle, client: Client) -> list[str]:
    """Send SENT (body ``body <i>``, property ``n = i``) with file times in sending order; return
    the ids in the order a provider takes them: priority down, then arrival."""
    ids = []
    for i, (priority, region) in enumerate(SENT):
        path = client.send("ep", f"body {i}".encode(), priority=priority,
                           properties={"n": i, "region": region})
        os.utime(handle.local(path), (FIRST + STEP * i, FIRST + STEP * i))
        ids.append(path.rsplit("/", 1)[-1].split(";")[0].removeprefix("msg."))
    order = sorted(range(len(SENT)), key=lambda i: (-SENT[i][0], i))
    return [ids[i] for i in order]


def _tree(handle: ServerHandle, repo: str) -> list[tuple[str, int, int]]:
    """Every file under the exchange area: path, size, modification time (ns)."""
    root = handle.local(repo)
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*") if p.is_file())


def _index(w: Waiting) -> int:
    n = w.envelope.properties["n"]
    assert isinstance(n, int)
    return n


def test_browse_shows_the_waiting_messages_in_delivery_order_and_moves_nothing(
        server: ServerHandle, tmp_path: Path, started: Started) -> None:
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(in_process_config(server, tmp_path, "cli", {"ep": {"repository": repo}})))
    expected = _fill(server, client)
    client.send("ep", b"late", ttl=0.001)  # expires on its way: never delivered, so not shown
    before = _tree(server, repo)

    everything = client.browse("ep")
    assert [w.id for w in everything] == expected
    assert [w.envelope.headers.priority for w in everything] == sorted((p for p, _ in SENT), reverse=True)
    # exactly the order a provider's listing has (its backlog before the claim window)
    assert [w.id for w in everything] == [c.uuid for c in client.runtime.lifecycle("ep").waiting()
                                          if c.envelope.properties.get("n") is not None]
    assert all(w.body is None for w in everything)

    eu = [w.id for w in everything if w.envelope.properties["region"] == "eu"]
    selected = client.browse("ep", selector="region = 'eu' AND JMSPriority >= 4", limit=3)
    assert [w.id for w in selected] == [i for i in eu if i in {w.id for w in everything
                                                               if w.envelope.headers.priority >= 4}][:3]
    assert client.browse("ep", limit=0) == []
    assert client.browse("ep", selector="region = 'nowhere'") == []

    with_bodies = client.browse("ep", bodies=True, limit=5)
    assert [w.id for w in with_bodies] == expected[:5]
    assert [w.body for w in with_bodies] == [f"body {_index(w)}".encode() for w in with_bodies]

    assert _tree(server, repo) == before  # nothing claimed, moved, renamed or touched


def test_ftpbc_browse_command(pyftpdlib_server: ServerHandle, tmp_path: Path, started: Started) -> None:
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {"ep": {"repository": repo}})
    client = started.add(Client(in_process_config(handle, tmp_path, "cli", {"ep": {"repository": repo}})))
    expected = _fill(handle, client)
    client.send("ep", b"\x00\xff", priority=0, properties={"n": 99, "region": "bin"})
    before = _tree(handle, repo)
    env = ftpbc_env()

    def browse(*args: str) -> tuple[int, str, str]:
        done = run_ftpbc("browse", "-c", str(cfg), "--node-id", "ops", "ep", *args, env=env)
        return done.returncode, done.stdout, done.stderr

    rc, out, err = browse("--json")
    assert rc == 0, err
    listed = json.loads(out)
    assert [m["id"] for m in listed][:len(expected)] == expected
    assert listed[0]["headers"]["priority"] == 9 and listed[0]["properties"]["region"] == "us"
    assert "body" not in listed[0] and listed[0]["size"] == len(b"body 1")
    assert len(listed) == len(SENT) + 1

    rc, out, err = browse("--json", "--bodies", "--selector", "region IN ('eu', 'bin')", "--limit", "4")
    assert rc == 0, err
    shown = json.loads(out)
    assert [m["properties"]["region"] for m in shown] == ["eu"] * 4
    assert [m["body"] for m in shown] == [f"body {m['properties']['n']}" for m in shown]
    rc, out, err = browse("--json", "--bodies", "--selector", "region = 'bin'")
    assert [m.get("body_base64") for m in json.loads(out)] == ["AP8="]

    rc, out, err = browse("--bodies", "--limit", "2")
    assert rc == 0, err
    header, *lines = out.splitlines()
    assert header.split("\t") == ["id", "mtime", "size", "headers"]
    assert lines[0].split("\t")[0] == expected[0] and "priority=9" in lines[0]
    assert len(lines[0].split("\t")) == len(header.split("\t"))
    assert lines[1] == "    body 1"
    assert lines[2].split("\t")[0] == expected[1]
    assert "2 message(s) waiting in ep" in err

    rc, out, err = browse("--selector", "region = ")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "column" in err

    assert _tree(handle, repo) == before


def _fill_large(inbox: Path, count: int) -> None:
    """``count`` one-way messages written straight into the inbox, each a second older than the
    next: priority 9 for the last three, 7 for every 250th, 0 for every 3rd, 4 (unnamed) else."""
    first = FIRST - count
    for i in range(count):
        priority = 9 if i >= count - 3 else 7 if i % 250 == 0 else 0 if i % 3 == 0 else 4
        path = inbox / f"msg.{uuid.uuid4()}{'' if priority == 4 else f';p={priority}'}"
        path.write_bytes(b"x")
        os.utime(path, (first + i, first + i))


def test_browse_of_a_large_inbox_keeps_only_the_limit(server: ServerHandle, tmp_path: Path,
                                                      started: Started) -> None:
    """5,000 messages, limit 10: the first 10 in delivery order (the three priority-9 ones,
    then the oldest priority-7 ones), the same through a selector; and (where the transport
    streams its listing) what the browse holds stays small beside an unlimited browse."""
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(in_process_config(server, tmp_path, "cli", {"ep": {"repository": repo}})))
    lc = client.runtime.lifecycle("ep")  # creates the exchange area
    _fill_large(server.local(f"{repo}/inbox"), 5000)
    # The reference: the provider's own listing, every message, put in delivery order here.
    every = sorted(lc.listing().candidates, key=delivery_order)
    assert len(every) == 5000

    ten = client.browse("ep", limit=10)
    assert [w.name for w in ten] == [c.name for c in every[:10]]
    assert [w.envelope.headers.priority for w in ten] == [9, 9, 9] + [7] * 7
    low = client.browse("ep", selector="JMSPriority < 4", limit=10)
    assert [w.name for w in low] == [c.name for c in every if c.envelope.headers.priority < 4][:10]
    with_bodies = client.browse("ep", limit=10, bodies=True)
    assert [w.name for w in with_bodies] == [w.name for w in ten]
    assert all(w.body == b"x" for w in with_bodies)

    def peak(limit: int | None) -> int:
        tracemalloc.start()
        try:
            client.browse("ep", limit=limit)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    # The layout's cache of decoded names is warm by now (it is the same for both): what differs
    # is what the browse itself holds of the listing.  Over FTP the transport holds the
    # listing's text while it parses it (bounded by max_listing_entries), the same for both:
    # only the streaming transports show the browse's own share alone.
    if server.kind in ("local", "sshd"):
        assert peak(10) * 4 < peak(None)
