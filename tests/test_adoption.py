"""A recorded result is never recomputed once it reached the server.

A node that staged its reply and then found its claim gone (it looked dead: slow, paused, cut
off) leaves the reply staged; whichever node serves the request next delivers that reply and
does not run the handler.  The sweeper keeps a dead node's complete staged reply for the same
purpose, and removes a torn one (its size is not the one its name declares)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.support import embedded_config, wait_until


def _config(port: int, tmp_path: Path, **node: object) -> Any:
    return embedded_config(port, tmp_path, node=node, endpoint={"timeout": 30, "redelivery_delay": 0.05})


@pytest.fixture
def server(tmp_path: Path) -> Any:
    (tmp_path / "root").mkdir()
    srv = EmbeddedFTPServer(tmp_path / "root", password="pw").start()
    yield srv
    srv.stop()


def _dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "root" / "ex" / "echo" / name


def _files(tmp_path: Path, name: str) -> list[str]:
    d = _dir(tmp_path, name)
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_a_reply_staged_by_a_node_that_lost_its_claim_is_delivered_not_recomputed(
        server: EmbeddedFTPServer, tmp_path: Path) -> None:
    config = _config(server.port, tmp_path)
    release = threading.Event()
    runs: list[tuple[str, int]] = []

    def slow(message: Message) -> bytes:
        runs.append(("slow", message.headers.delivery_count))
        release.wait(30)
        return b"re:" + message.body

    def other(message: Message) -> bytes:
        runs.append(("other", message.headers.delivery_count))
        return b"recomputed"

    a = Node(config.with_node_id("node-a"), handlers={"echo": slow})
    a.start()
    b: Node | None = None
    try:
        with Client(config.with_node_id("cli")) as client:
            answer: list[bytes] = []
            caller = threading.Thread(
                target=lambda: answer.append(client.request("echo", b"once", timeout=60)))
            caller.start()
            try:
                wait_until(lambda: runs, what="node-a's handler to start")
                [claim] = _files(tmp_path, "inselect")
                # What a sweeper does to a node it believes dead: the claim goes back to the box,
                # its delivery count raised.
                name = claim.rsplit("~", 1)[0]
                _dir(tmp_path, "inselect").joinpath(claim).rename(_dir(tmp_path, "inbox") / f"{name};n=1")
                release.set()
                wait_until(lambda: any("~node-a=" in f for f in _files(tmp_path, "outstage")),
                           what="node-a's reply left staged once its commit found the claim gone")
                b = Node(config.with_node_id("node-b"), handlers={"echo": other})
                b.start()
            finally:
                caller.join(60)
        assert answer == [b"re:once"]
    finally:
        release.set()
        if b is not None:
            assert b.stop() is True
        assert a.stop() is True
    assert runs == [("slow", 0)], "the handler ran again for a result that had reached the server"
    archived = _files(tmp_path, "inarchive")
    assert len(archived) == 1 and f"{archived[0].split(';')[0]};n=1~" in archived[0]  # the returned one
    for d in ("inbox", "inselect", "outstage", "outbox", "outselect"):
        assert _files(tmp_path, d) == [], d


def test_the_sweeper_keeps_a_dead_nodes_complete_reply_and_drops_a_torn_one(
        server: EmbeddedFTPServer, tmp_path: Path) -> None:
    config = _config(server.port, tmp_path, lease=3, heartbeat_interval=0.5)
    complete, torn = uuid.uuid4(), uuid.uuid4()
    for directory in ("inselect", "outstage", "inbox"):
        _dir(tmp_path, directory).mkdir(parents=True, exist_ok=True)
    # A node that died after staging: one reply whole, one cut short by the crash.
    _dir(tmp_path, "inselect").joinpath(f"req.{complete}~ghost").write_bytes(b"a")
    _dir(tmp_path, "outstage").joinpath(f"resp.{complete}~ghost=5").write_bytes(b"whole")
    _dir(tmp_path, "inselect").joinpath(f"req.{torn}~ghost").write_bytes(b"b")
    _dir(tmp_path, "outstage").joinpath(f"resp.{torn}~ghost=10").write_bytes(b"cut")
    runs: list[str] = []

    def handler(message: Message) -> bytes:
        runs.append(str(message.headers.id))
        return b"fresh"

    node = Node(config.with_node_id("node-b"), handlers={"echo": handler})
    node.start()
    try:
        wait_until(lambda: len(_files(tmp_path, "outbox")) == 2, timeout=30, what="both replies out")
    finally:
        assert node.stop() is True
    outbox = _dir(tmp_path, "outbox")
    assert outbox.joinpath(f"resp.{complete}").read_bytes() == b"whole"
    assert outbox.joinpath(f"resp.{torn}").read_bytes() == b"fresh"
    assert runs == [str(torn)]
    assert _files(tmp_path, "outstage") == [] and _files(tmp_path, "inselect") == []


def test_a_sweep_never_takes_a_live_nodes_upload_under_way_and_clears_a_leftover_reply(
        server: EmbeddedFTPServer, tmp_path: Path) -> None:
    """A staged reply shorter than its name says is an upload under way (or a torn one of a dead
    node): a live node's is left alone however long it stays.  A complete one whose request is
    nowhere (served by another node meanwhile) is removed once it has stayed a lease."""
    config = _config(server.port, tmp_path, lease=3, heartbeat_interval=0.5)
    uploading, leftover = uuid.uuid4(), uuid.uuid4()
    stage = _dir(tmp_path, "outstage")
    stage.mkdir(parents=True)
    (stage / f"resp.{uploading}~node-b=100").write_bytes(b"partial")
    (stage / f"resp.{leftover}~node-b=5").write_bytes(b"whole")
    node = Node(config.with_node_id("node-b"), handlers={"echo": lambda m: b""})
    node.start()
    try:
        wait_until(lambda: not (stage / f"resp.{leftover}~node-b=5").exists(), timeout=30,
                   what="the leftover reply removed")
        swept = node.sweeps
        wait_until(lambda: node.sweeps >= swept + 3, timeout=30, what="three more sweeps")
        assert (stage / f"resp.{uploading}~node-b=100").read_bytes() == b"partial"
    finally:
        assert node.stop() is True


def test_recovery_keeps_a_staged_message_its_pending_send_still_names(
        server: EmbeddedFTPServer, tmp_path: Path) -> None:
    """A send left pending (its server failed while recovery decided it) owns its stage file:
    the orphan pass that follows must not roll it back."""
    from ftpbc.exchange.recovery import recover_orphans
    from ftpbc.exchange.runtime import Runtime

    runtime = Runtime(_config(server.port, tmp_path).with_node_id("cli"))
    try:
        lc = runtime.lifecycle("echo", "in")
        lc.prepare()
        uid = uuid.uuid4()
        staged = f"{lc.layout.stages[0]}/req.{uid}~cli"
        orphan = f"{lc.layout.stages[0]}/req.{uuid.uuid4()}~cli"
        for path in (staged, orphan):
            (tmp_path / "root" / path.lstrip("/")).write_bytes(b"body")
        lc.journal.record(f"{uid}.send", "send", durable=True, target=lc.layout.box_path(f"req.{uid}"),
                          stage=staged)
        actions = recover_orphans(lc)
        assert [a.op_id for a in actions] == [orphan.rsplit("/", 1)[-1]]
        assert (tmp_path / "root" / staged.lstrip("/")).exists()
        assert not (tmp_path / "root" / orphan.lstrip("/")).exists()
    finally:
        runtime.close()
