"""The request/response lifecycle, in-process Node + Client, on every server kind.

Each test gets its own exchange areas on the server, a serving Node (``prov``) and a Client
(``cli``), and checks what a user relies on: the reply is the right one, byte for byte; a failing
handler is reported at once; nothing is left in the working directories; archives say who did
what and when; journals end empty.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.errors import RemoteHandlerError, RequestTimeout
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.journal import Journal
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
STAMP = r"\d{8}T\d{6}\.\d{3}Z"
#: the directories in which nothing may stay once every exchange has finished
WORKING_DIRS = ("inbox", "inselect", "instage", "outstage", "outselect", "outbox")
FAST = {"poll_interval": 0.02, "workers": 2}


@dataclass
class Rig:
    """One test's server, exchange areas, serving node and client."""

    handle: ServerHandle
    workdir: Path
    base: str
    endpoints: dict[str, dict[str, Any]]
    #: (name, size, body) of every message the in-process handlers were given
    seen: list[tuple[str, int, bytes]] = field(default_factory=list)
    node: Node | None = None
    client: Client | None = None

    def config(self, node_id: str) -> Config:
        return in_process_config(self.handle, self.workdir, node_id, self.endpoints)

    def repo(self, endpoint: str) -> str:
        return str(self.endpoints[endpoint]["repository"])

    def files(self, endpoint: str, directory: str) -> list[str]:
        """Names in one exchange directory, read straight from the server's disk."""
        path = self.handle.local(f"{self.repo(endpoint)}/{directory}")
        return sorted(p.name for p in path.iterdir()) if path.exists() else []

    def assert_settled(self, endpoint: str) -> None:
        left = {d: self.files(endpoint, d) for d in WORKING_DIRS}
        assert not any(left.values()), f"{endpoint}: files left behind: {left}"

    def stop(self) -> None:
        """Stop client and node, then check that neither journal holds a pending operation."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.node is not None:
            assert self.node.stop(drain_timeout=10), "node did not drain"
            self.node = None
        for node_id in ("prov", "cli"):
            journal = Journal(self.workdir / "journals", node_id)
            try:
                assert journal.all_pending() == {}, f"journal of {node_id} not empty"
            finally:
                journal.close()


def _echo(rig: Rig) -> Any:
    def handler(message: Message) -> bytes:
        body = message.body
        rig.seen.append((message.name, message.size, body))
        return body
    return handler


def _boom(message: Message) -> bytes:
    raise ValueError(f"boom on {len(message.body)} bytes")


def _stream_hash(message: Message) -> str:
    digest = hashlib.sha256()
    stream = message.stream
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture
def rig(server: ServerHandle, tmp_path: Path) -> Iterator[Rig]:
    base = server.fresh_dir()
    endpoints: dict[str, dict[str, Any]] = {
        "echo": {"repository": f"{base}/echo", **FAST, "timeout": 20},
        "boom": {"repository": f"{base}/boom", **FAST, "timeout": 20},
        "noarch": {"repository": f"{base}/noarch", **FAST, "archive": False, "timeout": 20},
        "nobody": {"repository": f"{base}/nobody", **FAST, "timeout": 20},
    }
    r = Rig(server, tmp_path, base, endpoints)
    r.node = Node(r.config("prov"), handlers={"echo": _echo(r), "boom": _boom, "noarch": _echo(r)})
    r.node.start()
    r.client = Client(r.config("cli"))
    try:
        yield r
    finally:
        # Stop even when the test failed, so no poller outlives it; the checks in stop()
        # only count when the test itself got that far (it calls rig.stop() explicitly).
        if r.client is not None:
            r.client.close()
        if r.node is not None:
            r.node.stop(drain_timeout=5)


def test_round_trip_is_byte_exact_and_archived(rig: Rig) -> None:
    assert rig.client is not None
    # Every byte value, CR/LF pairs and a NUL run: an ASCII-mode transfer would alter them.
    body = bytes(range(256)) + b"\r\n\n\r\x00" * 1000 + os.urandom(200_000)
    assert rig.client.request("echo", body) == body
    assert rig.client.request("echo", b"second") == b"second"
    rig.stop()

    rig.assert_settled("echo")
    served = rig.files("echo", "inarchive")
    collected = rig.files("echo", "outarchive")
    assert len(served) == 2 and all(re.fullmatch(rf"req\.{UUID}~prov~{STAMP}", n) for n in served), served
    assert len(collected) == 2 and all(re.fullmatch(rf"resp\.{UUID}~cli~{STAMP}", n) for n in collected), \
        collected
    # The archived request and response of one exchange share its UUID.
    assert {n.split("~")[0][4:] for n in served} == {n.split("~")[0][5:] for n in collected}


def test_reply_delivered_before_the_caller_waits_is_not_missed(rig: Rig,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine can deschedule the requesting thread between its send and its wait for
    long enough that the whole exchange completes meanwhile: the reply must still reach it."""
    assert rig.client is not None
    send = Lifecycle.send

    def send_then_stall(self: Lifecycle, out: Any, body: Any, **kw: Any) -> str:
        target = send(self, out, body, **kw)
        uid = target.rsplit("/", 1)[-1].removeprefix("req.")
        wait_until(lambda: any(n.startswith(f"resp.{uid}~") for n in rig.files("echo", "outarchive")),
                   timeout=20, what="the reply to be delivered and archived")
        return target

    monkeypatch.setattr(Lifecycle, "send", send_then_stall)
    assert rig.client.request("echo", b"quick", timeout=5) == b"quick"
    rig.stop()
    rig.assert_settled("echo")


def test_zero_byte_request_and_response(rig: Rig) -> None:
    assert rig.client is not None
    assert rig.client.request("echo", b"") == b""
    assert rig.seen[-1][1:] == (0, b"")
    rig.stop()
    rig.assert_settled("echo")


def test_failing_handler_is_reported_at_once_and_request_kept_with_reason(rig: Rig) -> None:
    assert rig.client is not None
    started = time.monotonic()
    with pytest.raises(RemoteHandlerError) as caught:
        rig.client.request("boom", b"12345")
    # The endpoint's timeout is 20 s: an error reply, not a timeout, ended the wait.
    assert time.monotonic() - started < 10
    # error_reply: type (the default): the class and a reference id, the text only in the log
    assert re.fullmatch(r"ValueError \(ref [0-9a-f]{8}\)", caught.value.reason), caught.value.reason
    assert caught.value.endpoint == "boom"
    rig.stop()

    rig.assert_settled("boom")
    failed = rig.files("boom", "inerror")
    requests = [n for n in failed if not n.endswith(".reason")]
    assert len(requests) == 1 and re.fullmatch(rf"req\.{UUID}~prov~{STAMP}", requests[0]), failed
    assert f"{requests[0]}.reason" in failed
    inerror = rig.handle.local(f"{rig.repo('boom')}/inerror")
    assert (inerror / requests[0]).read_bytes() == b"12345"
    assert (inerror / f"{requests[0]}.reason").read_text("utf-8") == caught.value.reason + "\n"
    assert rig.files("boom", "inarchive") == []
    # The error reply was collected like any response.
    assert [n.split("~")[0] for n in rig.files("boom", "outarchive")] == [
        f"resp.{requests[0].split('~')[0][4:]}.error"]


def test_one_way_message_is_served_and_not_answered(rig: Rig) -> None:
    assert rig.client is not None
    path = rig.client.send("echo", b"fire and forget")
    name = path.rsplit("/", 1)[1]
    assert re.fullmatch(rf"msg\.{UUID}", name), path
    wait_until(lambda: any(n.startswith(f"{name}~prov~") for n in rig.files("echo", "inarchive")),
               what=f"{name} to be archived")
    assert [body for seen, _, body in rig.seen if seen == name] == [b"fire and forget"]
    rig.stop()

    rig.assert_settled("echo")  # outbox included: no response was written
    assert rig.files("echo", "outarchive") == []


def test_foreign_files_are_left_untouched_and_reported_once(rig: Rig,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    assert rig.client is not None and rig.node is not None
    caplog.set_level(logging.WARNING, logger="ftpbc.provider")
    inbox = rig.handle.local(f"{rig.repo('echo')}/inbox")
    foreign = {"README.txt": b"not a message", "req.not-a-uuid": b"x", "resp.0": b""}
    for name, data in foreign.items():
        (inbox / name).write_bytes(data)
    provider = rig.node.providers["echo"]
    polls = provider.stats.polls
    wait_until(lambda: provider.stats.polls >= polls + 5, what="five polls")
    # A real request still gets through beside them.
    assert rig.client.request("echo", b"still served") == b"still served"
    rig.stop()

    assert {p.name: p.read_bytes() for p in inbox.iterdir()} == foreign
    for name in foreign:
        reports = [r for r in caplog.records if name in r.getMessage() and "does not match" in r.getMessage()]
        assert len(reports) == 1, f"{name} reported {len(reports)} times"


def test_request_without_provider_times_out_and_is_withdrawn(rig: Rig) -> None:
    assert rig.client is not None
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as caught:
        rig.client.request("nobody", b"anyone?", timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    message = str(caught.value)
    assert caught.value.endpoint == "nobody" and "'nobody'" in message
    assert re.search(rf"{re.escape(rig.repo('nobody'))}/inbox/req\.{UUID}", message), message
    rig.stop()
    rig.assert_settled("nobody")
    assert rig.files("nobody", "inarchive") == []


def test_archive_off_deletes_instead(rig: Rig) -> None:
    assert rig.client is not None
    assert rig.client.request("noarch", b"gone after") == b"gone after"
    rig.client.send("noarch", b"one-way too")
    wait_until(lambda: len(rig.seen) == 2, what="the one-way message to be served")
    wait_until(lambda: rig.files("noarch", "inselect") == [], what="the one-way claim to finish")
    rig.stop()
    rig.assert_settled("noarch")
    assert rig.files("noarch", "inarchive") == [] and rig.files("noarch", "outarchive") == []


def test_submit_then_collect_from_another_client(rig: Rig) -> None:
    assert rig.client is not None
    uid = rig.client.submit("echo", b"collect me elsewhere")
    rig.client.close()
    rig.client = None
    with Client(rig.config("cli2")) as other:
        assert other.collect("echo", uid, timeout=20) == b"collect me elsewhere"
    rig.stop()
    rig.assert_settled("echo")
    assert [n.split("~")[:2] for n in rig.files("echo", "outarchive")] == [[f"resp.{uid}", "cli2"]]
    journal = Journal(rig.workdir / "journals", "cli2")
    try:
        assert journal.all_pending() == {}
    finally:
        journal.close()


# ---------------------------------------------------------------------- a 200 MiB request

BIG = 200 * 1024 * 1024
BLOCK = 1024 * 1024


class GeneratedStream(io.RawIOBase):
    """``size`` bytes made on demand: a random block, each copy stamped with its index, so a
    dropped, repeated or reordered block changes the hash.  Never holds more than a block."""

    def __init__(self, size: int, seed_block: bytes) -> None:
        self.size = size
        self.seed = seed_block
        self.pos = 0

    def readable(self) -> bool:
        return True

    def _chunk(self, pos: int, n: int) -> bytes:
        index, offset = divmod(pos, BLOCK)
        block = index.to_bytes(8, "big") + self.seed[8:]
        return block[offset:offset + n]

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        data = self._chunk(self.pos, n)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def test_200_mib_request_is_streamed_with_bounded_memory(pyftpdlib_server: ServerHandle,
                                                         tmp_path: Path) -> None:
    seed = os.urandom(BLOCK)
    expected = hashlib.sha256()
    reference = GeneratedStream(BIG, seed)
    while chunk := reference.read(BLOCK):
        expected.update(chunk)

    base = pyftpdlib_server.fresh_dir()
    endpoints = {"big": {"repository": f"{base}/big", **FAST, "timeout": 180}}
    config = in_process_config(pyftpdlib_server, tmp_path, "prov", endpoints)
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with Node(config, handlers={"big": _stream_hash}) as node, \
                Client(in_process_config(pyftpdlib_server, tmp_path, "cli", endpoints)) as client:
            started = time.monotonic()
            answer = client.request("big", io.BufferedReader(GeneratedStream(BIG, seed), BLOCK))
            elapsed = time.monotonic() - started
            # counted just after the reply is exposed, which the client may see first
            wait_until(lambda: node.providers["big"].stats.served == 1, timeout=10, what="served counted")
    finally:
        done.set()
        sampler.join()
    assert answer.decode() == expected.hexdigest()
    growth = (peak[0] - baseline) / BLOCK
    print(f"\n200 MiB request served in {elapsed:.1f} s; peak RSS growth {growth:.1f} MiB")
    assert growth < 100, f"RSS grew by {growth:.0f} MiB serving a 200 MiB request"
    archived = pyftpdlib_server.local(f"{base}/big/inarchive")
    files = list(archived.iterdir())
    assert len(files) == 1 and files[0].stat().st_size == BIG
    files[0].unlink()  # 200 MiB of disk back at once, not when pytest prunes its temp dirs
