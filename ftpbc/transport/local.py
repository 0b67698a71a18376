"""A local or NFS-mounted directory as a transport (``file:///srv/exchange``).

Guarantees: ``rename`` is ``os.replace`` (atomic on POSIX filesystems, NFS included, which is
what makes staging-then-exposing safe); ``put`` writes, then fsyncs before returning when
``durable`` is on, so a file renamed into place after a crash is never empty or torn.

Not guaranteed: timeouts.  Local system calls cannot be interrupted from Python; on a hard-mounted
NFS share whose server is gone, an operation blocks until the server returns.  Mount with
``soft,timeo=...`` if you prefer an error to a wait.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ftpbc.errors import (
    AlreadyExists,
    NotFound,
    PermissionDenied,
    SourceGone,
    TransportError,
)
from ftpbc.transport.base import Entry, Transport, normalize

CHUNK = 1 << 20


class LocalTransport(Transport):
    def __init__(self, base: str | Path, *, durable: bool = True) -> None:
        self.base = Path(base)
        self.durable = durable
        self.server = f"file://{self.base}"

    def _real(self, path: str) -> Path:
        return self.base / normalize(path).lstrip("/")

    @contextmanager
    def _mapped(self, path: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise NotFound("no such file or directory", server=self.server, path=path) from None
        except FileExistsError:
            raise AlreadyExists("already exists", server=self.server, path=path) from None
        except PermissionError:
            raise PermissionDenied("permission denied", server=self.server, path=path) from None
        except IsADirectoryError:
            raise TransportError("is a directory", server=self.server, path=path) from None
        except NotADirectoryError:
            raise NotFound("a parent is not a directory", server=self.server, path=path) from None
        except OSError as exc:
            raise TransportError(exc.strerror or str(exc), server=self.server, path=path) from None

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        real = self._real(path)
        out: list[Entry] = []
        with self._mapped(path), os.scandir(real) as it:
            for de in it:
                try:
                    st = de.stat()
                except FileNotFoundError:
                    continue  # removed between readdir and stat: a snapshot may miss it
                out.append(Entry(de.name, st.st_size,
                                 datetime.fromtimestamp(st.st_mtime, UTC), de.is_dir()))
        return out

    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        real = self._real(path)
        total = 0
        with self._mapped(path), open(real, "wb") as fh:
            while chunk := stream.read(CHUNK):
                fh.write(chunk)
                total += len(chunk)
            if self.durable:
                fh.flush()
                os.fsync(fh.fileno())
        return total

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        real = self._real(path)
        with self._mapped(path), open(real, "rb") as fh:
            return _copy(fh, stream)

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        rsrc, rdst = self._real(src), self._real(dst)
        try:
            os.replace(rsrc, rdst)
        except FileNotFoundError:
            if not rsrc.exists():
                raise SourceGone("rename source is gone", server=self.server, path=src) from None
            raise NotFound("rename target directory does not exist", server=self.server, path=dst) from None
        except OSError as exc:
            with self._mapped(dst):
                raise exc

    def delete(self, path: str, *, timeout: float | None = None) -> None:
        with self._mapped(path):
            os.unlink(self._real(path))

    def mkdir(self, path: str, *, timeout: float | None = None) -> None:
        with self._mapped(path):
            os.makedirs(self._real(path), exist_ok=True)

    def stat(self, path: str, *, timeout: float | None = None) -> Entry:
        real = self._real(path)
        with self._mapped(path):
            st = real.stat()
        return Entry(real.name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC),
                     os.path.isdir(real))


def _copy(src: BinaryIO, dst: BinaryIO) -> int:
    total = 0
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        total += len(chunk)
    return total
