"""Browsing: the messages waiting in an endpoint's inbox, in the order a provider takes them,
without claiming, moving or changing any (``Client.browse``, ``ftpbc browse``).

One listing of the box, decoded and ordered by the layout exactly as a provider's listing is
(:meth:`~ftpbc.exchange.layout.Layout.candidates`: higher priority first, then the oldest file),
less the messages past their expiration (never delivered, so not waiting for delivery), then
the selector and the limit.  Bodies, when asked for, are read one ``get`` each, no further than
the listed size (:func:`~ftpbc.exchange.deadletter.read_listed`).  Nothing is written: a listing
that finds a link or a fifo planted in the box leaves it for a serving node to file.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ftpbc.errors import MessageTooLarge, NotFound
from ftpbc.exchange.deadletter import envelope_json, read_listed
from ftpbc.exchange.envelope import Envelope
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.exchange.selector import Selector


@dataclass(frozen=True)
class Waiting:
    """One message waiting in a box.  ``body`` is None unless bodies were asked for, and for
    a message listed larger than the endpoint's ``max_message_bytes`` (left unread)."""

    path: str
    name: str
    size: int
    mtime: datetime | None
    envelope: Envelope
    body: bytes | None = None

    @property
    def id(self) -> str:
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
    the listing and the read of its body is left out (it is no longer waiting)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    layout = lc.layout
    try:
        # list_refusing, not list: entries a serving node would refuse (links, fifos) are no
        # messages to show, and filing them is that node's job, not a browser's.
        entries, _ = lc.transport.list_refusing(layout.box, refuse_dirs=layout.files_only)
    except NotFound:
        return []
    found: list[Waiting] = []
    for c in layout.candidates(entries):
        if limit is not None and len(found) >= limit:
            break
        if lc.is_expired(c):
            continue
        env = c.envelope
        if selector is not None and not selector.matches(env.headers, env.properties):
            continue
        path = layout.box_path(c.name)
        body: bytes | None = None
        if bodies:
            try:
                body = read_listed(lc, path, c.size)
            except NotFound:
                continue
            except MessageTooLarge:
                body = None
        found.append(Waiting(path, c.name, c.size, c.mtime, env, body))
    return found


__all__ = ["Waiting", "browse_box"]
