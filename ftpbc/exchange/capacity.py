"""Bounded queues: an endpoint's ``max_messages``, ``max_bytes`` and ``on_overflow``
(docs/queues.md, "Bounded queues").

The bound is kept by the senders, since nothing else sees a message before it is in the inbox:
a send to a bounded inbox lists the box first (one listing, no cache: a count remembered for
even a poll interval would let one busy producer overshoot by everything it sends meanwhile)
and overflows when the messages waiting are ``max_messages`` already, or when their listed
bytes plus this message's would pass ``max_bytes``.  What counts is the inbox alone: the
messages a consumer may still take.  A claimed message (``inselect``) is being served and
leaves the queue whatever happens to it next; one that comes back (a failed delivery, a
returned claim, a dead-letter replay) is never refused, so a queue may stand above its bound
for a while.

Two producers that list at the same time both see the room for one more, and both send:
counted from listings, the bound overshoots by at most S-1 messages, S being the sends in
flight at once across all producers (N-1 with N single-threaded producers).  A
:class:`Capacity` makes the threads of one process one producer that never passes the bound
alone: what they have admitted and not yet exposed is added to the listing (by name, so a
message already listed is not counted twice), and each admission lists under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ftpbc.errors import NotFound, QueueFull
from ftpbc.exchange.layout import Layout
from ftpbc.exchange.policy import QueuePolicy
from ftpbc.transport.base import Transport


@dataclass(frozen=True)
class Depth:
    """What waits in a box: messages, and their bytes as listed (a size the listing did not
    give counts as 0)."""

    messages: int
    bytes: int


class Capacity:
    """The bound of one inbox as the senders of one process keep it.  Thread-safe."""

    def __init__(self, layout: Layout, transport: Transport, policy: QueuePolicy) -> None:
        self.layout = layout
        self.transport = transport
        self.policy = policy
        self._lock = threading.Lock()
        #: name -> size of the sends this process admitted and has not yet exposed (or given up)
        self._pending: dict[str, int] = {}

    def depth(self) -> Depth:
        """The messages waiting in the box now (one listing), plus this process's sends in
        flight that the listing does not show yet."""
        with self._lock:
            return self._depth()

    def _depth(self) -> Depth:
        try:
            entries = self.transport.list(self.layout.box)
        except NotFound:
            entries = []
        # Decoded as a consumer decodes them: a file that is no message of this endpoint (a
        # foreign name, left untouched for ever) would otherwise take room it never frees.
        found = self.layout.candidates(entries)
        names = {c.name for c in found}
        extra = [size for name, size in self._pending.items() if name not in names]
        return Depth(len(found) + len(extra), sum(max(c.size, 0) for c in found) + sum(extra))

    def overflow(self, depth: Depth, size: int | None) -> tuple[str, int] | None:
        """``(limit, bound)`` that a message of ``size`` bytes (None: unknown, counted as 0)
        would pass in a box at ``depth``; None if it fits."""
        p = self.policy
        if p.max_messages is not None and depth.messages >= p.max_messages:
            return "max_messages", p.max_messages
        if p.max_bytes is not None and depth.bytes + (size or 0) > p.max_bytes:
            return "max_bytes", p.max_bytes
        return None

    @contextmanager
    def admit(self, name: str, size: int | None) -> Iterator[QueueFull | None]:
        """Count the box for a send of ``name`` (``size`` bytes).

        Yields None when it fits: the send is counted as pending until the block ends (by then
        it is in the box, or failed).  When it does not: ``on_overflow: reject`` raises QueueFull
        before the block, with nothing staged or journaled; ``dead_letter`` yields the QueueFull
        the caller files the message with instead.
        """
        with self._lock:
            # Listed under the lock: a second thread of this process must see the first one's
            # message, in the listing or as pending, or the two would take the same last place.
            depth = self._depth()
            full = self.overflow(depth, size)
            if full is None:
                self._pending[name] = size or 0
        if full is not None:
            limit, bound = full
            error = QueueFull(self.layout.display, limit, bound, depth.messages, depth.bytes, size)
            if self.policy.on_overflow == "reject":
                raise error
            yield error
            return
        try:
            yield None
        finally:
            with self._lock:
                self._pending.pop(name, None)

    @contextmanager
    def admit_all(self, sends: list[tuple[str, int | None]]) -> Iterator[None]:
        """Count the box for several sends at once (the members of one transaction bound for it,
        ``(name, size)`` each): all fit, and are counted as pending until the block ends, or
        QueueFull is raised for the first that does not, whatever ``on_overflow`` says (a
        transaction is all or none, so it cannot file one member as a dead letter and expose
        the others: the caller refuses the whole transaction)."""
        with self._lock:
            # One listing for all of them, under the lock as in admit(): the members are counted
            # one after another on top of it, each seeing the ones before it.
            depth = self._depth()
            count, total = depth.messages, depth.bytes
            for _name, size in sends:
                full = self.overflow(Depth(count, total), size)
                if full is not None:
                    limit, bound = full
                    raise QueueFull(self.layout.display, limit, bound, count, total, size)
                count, total = count + 1, total + (size or 0)
            for name, size in sends:
                self._pending[name] = size or 0
        try:
            yield None
        finally:
            with self._lock:
                for name, _ in sends:
                    self._pending.pop(name, None)


__all__ = ["Capacity", "Depth"]
