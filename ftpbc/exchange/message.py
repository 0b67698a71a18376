"""What a handler receives, and what it may return."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import IO, Any

#: Handler results: bytes or text become the response body; None an empty one.
HandlerResult = bytes | bytearray | str | None


@dataclass
class Message:
    """One inbound message.  ``stream`` reads the body without loading it all into memory.

    The body is spooled to a temporary file past a few MiB, so a 200 MiB request costs disk,
    not memory, unless the handler asks for :attr:`body`.
    """

    endpoint: str
    name: str
    uuid: str | None
    size: int
    _spool: IO[bytes] = field(repr=False)
    values: dict[str, Any] = field(default_factory=dict)

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
