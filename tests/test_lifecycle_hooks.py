"""The lifecycle's hook points (``HOOKS``), what the crash and fault harnesses log through.

A request served by an in-process node on pyftpdlib: ``after_served_durable`` is called once,
with the served claim, and the reply's upload to ``outstage`` is announced before and after,
in that order, before the caller has its answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.exchange.lifecycle import HOOKS, Served
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle


@pytest.fixture
def events() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []

    def durable(served: Served) -> None:
        seen.append(("recorded", served.claimed.name))

    def staging(path: str) -> None:
        seen.append(("staging", path))

    def staged(path: str) -> None:
        seen.append(("staged", path))

    HOOKS.after_served_durable.append(durable)
    HOOKS.before_reply_staged.append(staging)
    HOOKS.after_reply_staged.append(staged)
    try:
        yield seen
    finally:
        HOOKS.after_served_durable.remove(durable)
        HOOKS.before_reply_staged.remove(staging)
        HOOKS.after_reply_staged.remove(staged)


def test_hooks_see_a_request_recorded_then_its_reply_staged(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                            events: list[tuple[str, str]]) -> None:
    endpoints = {"echo": {"repository": f"{pyftpdlib_server.fresh_dir()}/echo", "poll_interval": 0.02,
                          "workers": 1, "timeout": 20}}

    def handler(message: Message) -> bytes:
        return b"re:" + message.body

    node = Node(in_process_config(pyftpdlib_server, tmp_path, "prov", endpoints), handlers={"echo": handler})
    node.start()
    try:
        with Client(in_process_config(pyftpdlib_server, tmp_path, "cli", endpoints)) as client:
            uid = client.submit("echo", b"hi")
            assert client.collect("echo", uid, timeout=20) == b"re:hi"
    finally:
        assert node.stop(drain_timeout=10)
    assert [kind for kind, _ in events] == ["recorded", "staging", "staged"], events
    assert events[0][1] == f"req.{uid}"
    stage = events[1][1]
    directory, _, name = stage.rpartition("/")
    assert stage == events[2][1] and directory.endswith("/echo/outstage"), stage
    assert name.startswith(f"resp.{uid}~prov"), stage
