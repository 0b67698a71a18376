"""FTP data connections: passive mode, TLS data channels, transfers and listings read off them.

This module opens data connections itself (EPSV when advertised, else PASV; active mode is not
implemented, and ``passive: false`` is refused when the transport is built): ftplib's
``storbinary``/``retrbinary`` re-send ``TYPE`` on every call, and here one STOR costs one data
connection and nothing more.  A PASV reply naming another address than the control
connection's peer (a server behind NAT announcing its private address, or one trying to send
ftpbc elsewhere) is ignored in favour of the control host; EPSV replies carry a port only.  A
``425`` to EPSV/PASV (ProFTPD failing to bind the passive port it picked) is asked again up to
PASSIVE_RETRIES times: no transfer command was sent yet.

Over FTPS the data channel is TLS too, resuming the control connection's TLS session (vsftpd
requires it).  TLS data connections set ``TCP_QUICKACK`` (Linux) after every read: a server that
sends its close_notify with Nagle on (pure-ftpd) would otherwise hold it until the client's
delayed ACK fires, a pause on every listing.

Bounds: a transfer (get, put, listing) must move ``min_transfer_rate`` bytes/s over every
``min_rate_window`` seconds, or it fails as a timeout (the transport maps it: TransportTimeout
for a read, OutcomeUnknown for a STOR, whose command went out).  A listing holds at most
``max_listing_entries`` lines (+1, for LIST's "total"), each of at most MAX_LISTING_LINE bytes.
"""

from __future__ import annotations

import builtins
import ftplib
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ProtocolError
from ftpbc.transport.base import Entry, Visit
from ftpbc.transport.errormap import Progress, RateGuard
from ftpbc.transport.ftp.control import Session, nodelay
from ftpbc.transport.ftp.listing import LineParser
from ftpbc.transport.names import LoggedOnce

log = logging.getLogger("ftpbc.ftp")

CHUNK = 256 * 1024
#: bytes handed to a TLS data socket per write while its rate is watched (one TLS record)
_TLS_PIECE = 16 * 1024
#: bytes one listing line may take (a name is at most MAX_NAME characters, see names.py)
MAX_LISTING_LINE = 64 * 1024
#: a transient 425 to EPSV/PASV is asked again this many times, the pause doubling each time
PASSIVE_RETRIES = 3
#: a body of up to this many bytes, in memory, is written to a plain data connection right after
#: STOR, without waiting for the server's 150 first: one round trip less for every message
#: staged.  It fits in the socket buffers of a connection the server has not accepted yet, so
#: the write never waits on the server; a server refusing the STOR (550, 553, 452) never reads
#: it, and its refusal comes on the control connection as it would have.  Not over TLS, whose
#: handshake needs the server to accept first.
EARLY_STOR_MAX = 32 * 1024
_TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class Transfers:
    """The data connections of one server's sessions: opened for a command, guarded by the
    minimum rate, closed after; and what goes through them (a file either way, a listing)."""

    def __init__(self, cfg: ServerConfig, context: ssl.SSLContext | None, reported: LoggedOnce) -> None:
        self.cfg = cfg
        self.server = cfg.display
        #: the TLS context of the data channel (None: plain FTP)
        self.context = context
        #: bad listing lines and refused names already logged
        self.reported = reported

    def store(self, s: Session, command: str, path: str, stream: BinaryIO, progress: Progress, *,
              early: bool) -> int:
        """Send ``stream`` (from where it is) for ``command`` (STOR) and read the server's final
        reply; the bytes sent.  ``early``: see EARLY_STOR_MAX and :meth:`open`."""
        total = 0
        try:
            with self.open(s, command, path, progress, early=early) as conn:
                guard = self.guard(conn)
                for chunk in chunks(stream):
                    send_all(conn, chunk, guard)
                    total += len(chunk)
                unwrap(conn)
        except OSError:
            if early and progress.sent:
                # A server that refused the STOR may have reset the connection the body went
                # into: its reply says why (and is raised as such), and keeps the session in
                # step.  (Not when the data connection failed before STOR went out: no reply
                # is coming then.)
                transfer_opened(s.ftp)
            raise
        if early:
            transfer_opened(s.ftp)
        s.ftp.voidresp()
        return total

    def retrieve(self, s: Session, command: str, path: str, stream: BinaryIO,
                 written: builtins.list[int]) -> int:
        """Write what ``command`` (RETR) sends into ``stream`` and read the server's final reply;
        the bytes received, also added to ``written[0]`` as they come (for the caller to know
        whether any went into a stream it cannot rewind)."""
        total = 0
        buf, view = buffer()
        with self.open(s, command, path, None) as conn:
            guard = self.guard(conn)
            while n := conn.recv_into(buf):
                quickack(conn)
                stream.write(view[:n])
                total += n
                written[0] += n
                if guard is not None:
                    guard.add(n)
            unwrap(conn)
        s.ftp.voidresp()
        return total

    def read_lines(self, s: Session, command: str, path: str) -> builtins.list[str]:
        """The lines of a listing; no more than ``max_listing_entries`` (+1, for LIST's "total")."""
        limit = self.cfg.max_listing_entries + 1
        count = 0
        with self.open(s, command, path, None) as conn:
            guard = self.guard(conn)
            raw = bytearray()
            buf, view = buffer()
            while n := conn.recv_into(buf):
                quickack(conn)
                raw += view[:n]
                count += raw.count(b"\n", len(raw) - n)
                if guard is not None:
                    guard.add(n)
                if count > limit:
                    break
            else:
                unwrap(conn)
        if count > limit:
            # Data connection closed early: the server answers 426 (or 226 if it had sent all).
            try:
                s.ftp.voidresp()
            except ftplib.Error:
                pass
            log.warning("%s %s: listing stopped at %d entries (max_listing_entries)", self.server, path,
                        self.cfg.max_listing_entries)
        else:
            s.ftp.voidresp()
        text = raw.decode("utf-8", errors="surrogateescape")
        lines = [ln for ln in text.split("\r\n" if "\r\n" in text else "\n") if ln]
        if count > limit:
            lines = lines[:self.cfg.max_listing_entries]
        return lines

    def stream(self, s: Session, command: str, path: str, parse: Callable[[str], Entry | None],
               visit: Visit, *, label: str, reply: builtins.list[str] | None = None) -> bool:
        """Parse a listing's lines as they arrive and hand each entry to ``visit``; True if read
        to its end, False if ``visit`` stopped it.  The bounds of :meth:`read_lines` hold
        (``max_listing_entries``), a line may be MAX_LISTING_LINE bytes, and a line that does
        not parse is skipped as :func:`~ftpbc.transport.ftp.listing.parse_listing` does.
        ``reply`` (a list) gets the server's closing reply of a listing read to its end."""
        limit = self.cfg.max_listing_entries + 1  # + LIST's "total" line
        lines = LineParser(parse, server=self.server, path=path, command=label, reported=self.reported)
        count = 0
        stopped = over = False
        with self.open(s, command, path, None) as conn:
            guard = self.guard(conn)
            pending = b""
            buf, view = buffer()
            while not (stopped or over) and (n := conn.recv_into(buf)):
                quickack(conn)
                if guard is not None:
                    guard.add(n)
                *complete, pending = (pending + view[:n]).split(b"\n")
                if len(pending) > MAX_LISTING_LINE:
                    raise ProtocolError(f"a {label} line longer than {MAX_LISTING_LINE} bytes",
                                        server=self.server, path=path)
                for raw in complete:
                    count += 1
                    if count > limit:
                        over = True
                        break
                    entry = lines.feed(raw)
                    if entry is not None and not visit(entry):
                        stopped = True
                        break
            if not (stopped or over):
                if pending and (entry := lines.feed(pending)) is not None:
                    visit(entry)
                unwrap(conn)
        if stopped or over:
            # Data connection closed early: the server answers 426 (or 226 if it had sent all).
            try:
                s.ftp.voidresp()
            except ftplib.Error:
                pass
            if over:
                log.warning("%s %s: listing stopped at %d entries (max_listing_entries)", self.server, path,
                            self.cfg.max_listing_entries)
        else:
            closing = s.ftp.voidresp()
            if reply is not None:
                reply.append(closing)
        lines.finish()
        return not stopped

    def guard(self, conn: socket.socket) -> RateGuard | None:
        """The minimum-rate check for one transfer on ``conn``, None when it is off.

        Each read or write of ``conn`` then waits at most ``min_rate_window``: a transfer that
        stalls completely fails as soon as one that trickles does.
        """
        cfg = self.cfg
        if cfg.min_transfer_rate <= 0:
            return None
        current = conn.gettimeout()
        if current is None or current > cfg.min_rate_window:
            conn.settimeout(cfg.min_rate_window)
        return RateGuard(cfg.min_transfer_rate, cfg.min_rate_window)

    @contextmanager
    def open(self, s: Session, command: str, path: str, progress: Progress | None, *,
             early: bool = False) -> Iterator[socket.socket]:
        """A data connection for ``command`` (STOR/RETR/LIST...), closed after the block.

        ``early`` (plain connections only): the block starts as soon as the command is sent,
        before the server's reply opening the transfer, which the caller then reads with
        :func:`transfer_opened` after the block (see EARLY_STOR_MAX).
        """
        ftp = s.ftp
        host, port = self.passive(s)
        conn = dial(s.family, host, port, ftp.timeout)
        try:
            if self.context is not None or early or not command.startswith("STOR "):
                # TLS writes its handshake and, after the data, its close_notify as small
                # records of their own: Nagle's algorithm would hold each behind the server's
                # delayed ACK.  A plain upload streamed in chunks is left to Nagle: its data
                # goes out in full segments (one per write's tail otherwise, a wake-up of the
                # server each, a slower large upload: docs/benchmarks.md, "Tenth pass"), and
                # the close that ends the STOR sends what is left at once.
                nodelay(conn)
            ftp.putcmd(command)
            if progress is not None:
                progress.sent = True
            if not early:
                transfer_opened(ftp)
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_hostname=self.cfg.host,
                                                 session=tls_session(s))
                quickack(conn)
        except BaseException:
            conn.close()
            raise
        try:
            yield conn
        finally:
            conn.close()

    def passive(self, s: Session) -> tuple[str, int]:
        """Where to open the next data connection: EPSV when advertised, else PASV.

        A 425 is asked again, up to PASSIVE_RETRIES times with a short backoff: ProFTPD answers
        "425 Unable to build data connection: Address already in use" when the passive port it
        picked at random cannot be bound, and picks another one next time.  Nothing was sent
        but the passive request itself, so asking again changes nothing on the server.
        """
        ftp = s.ftp
        for attempt in range(PASSIVE_RETRIES + 1):
            try:
                if s.has("EPSV"):
                    # parse229 takes the host from its second argument: the control
                    # connection's peer, known since connect (no getpeername per transfer).
                    return ftplib.parse229(ftp.sendcmd("EPSV"), (s.peer_host, 0))
                _announced, port = ftplib.parse227(ftp.sendcmd("PASV"))
                # A server behind NAT announces its private address; the control host works.
                return s.peer_host, port
            except ftplib.error_temp as exc:
                if not str(exc).startswith("425") or attempt == PASSIVE_RETRIES:
                    raise
            time.sleep(0.01 * 2**attempt)
        raise AssertionError("unreachable")


# --------------------------------------------------------------------------- helpers


def dial(family: int, host: str, port: int, timeout: float | None) -> socket.socket:
    """A TCP connection to ``host`` (the control connection's numeric peer address, so of its
    ``family``): no name lookup per transfer, where ``socket.create_connection`` makes one
    (``getaddrinfo`` and an IDNA encoding) for every data connection."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def send_all(conn: socket.socket, data: memoryview | bytes, guard: RateGuard | None) -> None:
    """``conn.sendall(data)``, counting what goes out against ``guard``'s minimum rate.

    Sent piece by piece so that the guard sees progress: one ``sendall`` of a whole chunk may
    take long at a slow but acceptable rate, and a TLS socket writes all of what it is given
    before returning, so it gets at most one TLS record's worth at a time.
    """
    if guard is None:
        conn.sendall(data)
        return
    view = memoryview(data)
    piece = _TLS_PIECE if isinstance(conn, ssl.SSLSocket) else len(view)
    while view:
        n = conn.send(view[:piece])
        guard.add(n)
        view = view[n:]


def transfer_opened(ftp: ftplib.FTP) -> None:
    """Read the reply that opens a transfer (1xx); a refusal is raised as ftplib's error."""
    resp = ftp.getresp()
    if resp[0] == "2":  # some servers send 2xx before the transfer reply
        resp = ftp.getresp()
    if resp[0] != "1":
        raise ftplib.error_reply(resp)


def small_in_memory(stream: BinaryIO, start: int | None) -> bool:
    """Whether ``stream`` is in memory with at most EARLY_STOR_MAX bytes left from ``start``."""
    if start is None or not isinstance(stream, io.BytesIO):
        return False
    with stream.getbuffer() as view:
        return view.nbytes - start <= EARLY_STOR_MAX


def unwrap(conn: socket.socket) -> None:
    # A clean TLS shutdown tells the server the transfer ended where it should have.
    if isinstance(conn, ssl.SSLSocket):
        with suppress(OSError, ValueError):
            conn.unwrap()


def quickack(conn: socket.socket) -> None:
    """Acknowledge at once what arrives next on a TLS data connection (Linux TCP_QUICKACK).

    A server that writes its close_notify right after the last data with Nagle's algorithm on
    (pure-ftpd) holds it until that data is acknowledged, and a client in delayed-ACK mode
    acknowledges only when its timer fires, a pause far longer than the listing itself.  The
    kernel clears the flag by itself, so it is set again after every read.
    """
    if _TCP_QUICKACK is not None and isinstance(conn, ssl.SSLSocket):
        with suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)


def tls_session(s: Session) -> ssl.SSLSession | None:
    # Reusing the control connection's TLS session is required by vsftpd (require_ssl_reuse).
    sock = s.ftp.sock
    return sock.session if isinstance(sock, ssl.SSLSocket) else None



_buffers = threading.local()


def buffer() -> tuple[bytearray, memoryview]:
    """This thread's transfer buffer (CHUNK bytes) and a view of it.

    Allocated once per thread, not per transfer: a fresh zero-filled 256 KiB bytearray is an
    mmap, 64 page faults and an munmap, which cost more CPU than the rest of a small STOR.
    A transfer runs on one thread from start to end, so the buffer is never shared.
    """
    try:
        return _buffers.pair  # type: ignore[no-any-return]
    except AttributeError:
        buf = bytearray(CHUNK)
        _buffers.pair = (buf, memoryview(buf))
        return _buffers.pair  # type: ignore[no-any-return]


def chunks(stream: BinaryIO) -> Iterator[memoryview | bytes]:
    """``stream``'s content in chunks of up to CHUNK bytes, into one reused buffer if it can."""
    if isinstance(stream, io.BytesIO):
        # A message body in memory: read() hands back the very bytes object it was made from
        # (no copy) when it is read whole from the start, the usual case.
        while chunk := stream.read(CHUNK):
            yield chunk
    elif isinstance(stream, io.BufferedIOBase):
        # readinto a single buffer: no allocation per chunk, so memory stays flat however
        # large the file (a fresh 256 KiB bytes per chunk lets the C heap fragment and grow).
        buf, view = buffer()
        while n := stream.readinto(buf):
            yield view[:n]
    else:
        while chunk := stream.read(CHUNK):
            yield chunk
