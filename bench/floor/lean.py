"""The protocol floor: the leanest bare ftplib / paramiko session that can do ftpbc's operations.

Nothing here is ftpbc code.  A :class:`Lean` session does exactly one protocol operation per
call and nothing else: no journal, no lock, no retry, no pattern, no pool.  What it does once per
session is what any careful bare script would do (docs/benchmarks.md, "How it measures"):

* FTP: ``TCP_NODELAY`` on the control socket and every data socket, ``TYPE I`` once, data
  connections opened with ``transfercmd`` (``storbinary``/``retrbinary`` would resend ``TYPE``
  on every call); listings by ``NLST`` (names only: the floor needs nothing more);
* SFTP: ``TCP_NODELAY`` on the socket, ``listdir``, ``posix_rename``, prefetching reads.

A bench side builds one :class:`Lean` per thread from a :class:`Target` description (a plain
dict, so it crosses process boundaries as JSON).
"""

from __future__ import annotations

import ftplib
import io
import posixpath
import socket
from typing import Any, BinaryIO, Protocol

CHUNK = 256 * 1024


def nodelay(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Lean(Protocol):
    """One bare session; paths are relative to the target's base directory."""

    def put(self, path: str, data: bytes) -> None: ...
    def put_stream(self, path: str, stream: BinaryIO) -> int: ...
    def get(self, path: str) -> bytes: ...
    def get_stream(self, path: str, sink: BinaryIO) -> int: ...
    def rename(self, src: str, dst: str) -> bool: ...
    def names(self, directory: str) -> list[str]: ...
    def mkdir(self, path: str) -> None: ...
    def close(self) -> None: ...


class LeanFTP:
    """ftplib with TYPE I once per session and raw transfer commands."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.base = target["base"].rstrip("/")
        self.ftp = ftplib.FTP()
        self.ftp.connect(target["host"], target["port"], timeout=60)
        nodelay(self.ftp.sock)
        self.ftp.login(target["user"], target["password"])
        self.ftp.voidcmd("TYPE I")

    def _p(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def put(self, path: str, data: bytes) -> None:
        conn = self.ftp.transfercmd(f"STOR {self._p(path)}")
        nodelay(conn)
        conn.sendall(data)
        conn.close()
        self.ftp.voidresp()

    def put_stream(self, path: str, stream: BinaryIO) -> int:
        total = 0
        conn = self.ftp.transfercmd(f"STOR {self._p(path)}")
        while chunk := stream.read(CHUNK):
            conn.sendall(chunk)
            total += len(chunk)
        conn.close()
        self.ftp.voidresp()
        return total

    def get(self, path: str) -> bytes:
        buf = io.BytesIO()
        self.get_stream(path, buf)
        return buf.getvalue()

    def get_stream(self, path: str, sink: BinaryIO) -> int:
        total = 0
        conn = self.ftp.transfercmd(f"RETR {self._p(path)}")
        nodelay(conn)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := conn.recv_into(buf):
            sink.write(view[:n])
            total += n
        conn.close()
        self.ftp.voidresp()
        return total

    def rename(self, src: str, dst: str) -> bool:
        """True if this session won the rename (False: the source was gone: a lost race)."""
        try:
            self.ftp.sendcmd(f"RNFR {self._p(src)}")
            self.ftp.voidcmd(f"RNTO {self._p(dst)}")
        except ftplib.error_perm:
            return False
        return True

    def names(self, directory: str) -> list[str]:
        lines: list[str] = []
        conn = self.ftp.transfercmd(f"NLST {self._p(directory)}")
        nodelay(conn)
        raw = bytearray()
        while chunk := conn.recv(CHUNK):
            raw += chunk
        conn.close()
        self.ftp.voidresp()
        for line in raw.decode("utf-8", "surrogateescape").splitlines():
            if line:
                lines.append(posixpath.basename(line))
        return lines

    def mkdir(self, path: str) -> None:
        try:
            self.ftp.voidcmd(f"MKD {self._p(path)}")
        except ftplib.error_perm:
            pass  # exists

    def close(self) -> None:
        try:
            self.ftp.quit()
        except (OSError, EOFError, ftplib.Error):
            self.ftp.close()


class LeanSFTP:
    """paramiko SFTP with TCP_NODELAY, posix-rename and prefetching reads."""

    def __init__(self, target: dict[str, Any]) -> None:
        import paramiko

        self.base = target["base"].rstrip("/")
        sock = socket.create_connection((target["host"], target["port"]), timeout=60)
        nodelay(sock)
        self.transport = paramiko.Transport(sock)
        self.transport.start_client(timeout=60)
        key = paramiko.Ed25519Key.from_private_key_file(target["key_file"])
        self.transport.auth_publickey(target["user"], key)
        self.sftp = paramiko.SFTPClient.from_transport(self.transport)
        assert self.sftp is not None

    def _p(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def put(self, path: str, data: bytes) -> None:
        self.put_stream(path, io.BytesIO(data))

    def put_stream(self, path: str, stream: BinaryIO) -> int:
        return int(self.sftp.putfo(stream, self._p(path), confirm=False).st_size or 0)

    def get(self, path: str) -> bytes:
        buf = io.BytesIO()
        self.get_stream(path, buf)
        return buf.getvalue()

    def get_stream(self, path: str, sink: BinaryIO) -> int:
        return int(self.sftp.getfo(self._p(path), sink, prefetch=True))

    def rename(self, src: str, dst: str) -> bool:
        try:
            self.sftp.posix_rename(self._p(src), self._p(dst))
        except OSError:
            return False
        return True

    def names(self, directory: str) -> list[str]:
        return self.sftp.listdir(self._p(directory))

    def mkdir(self, path: str) -> None:
        try:
            self.sftp.mkdir(self._p(path))
        except OSError:
            pass  # exists

    def close(self) -> None:
        self.sftp.close()
        self.transport.close()


def connect(target: dict[str, Any]) -> Lean:
    """A bare session on ``target`` (``kind`` ``sshd`` is SFTP, anything else FTP)."""
    return LeanSFTP(target) if target["kind"] == "sshd" else LeanFTP(target)
