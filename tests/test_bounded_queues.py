"""Bounded queues: ``max_messages`` / ``max_bytes`` with ``on_overflow: reject`` (QueueFull,
nothing left behind, ``ftpbc send``/``request`` exit 6) or ``dead_letter`` (filed in indead with
its reason, journaled like any send); and the bound that docs/queues.md states for producers
racing: one producer never passes it, N producers pass it by N-1 at most."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.errors import QueueFull
from ftpbc.journal import Journal
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import area_files, ftpbc_env, run_ftpbc
from tests.test_dlq import FAST


def _client(handle: ServerHandle, tmp_path: Path, node_id: str, endpoints: dict[str, dict[str, Any]],
            things: list[Any]) -> Client:
    client = Client(in_process_config(handle, tmp_path, node_id, endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")  # the exchange area, made before the tests look at it
    return client


def _left_behind(handle: ServerHandle, repo: str, client: Client) -> list[str]:
    """What a refused send could have left: staged files, dead letters, journal operations."""
    pending = [op.op_id for op in client.runtime.journal.endpoint("ep").pending()]
    return area_files(handle, repo, "instage") + area_files(handle, repo, "indead") + pending


def test_reject_at_the_bound_leaves_nothing_behind(server: ServerHandle, tmp_path: Path,
                                                   things: list[Any]) -> None:
    repo = f"{server.fresh_dir()}/ep"
    client = _client(server, tmp_path, "cli", {"ep": {"repository": repo, **FAST, "max_messages": 3}}, things)
    for i in range(3):
        client.send("ep", f"m{i}")
    with pytest.raises(QueueFull) as full:
        client.send("ep", b"one too many", priority=9)
    err = full.value
    assert (err.endpoint, err.limit, err.bound, err.messages, err.filed) == ("ep", "max_messages", 3, 3, None)
    assert "'ep'" in str(err) and "max_messages is 3" in str(err) and "3 message(s)" in str(err)
    # every way of sending is refused alike, the request at once rather than after its timeout
    with pytest.raises(QueueFull):
        client.submit("ep", b"x")
    with pytest.raises(QueueFull):
        client.request("ep", b"x", timeout=30)
    assert len(area_files(server, repo, "inbox")) == 3
    assert _left_behind(server, repo, client) == []
    # counted again at every send, never from memory: a message taken makes room at once
    server.local(f"{repo}/inbox/{area_files(server, repo, 'inbox')[0]}").unlink()
    client.send("ep", b"fits again")
    assert len(area_files(server, repo, "inbox")) == 3


def test_max_bytes_is_counted_from_listed_sizes(server: ServerHandle, tmp_path: Path,
                                                things: list[Any]) -> None:
    """Sizes come from the listing: a message another producer put there counts; a foreign
    file the endpoint leaves untouched does not; this message's own bytes count."""
    repo = f"{server.fresh_dir()}/ep"
    client = _client(server, tmp_path, "cli", {"ep": {"repository": repo, **FAST, "max_bytes": 100}}, things)
    inbox = server.local(f"{repo}/inbox")
    (inbox / f"msg.{uuid.uuid4()}").write_bytes(b"f" * 50)  # a foreign producer's message
    (inbox / "notes.txt").write_bytes(b"n" * 1000)  # not a message of the endpoint
    with pytest.raises(QueueFull) as full:
        client.send("ep", b"x" * 51)
    err = full.value
    assert (err.limit, err.bound, err.messages, err.waiting_bytes, err.size) == ("max_bytes", 100, 1, 50, 51)
    assert "this message has 51 bytes" in str(err)
    client.send("ep", b"x" * 50)  # exactly max_bytes with it
    with pytest.raises(QueueFull) as again:
        client.send("ep", b"y")
    assert (again.value.messages, again.value.waiting_bytes) == (2, 100)
    assert len(area_files(server, repo, "inbox")) == 3 and _left_behind(server, repo, client) == []


def test_dead_letter_at_the_bound_lands_in_indead_with_its_reason(server: ServerHandle, tmp_path: Path,
                                                                  things: list[Any]) -> None:
    repo = f"{server.fresh_dir()}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "max_messages": 1, "on_overflow": "dead_letter"}}
    client = _client(server, tmp_path, "cli", endpoints, things)
    first = client.send("ep", b"first")
    assert first.startswith(f"{repo}/inbox/")
    where = client.send("ep", b"overflowed", priority=7, properties={"region": "eu"})
    assert where.startswith(f"{repo}/indead/")
    letter = where.rsplit("/", 1)[1]
    # the original headers stay in the name: <name>~<node>~<stamp>
    assert letter.startswith("msg.") and ";p=7;.regionS=eu~cli~" in letter
    assert area_files(server, repo, "indead") == [letter, letter + ".reason"]
    reason = server.local(f"{repo}/indead/{letter}.reason").read_text()
    assert reason.startswith("overflow: 1 message(s)") and "max_messages is 1" in reason
    assert server.local(f"{repo}/indead/{letter}").read_bytes() == b"overflowed"
    # a request is filed too, and its caller told at once (no reply can come)
    with pytest.raises(QueueFull) as full:
        client.request("ep", b"asked", timeout=30)
    assert full.value.filed is not None and full.value.filed.startswith(f"{repo}/indead/req.")
    [d1, d2] = client.dead_letters("ep").listing()
    assert d1.reason is not None and d1.reason.startswith("overflow: ")
    assert d2.reason is not None and d2.reason.startswith("overflow: ")
    assert d1.envelope is not None and d1.envelope.headers.priority == 7
    assert d1.envelope.properties == {"region": "eu"}
    assert area_files(server, repo, "inbox") == [first.rsplit("/", 1)[1]]
    assert not area_files(server, repo, "instage") and client.runtime.journal.endpoint("ep").pending() == []


def test_cli_exit_status_and_dlq_reason(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {
        "rej": {"repository": f"{base}/rej", "max_messages": 1},
        "ep": {"repository": f"{base}/ep", "max_messages": 1, "on_overflow": "dead_letter"}})
    env = ftpbc_env()

    def ftpbc(*args: str) -> Any:
        return run_ftpbc(args[0], "-c", str(cfg), "--node-id", "cli", *args[1:], env=env)

    assert ftpbc("send", "rej", "--data", "a").returncode == 0
    for command in (("send", "rej", "--data", "b"), ("request", "rej", "--data", "c", "--timeout", "30")):
        refused = ftpbc(*command)
        assert refused.returncode == 6, refused.stderr
        assert refused.stderr.startswith("ftpbc: queue full: ") and "max_messages is 1" in refused.stderr
        assert refused.stdout == ""
    assert len(area_files(handle, f"{base}/rej", "inbox")) == 1
    assert not area_files(handle, f"{base}/rej", "instage")
    for name in ("send", "request"):
        shown = run_ftpbc(name, "--help", env=env)
        assert shown.returncode == 0 and "6 when the endpoint's queue" in " ".join(shown.stdout.split())
    # dead_letter: a one-way message is filed (exit 0, its indead path printed), a request exits 6
    assert ftpbc("send", "ep", "--data", "a").returncode == 0
    filed = ftpbc("send", "ep", "--data", "b", "--priority", "8")
    assert filed.returncode == 0 and f"{base}/ep/indead/" in filed.stdout
    asked = ftpbc("request", "ep", "--data", "c", "--timeout", "30")
    assert asked.returncode == 6 and "filed as a dead letter" in asked.stderr
    listed = run_ftpbc("dlq", "list", "-c", str(cfg), "--node-id", "ops", "ep", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 2 and all(r["reason"].startswith("overflow: ") for r in rows)
    assert sorted(r["headers"]["kind"] for r in rows) == ["oneway", "request"]


@pytest.mark.parametrize("point", ["send.after-put", "send.after-expose"])
def test_a_dead_letter_send_killed_is_recovered_like_any_send(pyftpdlib_server: ServerHandle,
                                                              tmp_path: Path, point: str) -> None:
    """Killed after its upload: rolled back (nothing filed, nothing staged).  Killed once it is
    in indead, before its reason file: recovery writes the reason."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path,
                       {"ep": {"repository": repo, "max_messages": 1, "on_overflow": "dead_letter"}})
    assert run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "a",
                     env=ftpbc_env()).returncode == 0
    killed = run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "b",
                       env=ftpbc_env({"FTPBC_CRASH_AT": point}))
    assert killed.returncode == -9, killed.stderr
    recovered = run_ftpbc("recover", "-c", str(cfg), "--node-id", "cli", env=ftpbc_env())
    assert recovered.returncode == 0, recovered.stderr
    dead = area_files(handle, repo, "indead")
    if point == "send.after-put":
        assert dead == [] and "rolled back" in recovered.stdout
    else:
        assert len(dead) == 2 and dead[1] == dead[0] + ".reason" and "reason file written" in recovered.stdout
        assert (handle.local(f"{repo}/indead") / dead[1]).read_text().startswith("overflow: ")
    assert not area_files(handle, repo, "instage") and len(area_files(handle, repo, "inbox")) == 1
    journal = Journal(tmp_path / "journals", "cli")
    try:
        assert journal.all_pending() == {}
    finally:
        journal.close()


def _fill(clients: list[Client], threads_each: int) -> list[int]:
    """Every thread of every client sends until it is refused, all starting at once; how many
    each sent."""
    sent = [0] * (len(clients) * threads_each)
    start = threading.Barrier(len(sent))
    failures: list[BaseException] = []

    def produce(slot: int, client: Client) -> None:
        try:
            start.wait(timeout=30)
            while True:
                client.send("ep", f"{slot}-{sent[slot]}")
                sent[slot] += 1
        except QueueFull:
            return
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    workers = [threading.Thread(target=produce, args=(i, clients[i // threads_each]))
               for i in range(len(sent))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a producer is stuck"
    assert not failures, failures
    return sent


def test_concurrent_producers_overshoot_by_s_minus_1_at_most(server: ServerHandle, tmp_path: Path,
                                                             things: list[Any]) -> None:
    """docs/queues.md: the threads of one Client are one producer and never pass the bound;
    producers racing pass it by S-1 at most, S the sends in flight at once (N-1 for N
    single-threaded clients); producers that send until refused never leave it short."""
    limit = 20

    def race(name: str, clients: int, threads_each: int) -> int:
        repo = f"{server.fresh_dir()}/{name}"
        endpoints = {"ep": {"repository": repo, **FAST, "max_messages": limit}}
        sent = _fill([_client(server, tmp_path, f"{name}{i}", endpoints, things) for i in range(clients)],
                     threads_each)
        depth = len(area_files(server, repo, "inbox"))
        assert depth == sum(sent), sent  # every send that returned is in the inbox, no other
        assert not area_files(server, repo, "instage") and not area_files(server, repo, "indead")
        return depth

    assert race("solo", 1, 8) == limit
    assert limit <= race("four", 4, 1) <= limit + 4 - 1
    assert limit <= race("pairs", 4, 2) <= limit + 8 - 1


def test_a_transaction_counts_against_the_bound_all_or_none(server: ServerHandle, tmp_path: Path,
                                                            things: list[Any]) -> None:
    """A transaction's members are counted at commit, before its commit record, every member of
    an endpoint on one listing: all fit and it commits, or QueueFull and the whole transaction
    is rolled back (its members to other endpoints too), with ``on_overflow: dead_letter`` as
    well: a transaction cannot file one member and expose the others."""
    base = server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST, "max_messages": 3},
                 "dl": {"repository": f"{base}/dl", **FAST, "max_bytes": 10, "on_overflow": "dead_letter"},
                 "free": {"repository": f"{base}/free", **FAST}}
    client = _client(server, tmp_path, "cli", endpoints, things)
    for ep in endpoints:
        client.runtime.lifecycle(ep)
    client.send("ep", b"waiting")

    def nothing_left() -> bool:
        pending = client.runtime.journal.all_pending()
        return not pending and not any(area_files(server, f"{base}/{ep}", d)
                                       for ep in endpoints for d in ("instage", "indead"))

    # three more for ep would be four: refused as a whole, free's member rolled back with them
    with pytest.raises(QueueFull) as full, client.transaction() as tx:
        tx.send("free", b"other endpoint")
        for i in range(3):
            tx.send("ep", f"m{i}")
    assert tx.state == "rolled back"
    err = full.value
    # the third member found the listed one plus the two members before it
    assert (err.endpoint, err.limit, err.bound, err.messages, err.filed) == ("ep", "max_messages", 3, 3, None)
    assert len(area_files(server, f"{base}/ep", "inbox")) == 1
    assert area_files(server, f"{base}/free", "inbox") == []
    assert nothing_left()
    # two fit exactly
    with client.transaction() as tx:
        tx.send("ep", b"a")
        tx.submit("ep", b"b")
    assert tx.state == "done" and len(area_files(server, f"{base}/ep", "inbox")) == 3
    # max_bytes with dead_letter: 6 + 6 bytes pass 10, so the transaction is refused, nothing filed
    with pytest.raises(QueueFull) as over, client.transaction() as tx:
        tx.send("dl", b"123456")
        tx.send("dl", b"abcdef")
    refused = over.value
    assert (refused.limit, refused.waiting_bytes, refused.size, refused.filed) == ("max_bytes", 6, 6, None)
    assert area_files(server, f"{base}/dl", "inbox") == [] and nothing_left()
    # by hand: commit() raises, and the transaction is over
    tx = client.transaction()
    tx.send("ep", b"no room")
    with pytest.raises(QueueFull):
        tx.commit()
    assert tx.state == "rolled back" and len(area_files(server, f"{base}/ep", "inbox")) == 3
    assert nothing_left()
    client.send("dl", b"1234567890")  # the bound itself: a single send still fits exactly
