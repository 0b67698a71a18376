"""A reply lost in the middle of the serve path (the server drops the connection after the command
arrived, before answering) must not be taken for a failure, nor for a lost claim."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyftpdlib.handlers import FTPHandler

from ftpbc.client import Client
from ftpbc.config.loader import parse_config
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.message import Message
from ftpbc.node.serve import Node


class DropFirstCommit(EmbeddedFTPServer):
    """pyftpdlib that closes the control connection on the first RNTO into ``inarchive``: the
    provider's commit rename is received but neither applied nor answered."""

    def _handler_class(self, *args: Any) -> type[FTPHandler]:
        base = super()._handler_class(*args)
        fired = self.fired = threading.Event()

        class Handler(base):  # type: ignore[valid-type,misc]
            def ftp_RNTO(self, path: str) -> Any:
                if "/inarchive/" in path and not fired.is_set():
                    fired.set()
                    self.close()
                    return None
                return super().ftp_RNTO(path)

        return Handler


@pytest.fixture
def server(tmp_path: Path) -> Any:
    (tmp_path / "root").mkdir()
    srv = DropFirstCommit(tmp_path / "root", password="pw").start()
    yield srv
    srv.stop()


def test_commit_rename_whose_reply_is_lost_is_retried_not_withheld(server: DropFirstCommit,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pw")
    config = parse_config(f"""
node: {{state_dir: {tmp_path}/state, journal_dir: {tmp_path}/journals}}
servers:
  s: {{url: "ftp://ftpbc@127.0.0.1:{server.port}/", password_file: {tmp_path}/pw}}
endpoints:
  echo: {{server: s, repository: /ex/echo, poll_interval: 0.02, timeout: 20}}
""")
    calls: list[str] = []

    def handler(message: Message) -> bytes:
        calls.append(message.name)
        return b"re:" + message.body

    node = Node(config.with_node_id("prov"), handlers={"echo": handler})
    node.start()
    try:
        with Client(config.with_node_id("cli")) as client:
            assert client.request("echo", b"once", timeout=20) == b"re:once"
    finally:
        assert node.stop() is True
    assert server.fired.is_set(), "the fault was never injected"
    assert len(calls) == 1  # the handler ran once; its recorded result was committed after the drop
    root = tmp_path / "root" / "ex" / "echo"
    assert sorted(p.name.split("~")[1] for p in (root / "inarchive").iterdir()) == ["prov"]
    for d in ("inbox", "inselect", "outbox", "outselect", "outstage", "instage"):
        assert list((root / d).iterdir()) == [], d
