"""Sizes are bounded: max_message_bytes at send and at read, and reads stop where the listing said."""

from __future__ import annotations

import io
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import EndpointConfig
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import IncompleteRead, MessageTooLarge
from ftpbc.exchange.bounds import READ_MARGIN
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import Claimed, Lifecycle
from ftpbc.journal import Journal
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from ftpbc.transport import open_transport
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.servers.hostile import FLOOD_RETR, HostileFTPServer
from tests.support import wait_until


def _endpoints(base: str, **options: Any) -> dict[str, dict[str, Any]]:
    return {"ep": {"repository": f"{base}/ep", "poll_interval": 0.02, "workers": 1, **options}}


def test_a_body_over_max_message_bytes_is_refused_at_send(local_server: ServerHandle, tmp_path: Path) -> None:
    base = local_server.fresh_dir()
    client = Client(in_process_config(local_server, tmp_path, "cli", _endpoints(base, max_message_bytes=10)))
    try:
        with pytest.raises(MessageTooLarge) as caught:
            client.send("ep", b"x" * 11)
        assert caught.value.size == 11 and caught.value.limit == 10
        assert "11 bytes is more than max_message_bytes (10)" in str(caught.value)
        stream = io.BytesIO(b"header" + b"y" * 20)
        stream.seek(6)  # what is left to send counts, not what came before
        with pytest.raises(MessageTooLarge, match="20 bytes"):
            client.send("ep", stream)
        repo = local_server.local(f"{base}/ep")
        assert not any(p.is_file() for p in repo.rglob("*")), list(repo.rglob("*"))
        client.send("ep", b"x" * 10)
    finally:
        client.close()
    assert len(list(local_server.local(f"{base}/ep/inbox").iterdir())) == 1


def test_a_file_listed_over_max_message_bytes_is_filed_unread(local_server: ServerHandle,
                                                               tmp_path: Path) -> None:
    base = local_server.fresh_dir()
    endpoints = _endpoints(base, max_message_bytes=50)
    seen: list[Message] = []
    node = Node(in_process_config(local_server, tmp_path, "prov", endpoints),
                handlers={"ep": lambda m: seen.append(m)})
    node.start()
    try:
        inbox = local_server.local(f"{base}/ep/inbox")
        wait_until(inbox.exists, what="the inbox")
        (inbox / f"msg.{uuid.uuid4()}").write_bytes(b"z" * 100)
        inerror = local_server.local(f"{base}/ep/inerror")
        reasons = wait_until(lambda: list(inerror.glob("*.reason")) if inerror.exists() else [],
                             what="the .reason in inerror")
    finally:
        assert node.stop(drain_timeout=10)
    reason = reasons[0].read_text("utf-8")
    assert reason.startswith("MessageTooLarge: ")
    assert "100 bytes is more than max_message_bytes (50)" in reason
    assert seen == []
    filed = [p for p in inerror.iterdir() if not p.name.endswith(".reason")]
    assert [p.read_bytes() for p in filed] == [b"z" * 100]


def test_a_server_that_lists_5_bytes_and_sends_300_mib_is_cut_off(tmp_path: Path) -> None:
    with HostileFTPServer("retr_flood") as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=10.0)
        ep = EndpointConfig(server="hostile", repository="/q")
        journal = Journal(tmp_path / "journals", "n1", durable=False)
        with open_transport(cfg) as transport:
            lc = Lifecycle(AreaLayout("q", ep, "in"), transport, journal.endpoint("q"), "n1")
            name = f"req.{uuid.uuid4()}"
            candidate = lc.layout.decode_name(name)
            assert candidate is not None
            claimed = Claimed(replace(candidate, size=5), f"/q/inselect/{name}~n1", f"{name}.serve")
            sink = io.BytesIO()
            started = time.monotonic()
            with pytest.raises(IncompleteRead, match="listed with 5 bytes"):
                lc.read(claimed, sink)
            elapsed = time.monotonic() - started
        journal.close()
    assert len(sink.getvalue()) <= 5 + READ_MARGIN
    assert server.flooded < FLOOD_RETR
    assert elapsed < 10
