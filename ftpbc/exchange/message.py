"""What a handler receives, and what it may return."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import IO, Any

from ftpbc.exchange.envelope import Headers, PropertyValue

#: Handler results: bytes or text become the response body; None an empty one.
HandlerResult = bytes | bytearray | str | None

_NO_PROPERTIES: Mapping[str, PropertyValue] = MappingProxyType({})


@dataclass
class Message:
    """One inbound message.  ``stream`` reads the body without loading it all into memory.

    The body is spooled to a temporary file past a few MiB, so a 200 MiB request costs disk,
    not memory, unless the handler asks for :attr:`body`.  ``headers`` (frozen) and
    ``properties`` are what the file name carried (docs/naming.md); ``values`` what a
    transfer's name pattern matched (``%*0``..., dates, counters).
    """

    endpoint: str
    name: str
    uuid: str | None
    size: int
    _spool: IO[bytes] = field(repr=False)
    values: dict[str, Any] = field(default_factory=dict)
    headers: Headers | None = None
    properties: Mapping[str, PropertyValue] = field(default_factory=lambda: _NO_PROPERTIES)

    def __post_init__(self) -> None:
        if self.headers is None:
            self.headers = Headers(id=self.uuid or self.name)

    @property
    def stream(self) -> IO[bytes]:
        self._spool.seek(0)
        return self._spool

    @property
    def body(self) -> bytes:
        return self.stream.read()

    def text(self, encoding: str = "utf-8") -> str:
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
