"""Browsing: the messages waiting in an endpoint's inbox, in the order a provider takes them,
without claiming, moving or changing any (``Client.browse``, ``ftpbc browse``).

One listing of the box, streamed, decoded and ordered by the layout exactly as a provider's
listing is (:func:`~ftpbc.exchange.layout.delivery_order`: higher priority first, then the
oldest file), less the messages past their expiration (never delivered, so not waiting for
delivery), then the selector and the limit; only the best ``limit`` are kept while it streams.
Bodies, when asked for, are read one ``get`` each, no further than the listed size
(:func:`~ftpbc.exchange.deadletter.read_listed`).  Nothing is written: a listing that finds a
link or a fifo planted in the box leaves it for a serving node to file.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ftpbc.errors import MessageTooLarge, NotFound
from ftpbc.exchange.deadletter import envelope_json, read_listed
from ftpbc.exchange.layout import Candidate, delivery_order
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.model.envelope import Envelope
from ftpbc.model.selector import Selector
from ftpbc.transport.base import Entry, Refused


@dataclass(frozen=True)
class Waiting:
    """One message waiting in a box.  ``body`` is None unless bodies were asked for, and for
    a message listed larger than the endpoint's ``max_message_bytes`` (left unread)."""

    path: str
    """Its remote path on the server."""
    name: str
    """Its file name (``req.<uuid>``, ``msg.<uuid>``, with header fields where they differ)."""
    size: int
    """Its size in bytes, as listed."""
    mtime: datetime | None
    """When it was last written, as the server lists it (None when the server does not say)."""
    envelope: Envelope
    """Its headers and properties, decoded from the name (``envelope.headers``,
    ``envelope.properties``)."""
    body: bytes | None = None
    """Its body when bodies were asked for, else None."""

    @property
    def id(self) -> str:
        """The message's id."""
        return self.envelope.headers.id

    def as_json(self) -> dict[str, Any]:
        """The message as JSON (without its body: the caller decides how to show bytes)."""
        out: dict[str, Any] = {"id": self.id, "name": self.name, "path": self.path, "size": self.size,
                               "mtime": self.mtime.isoformat(timespec="milliseconds") if self.mtime else None}
        out.update(envelope_json(self.envelope))
        return out


def browse_box(lc: Lifecycle, selector: Selector | None = None, *, limit: int | None = None,
               bodies: bool = False) -> list[Waiting]:
    """The messages waiting in ``lc``'s box in delivery order, those ``selector`` selects, at
    most ``limit``; with ``bodies``, each one's bytes.  A message taken by a consumer between
    the listing and the read of its body is left out (it is no longer waiting).

    The listing streams through a bounded selection: memory grows with ``limit`` (and with the
    box only when there is none, or with a layout that judges whole listings: ``stable_for``,
    ``done_file``), never with what the box holds beyond it."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    layout = lc.layout
    # With bodies, a few more than the limit are kept: one taken before its read gives its
    # place to the next, as far as they go.
    keep = None if limit is None else limit + (_SPARE if bodies and limit else 0)
    gate = layout.gate()
    best: dict[str, Candidate] = {}  # by name: a retried listing may show an entry twice

    def admit(c: Candidate) -> None:
        nonlocal best
        if lc.is_expired(c):
            return  # never delivered, so not waiting for delivery
        env = c.envelope
        if selector is not None and not selector.matches(env.headers, env.properties):
            return
        best[c.name] = c
        if keep is not None and len(best) >= keep + keep // 2 + 64:
            best = _best(best.values(), keep)

    def visit(e: Entry) -> bool:
        c = layout.candidate(e)
        if gate is not None:
            gate.see(e, c)
        elif c is not None:
            admit(c)
        return True

    # Refused entries (links, fifos: a serving node files them) are no messages to show, and
    # filing them is that node's job, not a browser's: collected here and left alone.
    refused: list[Refused] = []
    try:
        lc.transport.scan(layout.box, visit, refuse_dirs=layout.files_only, refused=refused)
    except NotFound:
        return []
    for c in (gate.admitted(time.monotonic()) if gate is not None else ()):
        admit(c)
    found: list[Waiting] = []
    for c in _best(best.values(), keep).values():
        if limit is not None and len(found) >= limit:
            break
        path = layout.box_path(c.name)
        body: bytes | None = None
        if bodies:
            try:
                body = read_listed(lc, path, c.size)
            except NotFound:
                continue
            except MessageTooLarge:
                body = None
        found.append(Waiting(path, c.name, c.size, c.mtime, c.envelope, body))
    return found


#: candidates kept beyond the limit when bodies are read (their places, if some are taken)
_SPARE = 16


def _best(candidates: Iterable[Candidate], keep: int | None) -> dict[str, Candidate]:
    """The first ``keep`` (None: all) in delivery order, by name, in that order."""
    chosen = sorted(candidates, key=delivery_order) if keep is None else heapq.nsmallest(
        keep, candidates, key=delivery_order)
    return {c.name: c for c in chosen}


__all__ = ["Waiting", "browse_box"]
