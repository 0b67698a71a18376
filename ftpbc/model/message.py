"""What a handler receives, and what it may return (public as :class:`ftpbc.Message` and
:data:`ftpbc.HandlerResult`)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import IO, Any

from ftpbc.model.headers import Headers, PropertyValue

HandlerResult = bytes | bytearray | str | None
"""What a handler may return: bytes or text (sent as UTF-8) become the response body, None an
empty one (a file object is read whole, too).  Anything else is a TypeError, which counts as
the handler's failure: an error reply."""

_NO_PROPERTIES: Mapping[str, PropertyValue] = MappingProxyType({})


@dataclass
class Message:
    """One inbound message, as a handler receives it.  ``stream`` reads the body without loading
    it all into memory.

    Guaranteed: the body is whole (its size was checked against the listing) and the same
    however often it is read; ``headers`` and ``properties`` are what the file name carried
    (docs/naming.md).  The body is spooled to a temporary file past a few MiB, so a large
    request costs disk, not memory, unless the handler asks for :attr:`body`.  The message a
    handler receives is valid during that call only: its body is closed afterwards.  Handlers
    do not make messages; the constructor is internal.
    """

    endpoint: str
    """The endpoint (or transfer, or ``TOPIC/SUB`` subscription) the message arrived on."""
    name: str
    """Its file name in the box, e.g. ``req.<uuid>`` (with header fields where they differ)."""
    uuid: str | None
    """Its message id (the ``<uuid>`` of its name); None for a transfer's file without one."""
    size: int
    """The body's length in bytes."""
    _spool: IO[bytes] = field(repr=False)
    values: dict[str, Any] = field(default_factory=dict)
    """What a transfer's ``receive_from`` pattern matched in the name (``%*0``..., dates,
    counters); empty for endpoints."""
    headers: Headers | None = None
    """Its headers (priority, expiration, correlation id, reply-to, type, delivery count...);
    never None once made: a name without header fields gives the defaults."""
    properties: Mapping[str, PropertyValue] = field(default_factory=lambda: _NO_PROPERTIES)
    """Its typed properties (read-only), from the name's property fields."""

    def __post_init__(self) -> None:
        if self.headers is None:
            self.headers = Headers(id=self.uuid or self.name)

    @property
    def stream(self) -> IO[bytes]:
        """The body as a binary file, rewound to its start at each access."""
        self._spool.seek(0)
        return self._spool

    @property
    def body(self) -> bytes:
        """The whole body in memory."""
        return self.stream.read()

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded; UnicodeDecodeError if it is not ``encoding``."""
        return self.body.decode(encoding)


def result_bytes(result: object) -> bytes:
    """The response body for a handler's return value; TypeError for anything else."""
    if result is None:
        return b""
    if isinstance(result, bytes | bytearray):
        return bytes(result)
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, io.IOBase):
        data = result.read()
        return data if isinstance(data, bytes) else str(data).encode("utf-8")
    raise TypeError(f"handler returned {type(result).__name__}; expected bytes, str or None")
