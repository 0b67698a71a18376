"""What counts as a delivery, and who hears about a message filed unserved.

A server whose sessions die while a claim is read (vsftpd's ``500 OOPS:`` while it restarts)
says nothing about the message: the read goes again on a fresh session and the message is
served with its delivery count untouched.  A message that was read and found unusable is a
delivery; once it runs out of them it is filed, and the request's caller gets an error reply at
once rather than waiting out its timeout.  A message that came back to its box is held back by
every node for ``redelivery_delay``, not only by the node that returned it.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyftpdlib.handlers import FTPHandler

from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.support import echo_client, embedded_config, wait_until


class ClaimReads(EmbeddedFTPServer):
    """pyftpdlib that answers the first ``failures`` RETRs of a claimed request with ``reply``
    and then closes the control connection, as a vsftpd session does when its helper died."""

    failures = 0
    reply = "500 OOPS: priv_sock_send_cmd"

    def _handler_class(self, *args: Any) -> type[FTPHandler]:
        base = super()._handler_class(*args)
        server = self
        server.refused = 0
        lock = threading.Lock()

        class Handler(base):  # type: ignore[valid-type,misc]
            def ftp_RETR(self, file: str) -> Any:
                if "/inselect/req." in file:
                    with lock:
                        refuse = server.refused < server.failures
                        server.refused += refuse
                    if refuse:
                        self.respond(server.reply)
                        self.close_when_done()
                        return None
                return super().ftp_RETR(file)

        return Handler


def _config(port: int, tmp_path: Path, **endpoint: object) -> Any:
    return embedded_config(port, tmp_path, endpoint={"timeout": 30, **endpoint})


@pytest.fixture
def claim_reads(tmp_path: Path) -> Any:
    (tmp_path / "root").mkdir()
    srv = ClaimReads(tmp_path / "root", password="pw").start()
    yield srv
    srv.stop()


def _box(tmp_path: Path, directory: str) -> list[str]:
    return sorted(p.name for p in (tmp_path / "root" / "ex" / "echo" / directory).iterdir())


def test_reads_on_dying_sessions_are_not_deliveries(claim_reads: ClaimReads, tmp_path: Path) -> None:
    """More failed reads than max_deliveries allows: still served once, never counted."""
    claim_reads.failures = 12  # past the transport's own retries, several times over
    config = _config(claim_reads.port, tmp_path, max_deliveries=2, redelivery_delay=0.05)
    counts: list[int] = []

    def handler(message: Message) -> bytes:
        counts.append(message.headers.delivery_count)
        return b"re:" + message.body

    with echo_client(config, handler) as client:
        assert client.request("echo", b"once", timeout=60) == b"re:once"
    assert claim_reads.refused == 12, "the fault was not injected as often as asked"
    assert counts == [0]  # handled once, as its first delivery
    assert _box(tmp_path, "inerror") == [] and _box(tmp_path, "indead") == []


def test_a_request_filed_unread_answers_its_caller_at_once(claim_reads: ClaimReads, tmp_path: Path) -> None:
    """Every read refused for the file's sake: after max_deliveries the request is filed with its
    reason, and the caller gets an error reply naming why, long before its timeout."""
    claim_reads.failures = 1_000
    claim_reads.reply = "550 Permission denied."
    config = _config(claim_reads.port, tmp_path, max_deliveries=2, redelivery_delay=0.05)
    ran: list[str] = []
    with echo_client(config, lambda m: ran.append(m.name) or b"") as client:
        started = time.monotonic()
        with pytest.raises(RemoteHandlerError) as caught:
            client.request("echo", b"unreadable", timeout=120)
        waited = time.monotonic() - started
    assert "delivery 2 of 2 failed" in caught.value.reason and "PermissionDenied" in caught.value.reason
    assert waited < 60, f"the caller waited {waited:.1f} s for an answer no node would give"
    assert not ran
    filed = _box(tmp_path, "inerror")
    assert len(filed) == 2 and filed[1] == filed[0] + ".reason"
    reason = (tmp_path / "root" / "ex" / "echo" / "inerror" / filed[1]).read_text()
    assert "delivery 2 of 2 failed" in reason
    for directory in ("inbox", "inselect", "outbox", "outselect", "outstage"):
        assert _box(tmp_path, directory) == [], directory


def _wait_of_a_returned_request(tmp_path: Path, count: int, **endpoint: object) -> float:
    """Seconds from writing ``req.<id>;n=<count>`` into the inbox of a serving node (one that
    did not return it) until its handler runs."""
    (tmp_path / "root").mkdir()
    srv = EmbeddedFTPServer(tmp_path / "root", password="pw").start()
    try:
        config = _config(srv.port, tmp_path, **endpoint)
        handled: list[float] = []
        node = Node(config.with_node_id("other"), handlers={"echo": lambda m: handled.append(time.monotonic())
                                                             or b"ok"})
        node.start()
        try:
            inbox = tmp_path / "root" / "ex" / "echo" / "inbox"
            wait_until(inbox.exists, what="the inbox")
            placed = time.monotonic()
            (inbox / f"req.{uuid.uuid4()};n={count}").write_bytes(b"came back")
            wait_until(lambda: handled, timeout=30, what="the returned message served")
        finally:
            assert node.stop() is True
        return handled[0] - placed
    finally:
        srv.stop()


def test_a_returned_message_is_held_back_by_a_node_that_did_not_return_it(tmp_path: Path) -> None:
    """A request found in the box with a delivery count (another node gave it back) waits
    ``redelivery_delay`` from the moment this node first lists it."""
    delay = 2.0
    waited = _wait_of_a_returned_request(tmp_path, 1, redelivery_delay=delay)
    # The hold runs from the start of the listing that first saw the file, which may have
    # begun a moment before the file was written; unheld, it is served within a few polls.
    assert waited >= delay - 0.25, "served before its redelivery delay had passed"


def test_the_hold_of_a_message_returned_many_times_stops_growing_at_its_cap(tmp_path: Path) -> None:
    """Delivery 40 would be held 2**39 s if the hold only doubled; ``max_redelivery_delay``
    caps it, so a node still serves it once the cap has passed since it first listed it."""
    cap = 1.5
    waited = _wait_of_a_returned_request(tmp_path, 40, redelivery_delay=1.0, max_redelivery_delay=cap,
                                         max_deliveries=50)
    assert waited >= cap - 0.25, "served before its capped hold had passed"
