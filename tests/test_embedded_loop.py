"""The embedded FTP server's event loop (``ftpbc.embedded.EventLoop``): an event polled for one
connection never reaches another.

In one round of the loop, a handler closed by an earlier event frees its descriptor number and a
connection accepted later in the round may get it, while the closed socket's event is still in
the round's list.  A hang-up handed so to an upload's data connection ends the upload at once,
``226`` for an empty file (docs/servers.md).  The round is scripted here: real sockets and epoll
registrations, the poll's result fixed, so the window opens every time.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Any

import pytest
from pyftpdlib.ioloop import IOLoop

from ftpbc.embedded import EventLoop

pytestmark = pytest.mark.skipif(not hasattr(select, "epoll"), reason="the loop changed is epoll's")

HANG_UP = select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP


class Handler:
    """A connection's handler as the loop drives it: it records the events it is given."""

    def __init__(self, loop: Any, sock: socket.socket, events: int, on_read: Any = None) -> None:
        self.loop = loop
        self.sock = sock
        self._fileno = sock.fileno()
        self.on_read = on_read
        self.seen: list[str] = []
        loop.register(self._fileno, self, events)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def handle_read_event(self) -> None:
        self.seen.append("read")
        if self.on_read is not None:
            self.on_read()

    def handle_write_event(self) -> None:
        self.seen.append("write")

    def handle_close(self) -> None:
        self.seen.append("close")

    def handle_error(self) -> None:
        raise AssertionError("a handler's step failed")

    def close(self) -> None:
        self.loop.unregister(self._fileno)
        self.sock.close()


class OneRound:
    """The loop's epoll, except that the next poll returns ``events`` (then it is epoll again)."""

    def __init__(self, poller: Any, events: list[tuple[int, int]]) -> None:
        self.poller = poller
        self.events: list[tuple[int, int]] | None = events

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        if self.events is None:
            return list(self.poller.poll(timeout))
        events, self.events = self.events, None
        return events

    def __getattr__(self, name: str) -> Any:  # register, modify, unregister, close: epoll's
        return getattr(self.poller, name)


def round_with_a_reused_descriptor(loop: Any) -> tuple[Handler, socket.socket]:
    """One round of ``loop`` in which the first event closes a connection that is hanging up
    (a server sending a file to a client that was killed), a new connection takes its descriptor
    number, and the old connection's hang-up comes next in the round's list.  Returns the new
    connection's handler and its peer, the round done."""
    old_sock, old_peer = socket.socketpair()
    old = Handler(loop, old_sock, loop.WRITE)
    reused = old_sock.fileno()
    trigger_sock, trigger_peer = socket.socketpair()
    taken: list[Handler] = []
    new_sock, new_peer = socket.socketpair()

    def close_and_accept() -> None:
        old.close()
        os.dup2(new_sock.fileno(), reused)  # accepted, on the number just freed (the lowest free)
        new_sock.close()
        taken.append(Handler(loop, socket.socket(fileno=reused), loop.READ))

    trigger = Handler(loop, trigger_sock, loop.READ, on_read=close_and_accept)
    loop._poller = OneRound(loop._poller, [(trigger_sock.fileno(), select.EPOLLIN), (reused, HANG_UP)])
    try:
        loop.poll(0)
    finally:
        trigger.close()
        for sock in (old_peer, trigger_peer):
            sock.close()
    assert taken and taken[0]._fileno == reused
    return taken[0], new_peer


def test_a_hang_up_polled_for_a_closed_connection_never_reaches_the_one_that_took_its_number() -> None:
    loop = EventLoop()
    try:
        new, peer = round_with_a_reused_descriptor(loop)
        assert new.seen == []  # pyftpdlib's own loop calls its handle_close: an upload ends empty
        # The new connection's own events still come, with the next round (epoll is level-triggered).
        peer.sendall(b"m1034")
        loop.poll(1.0)
        assert new.seen == ["read"]
        assert new.sock.recv(16) == b"m1034"
        new.close()
        peer.close()
    finally:
        loop.close()


def test_pyftpdlibs_own_loop_has_the_window_this_loop_closes() -> None:
    """The scripted round above does open the window: pyftpdlib's loop hands the closed
    connection's hang-up to the new one."""
    if getattr(IOLoop, "_poller", None) is not select.epoll:
        pytest.skip("pyftpdlib's loop here is not its epoll loop")
    loop = IOLoop()
    try:
        new, peer = round_with_a_reused_descriptor(loop)
        assert new.seen == ["close"]
        new.close()
        peer.close()
    finally:
        loop.close()
