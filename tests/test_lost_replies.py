"""A reply lost in the middle of the serve or collect path (the server drops the connection after
the command arrived, before answering) must not be taken for a failure, nor for a lost claim, and
must not cost the caller a response it has read.  A transfer the server cuts short while reporting
success must not reach a handler."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyftpdlib.handlers import FTPHandler

from ftpbc.client import Client
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.journal import Journal
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.support import echo_client, embedded_config


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


class ArchiveThenDrop(EmbeddedFTPServer):
    """pyftpdlib that, on the first RNTO into ``outarchive`` (the client archiving a response it
    has read), renames and then closes the control connection without answering."""

    def _handler_class(self, *args: Any) -> type[FTPHandler]:
        base = super()._handler_class(*args)
        fired = self.fired = threading.Event()

        class Handler(base):  # type: ignore[valid-type,misc]
            def ftp_RNTO(self, path: str) -> Any:
                if "/outarchive/" in path and not fired.is_set():
                    fired.set()
                    self.run_as_current_user(self.fs.rename, self._rnfr, path)
                    self.close()
                    return None
                return super().ftp_RNTO(path)

        return Handler


class DropArchives(EmbeddedFTPServer):
    """pyftpdlib that, while ``dropping`` is set, closes the control connection on every RNTO
    into ``outarchive`` without renaming: a client cannot archive the responses it read."""

    dropping: threading.Event
    drops: int

    def _handler_class(self, *args: Any) -> type[FTPHandler]:
        base = super()._handler_class(*args)
        dropping = self.dropping = threading.Event()
        self.drops = 0
        server = self

        class Handler(base):  # type: ignore[valid-type,misc]
            def ftp_RNTO(self, path: str) -> Any:
                if "/outarchive/" in path and dropping.is_set():
                    server.drops += 1
                    self.close()
                    return None
                return super().ftp_RNTO(path)

        return Handler


class ShortFirstRequestRead(EmbeddedFTPServer):
    """pyftpdlib that answers the first RETR of a claimed request with only its first 3 bytes,
    and still replies 226 (transfer complete)."""

    def _handler_class(self, *args: Any) -> type[FTPHandler]:
        base = super()._handler_class(*args)
        fired = self.fired = threading.Event()

        class Handler(base):  # type: ignore[valid-type,misc]
            def ftp_RETR(self, file: str) -> Any:
                if "/inselect/req." in file and not fired.is_set():
                    fired.set()
                    short = file + ".short"
                    with open(file, "rb") as src, open(short, "wb") as dst:
                        dst.write(src.read(3))
                    return super().ftp_RETR(short)
                return super().ftp_RETR(file)

        return Handler


@pytest.fixture
def server(tmp_path: Path) -> Any:
    (tmp_path / "root").mkdir()
    srv = DropFirstCommit(tmp_path / "root", password="pw").start()
    yield srv
    srv.stop()


def test_commit_rename_whose_reply_is_lost_is_retried_not_withheld(server: DropFirstCommit,
                                                                    tmp_path: Path) -> None:
    config = embedded_config(server.port, tmp_path)
    calls: list[str] = []

    def handler(message: Message) -> bytes:
        calls.append(message.name)
        return b"re:" + message.body

    with echo_client(config, handler) as client:
        assert client.request("echo", b"once", timeout=20) == b"re:once"
    assert server.fired.is_set(), "the fault was never injected"
    assert len(calls) == 1  # the handler ran once; its recorded result was committed after the drop
    root = tmp_path / "root" / "ex" / "echo"
    assert sorted(p.name.split("~")[1] for p in (root / "inarchive").iterdir()) == ["prov"]
    for d in ("inbox", "inselect", "outbox", "outselect", "outstage", "instage"):
        assert list((root / d).iterdir()) == [], d


def test_response_read_then_archive_reply_lost_is_still_delivered(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    server = ArchiveThenDrop(tmp_path / "root", password="pw")
    server.start()
    config = embedded_config(server.port, tmp_path)
    try:
        with echo_client(config, lambda m: b"re:" + m.body) as client:
            assert client.request("echo", b"keep", timeout=20) == b"re:keep"
            assert server.fired.is_set(), "the fault was never injected"
            assert client.request("echo", b"next", timeout=20) == b"re:next"
    finally:
        server.stop()
    root = tmp_path / "root" / "ex" / "echo"
    archived = sorted(p.name.split("~")[0] for p in (root / "outarchive").iterdir())
    assert len(archived) == 2 and all(n.startswith("resp.") for n in archived)
    for d in ("inbox", "inselect", "outbox", "outselect", "outstage", "instage"):
        assert list((root / d).iterdir()) == [], d
    assert Journal.read_pending(tmp_path / "journals", "cli") == {}, "the client left nothing pending"


def test_delivered_response_is_archived_by_recovery_not_returned(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    server = DropArchives(tmp_path / "root", password="pw")
    server.start()
    config = embedded_config(server.port, tmp_path)
    root = tmp_path / "root" / "ex" / "echo"
    node = Node(config.with_node_id("prov"), handlers={"echo": lambda m: b"re:" + m.body})
    node.start()
    try:
        server.dropping.set()
        with Client(config.with_node_id("cli")) as client:
            assert client.request("echo", b"mine", timeout=20) == b"re:mine"
        assert server.drops >= 2, "both the archive after reading and the one at close were cut"
        assert [p.name.split("~")[1] for p in (root / "outselect").iterdir()] == ["cli"]
        pending = Journal.read_pending(tmp_path / "journals", "cli")
        assert [op.events for ops in pending.values() for op in ops] == [["claim", "delivered"]]
        server.dropping.clear()
        with Client(config.with_node_id("cli")) as again:
            assert [a.outcome for a in again.recovered] == ["response had been delivered: archived"]
    finally:
        assert node.stop() is True
        server.stop()
    assert list((root / "outbox").iterdir()) == [], "a delivered response is not offered again"
    assert list((root / "outselect").iterdir()) == []
    assert [p.name.split("~")[0] for p in (root / "outarchive").iterdir()] == [
        p.name.replace("req.", "resp.").split("~")[0] for p in (root / "inarchive").iterdir()]
    assert Journal.read_pending(tmp_path / "journals", "cli") == {}


def test_request_read_short_with_success_reply_never_reaches_the_handler(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    server = ShortFirstRequestRead(tmp_path / "root", password="pw")
    server.start()
    config = embedded_config(server.port, tmp_path)
    bodies: list[bytes] = []

    def handler(message: Message) -> bytes:
        bodies.append(message.body)
        return b"re:" + bodies[-1]

    try:
        with echo_client(config, handler) as client:
            assert client.request("echo", b"the whole body", timeout=20) == b"re:the whole body"
    finally:
        server.stop()
    assert server.fired.is_set(), "the fault was never injected"
    assert bodies == [b"the whole body"], "the short read was returned to the inbox, not handled"
