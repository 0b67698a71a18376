"""Priority: a provider serves higher priorities first, and a remembered backlog never starves a
message of a higher priority that arrives behind it."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any

from ftpbc.client import Client
from ftpbc.model.message import Message
from ftpbc.node.provider import RELIST_COST_FACTOR, Provider
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until


class Order:
    """The order in which a handler saw messages (their priorities), optionally paced."""

    def __init__(self, pace: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.priorities: list[int] = []
        self.pace = pace
        self.released = threading.Event()  # set at the end: the remaining handlers return at once

    def handler(self, message: Message) -> bytes:
        assert message.headers is not None
        with self.lock:
            self.priorities.append(message.headers.priority)
        if self.pace:
            # the scenario's pace (a handler doing some work), not synchronisation
            self.released.wait(self.pace)
        return b""

    def seen(self) -> list[int]:
        with self.lock:
            return list(self.priorities)


def _drop(inbox: Path, name: str, when: float) -> None:
    """A message put in the inbox the way a producer does (written aside, renamed in)."""
    tmp = inbox.parent / "instage" / (name + "~test")
    tmp.write_bytes(b"x")
    os.utime(tmp, (when, when))
    os.rename(tmp, inbox / name)


def test_higher_priorities_are_served_first(server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    base = server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", "poll_interval": 0.05, "workers": 1}}
    client = Client(in_process_config(server, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")  # creates the exchange area
    inbox = server.local(f"{base}/ep/inbox")
    for i in range(30):
        priority = (0, 4, 9)[i % 3]
        suffix = "" if priority == 4 else f";p={priority}"
        _drop(inbox, f"msg.{uuid.uuid4()}{suffix}", 1_700_000_000 + i)
    order = Order()
    node = Node(in_process_config(server, tmp_path, "prov", endpoints), handlers={"ep": order.handler})
    things.append(node)
    node.start()
    wait_until(lambda: len(order.seen()) == 30, timeout=30, what="every message")
    assert order.seen() == [9] * 10 + [4] * 10 + [0] * 10


def test_a_new_priority_9_message_is_not_starved_by_a_remembered_backlog(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    """10,000 priority-4 messages wait; the node lists them once and remembers them.  A priority-9
    message sent once the node is well into that backlog is claimed at the first listing after
    the backlog is a poll_interval old.  Handlers take PACE seconds each on WORKERS workers, so
    within two poll intervals the node serves at most 2 x POLL x WORKERS / PACE messages: that,
    not wall time, bounds how many priority-4 messages may go before it (without the relist it
    would wait for the whole backlog)."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    poll, workers, pace = 0.25, 2, 0.02
    endpoints = {"ep": {"repository": f"{base}/ep", "poll_interval": poll, "workers": workers,
                        "max_per_poll": workers}}
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")
    inbox = handle.local(f"{base}/ep/inbox")
    for i in range(10_000):
        _drop(inbox, f"msg.{uuid.uuid4()}", 1_700_000_000 + i)
    order = Order(pace=pace)
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": order.handler})
    things.append(node)
    node.start()
    wait_until(lambda: len(order.seen()) >= 50, timeout=60, what="the node to be into its backlog")
    before = len(order.seen())
    client.send("ep", b"urgent", priority=9)
    wait_until(lambda: 9 in order.seen(), timeout=60, what="the priority-9 message")
    order.released.set()
    seen = order.seen()
    overtaken_by = seen.index(9) - before
    # The backlog is relisted after poll_interval, or after RELIST_COST_FACTOR listing times when
    # listing is slower than that (a loaded machine): the bound follows what this run measured.
    provider = node.providers["ep"]
    assert isinstance(provider, Provider)
    relist = max(poll, RELIST_COST_FACTOR * provider.longest_listing)
    bound = int(2 * relist * workers / pace) + 2 * workers
    assert overtaken_by <= bound, f"{overtaken_by} priority-4 messages went first (bound {bound})"
    # Without the relist it would come after the whole backlog: where it came must be far from
    # that, which a loaded machine's slower listing (a larger bound) must not blur.
    assert seen.index(9) < 10_000 // 2, f"the priority-9 message came after {seen.index(9)} others"
