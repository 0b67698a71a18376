"""Bounds on message sizes: ``max_message_bytes``, and reads that stop where the listing said.

A listing's size is the server's word, and a hostile or broken server can list 5 bytes and send
300 MiB.  :class:`BoundedSink` stands between a transport's ``get`` and the spool it fills, and
raises :class:`~ftpbc.errors.ReadPastSize` as soon as more than the listed size plus
:data:`READ_MARGIN` arrived: the node never holds or spools more than that, whatever is sent.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO, cast

from ftpbc.errors import MessageTooLarge, ReadPastSize

#: the default of ``max_message_bytes`` (endpoints and transfers)
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
#: bytes a read may go past the listed size before it is stopped (a size changed by a few bytes
#: is still reported exactly by the size check after the read)
READ_MARGIN = 64 * 1024


def body_length(body: bytes | bytearray | BinaryIO) -> int | None:
    """The bytes left in ``body``: its length, or a seekable stream's remaining size; None if
    it cannot be known without reading it (a pipe, a socket)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    try:
        if not body.seekable():
            return None
        here = body.tell()
        end = body.seek(0, os.SEEK_END)
        body.seek(here)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return max(0, end - here)


def check_body(body: bytes | bytearray | BinaryIO, limit: int, what: str) -> None:
    """Raise MessageTooLarge if ``body``'s known length is over ``limit``."""
    size = body_length(body)
    if size is not None and size > limit:
        raise MessageTooLarge(what, size, limit)


class BoundedSink(io.RawIOBase):
    """A write-only view of ``sink`` that refuses to receive more than ``limit`` bytes.

    Seeking (a transport rewinding to retry) moves the count with it, so a repeated read is
    bounded the same way.
    """

    def __init__(self, sink: BinaryIO, limit: int, *, server: str, path: str, listed: str) -> None:
        super().__init__()
        self._sink = sink
        self._limit = limit
        self._server = server
        self._path = path
        self._listed = listed
        try:
            self._base = sink.tell()
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            self._base = 0
        self._count = 0

    def as_binary(self) -> BinaryIO:
        return cast(BinaryIO, self)

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._sink.seekable())

    def tell(self) -> int:
        return self._sink.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        pos = self._sink.seek(offset, whence)
        self._count = max(0, pos - self._base)
        return pos

    def truncate(self, size: int | None = None) -> int:
        return self._sink.truncate(size)

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        n = len(data)
        if self._count + n > self._limit:
            raise ReadPastSize(f"the server sent more than {self._limit} bytes of a file listed with "
                               f"{self._listed}; the read was stopped there", server=self._server,
                               path=self._path)
        self._sink.write(data)
        self._count += n
        return n

    def flush(self) -> None:
        self._sink.flush()
