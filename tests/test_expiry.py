"""Expiry: a message past its expiration is never delivered.  Providers file it (inexpired, or
indead with ``expired: dead_letter``) with its reason, a request's caller gets RequestExpired
(``ftpbc request`` exits 5), and a sweep files what no provider took."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.errors import RequestExpired
from ftpbc.journal import Journal
from ftpbc.model.envelope import EXPIRED_TYPE, FtpbcCodec
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, area_files, drop_message, ftpbc_env, run_ftpbc, wait_until

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}
PAST = "20200101T000000.000Z"


def test_expired_messages_are_never_delivered(server: ServerHandle, tmp_path: Path,
                                              things: list[Any]) -> None:
    base = server.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST}}
    client = Client(in_process_config(server, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")  # the exchange area
    # A one-way message and a request that expired before any provider saw them, beside a
    # live message.
    stale = f"msg.{uuid.uuid4()};e={PAST}"
    drop_message(server, repo, stale, b"stale")
    uid = str(uuid.uuid4())
    drop_message(server, repo, f"req.{uid};e={PAST}", b"stale request")
    seen = Seen()
    node = Node(in_process_config(server, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    with pytest.raises(RequestExpired) as caught:
        client.collect("ep", uid)
    assert caught.value.request == uid and "expired at 2020-01-01T00:00:00.000+00:00" in caught.value.reason
    # A request whose ttl runs out before it reaches the inbox (the expiration is set before the
    # upload starts, and the name keeps it to the millisecond): expired when first listed.
    with pytest.raises(RequestExpired):
        client.request("ep", b"too late", ttl=0.001)
    assert client.request("ep", b"fresh", ttl=60) == b"fresh"
    wait_until(lambda: len(area_files(server, repo, "inexpired")) == 6, what="three expired messages filed")
    assert seen.bodies == [b"fresh"]
    filed = area_files(server, repo, "inexpired")
    assert any(n.startswith(f"{stale}~prov~") and not n.endswith(".reason") for n in filed)
    reasons = [n for n in filed if n.endswith(".reason")]
    text = (server.local(f"{repo}/inexpired") / reasons[0]).read_text()
    assert "expired at" in text and "never delivered" in text
    assert not area_files(server, repo, "inbox") and not area_files(server, repo, "inselect")
    assert not area_files(server, repo, "inerror") and not area_files(server, repo, "indead")
    # The expiry replies were collected like any response; nothing is pending anywhere.
    collected = area_files(server, repo, "outarchive")
    assert len(collected) == 3
    node.stop(drain_timeout=5)
    things.remove(node)
    client.close()
    things.remove(client)
    for node_id in ("prov", "cli"):
        journal = Journal(tmp_path / "journals", node_id)
        try:
            assert journal.all_pending() == {}
        finally:
            journal.close()


def test_expired_dead_letter_keeps_the_message_in_indead(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                         things: list[Any]) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "expired": "dead_letter"}}
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")
    stale = f"msg.{uuid.uuid4()};p=7;e={PAST};.regionS=eu"
    drop_message(handle, repo, stale, b"keep me")
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    wait_until(lambda: len(area_files(handle, repo, "indead")) == 2, what="the dead letter")
    letter, reason = area_files(handle, repo, "indead")
    assert letter.startswith(f"{stale}~prov~") and reason == letter + ".reason"
    assert (handle.local(f"{repo}/indead") / letter).read_bytes() == b"keep me"
    assert "expired at" in (handle.local(f"{repo}/indead") / reason).read_text()
    assert not area_files(handle, repo, "inexpired") and not seen.bodies


def test_a_sweep_files_expired_messages_from_a_listing(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                       things: list[Any]) -> None:
    """What the sweeper runs: a listing leaves expired messages out and Lifecycle.expire files
    them, a request's with an expiry reply of type ftpbc.expired in the outbox."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    client = Client(in_process_config(handle, tmp_path, "cli", {"ep": {"repository": repo}}))
    things.append(client)
    lc = client.runtime.lifecycle("ep")
    uid = str(uuid.uuid4())
    drop_message(handle, repo, f"req.{uid};e={PAST}", b"q")
    drop_message(handle, repo, f"msg.{uuid.uuid4()}", b"live")
    assert [c.envelope.headers.kind for c in lc.waiting()] == ["oneway"]
    assert lc.expire(lc.take_expired()) == 1
    assert lc.take_expired() == []
    [reply] = area_files(handle, repo, "outbox")
    env = FtpbcCodec().decode(reply, direction="out")
    assert env is not None and env.headers.type == EXPIRED_TYPE and env.headers.correlation_id == uid
    assert len(area_files(handle, repo, "inexpired")) == 2 and len(area_files(handle, repo, "inbox")) == 1
    with pytest.raises(RequestExpired):
        client.collect("ep", uid, timeout=20)


def test_ftpbc_request_exits_5_when_its_request_expired(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                        things: list[Any]) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}}
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints)
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    got = run_ftpbc("request", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "x", "--ttl", "0.001",
                    env=ftpbc_env())
    assert got.returncode == 5, got.stderr
    assert got.stderr.startswith("ftpbc: expired: ") and "expired unserved" in got.stderr
    assert not seen.bodies
