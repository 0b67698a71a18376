"""What an endpoint's configuration asks of its queue beyond moving files (docs/queues.md):
the selector of its consumers, what happens to expired messages and to messages that exhausted
their deliveries, and its bounds.  A :class:`Lifecycle` holds one; a transfer's is the default
(no selector, no expiry, no bounds: a partner's names carry no headers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ftpbc.config.models import EndpointConfig
from ftpbc.model.selector import Selector, compile_selector

Disposal = Literal["discard", "dead_letter"]
Overflow = Literal["reject", "dead_letter"]


@dataclass(frozen=True)
class QueuePolicy:
    #: messages this node takes (None: all); the others stay for other consumers
    selector: Selector | None = None
    #: messages past their expiration are never delivered (the inbound side of an endpoint)
    expires: bool = False
    #: where expired messages go: discard = the expired directory, dead_letter = the dead letters
    expired: Disposal = "discard"
    #: messages that exhausted max_deliveries go to the dead letters instead of the error directory
    dead_letter: bool = False
    #: a send finding this many messages (or bytes) waiting is refused or dead-lettered
    max_messages: int | None = None
    max_bytes: int | None = None
    on_overflow: Overflow = "reject"

    @property
    def bounded(self) -> bool:
        return self.max_messages is not None or self.max_bytes is not None

    @classmethod
    def of(cls, ep: EndpointConfig, direction: Literal["in", "out"]) -> QueuePolicy:
        """The policy of one direction of an endpoint (only requests and one-way messages
        expire, are selected, dead-lettered and bounded; responses go to one waiting caller)."""
        if direction != "in":
            return cls()
        return cls(expires=True, expired=ep.expired, dead_letter=ep.dead_letter,
                   max_messages=ep.max_messages, max_bytes=ep.max_bytes, on_overflow=ep.on_overflow,
                   selector=compile_selector(ep.selector) if ep.selector is not None else None)


DEFAULT_POLICY = QueuePolicy()
