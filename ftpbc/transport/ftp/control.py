"""The FTP control connection: sessions, their replies bounded, connecting and closing.

A :class:`Session` is one logged-in control connection and what its server supports.  What each
does once, at login (:func:`connect_session`): ``TCP_NODELAY`` on the control socket, ``FEAT``
to learn MLSD/MLST/EPSV/MDTM/SIZE/UTF8, ``TYPE I``, and ``OPTS UTF8 ON`` where offered.  With
FTPS, nothing is sent before TLS is up but ``AUTH TLS`` (explicit) or nothing at all (implicit),
and bytes that came in clear after the reply to ``AUTH TLS`` refuse the session.

Bounds on the server (a hostile or broken one must not hang a node nor fill its memory):
connecting, TLS and logging in together take at most ``timeout``, and so does each command until
its whole reply is in (deadlines, not limits per read: a server trickling a byte a second gets
nowhere); a reply line may hold 8 KiB, a multi-line reply MAX_REPLY (64 KiB), or the reply is a
ProtocolError.

Closing a session sends ``QUIT`` (over TLS, then a close_notify) unless the server has closed
it already.  Errors at this level are ftplib's and the socket's; :func:`run`, which every
operation of the transport goes through, maps them at the boundary
(:mod:`ftpbc.transport.errormap`) and retries what may be retried.
"""

from __future__ import annotations

import ftplib
import logging
import select
import socket
import ssl
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TypeVar

from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConnectionLost, OutcomeUnknown
from ftpbc.transport.errormap import (
    BadReply,
    DeadlineExceeded,
    Progress,
    ReplyTooLong,
    map_ftp_errors,
    translated,
)
from ftpbc.transport.pool import Pool, breaks_session

log = logging.getLogger("ftpbc.ftp")

#: an idle session older than this is probed with NOOP before reuse (cheaper checks always run)
NOOP_AFTER_IDLE = 10.0
#: bytes one control reply may take, all its lines together (FEAT and MLST replies are well under
#: 4 KiB); one line is limited to ftplib's MAXLINE (8 KiB)
MAX_REPLY = 64 * 1024
#: bytes asked for per read of the control connection
_RECV = 8192
#: how long closing a session waits for the reply to QUIT, and for the server's close_notify
QUIT_TIMEOUT = 0.5
#: pauses before retrying an operation that provably did nothing (dropped session, 421/425/450)
TRANSIENT_BACKOFF = (0.0, 0.05, 0.2, 0.5)

T = TypeVar("T")


@dataclass
class Session:
    """One logged-in control connection and what its server supports."""

    ftp: ftplib.FTP
    peer_host: str
    #: the control connection's address family, which a data connection shares
    family: int = socket.AF_INET
    features: set[str] = field(default_factory=set)

    @property
    def sock(self) -> socket.socket:
        assert self.ftp.sock is not None
        return self.ftp.sock

    def has(self, feature: str) -> bool:
        return feature in self.features


class BoundedFTP(ftplib.FTP):
    """ftplib.FTP whose control replies are bounded in time and in size.

    ftplib reads a reply line with ``file.readline``, so the socket timeout bounds each read
    only: a server sending one byte a second keeps a reply, and a login with it, going for ever,
    and a multi-line reply (FEAT) may grow without end.  Here the control socket is read directly:

    * a reply must be complete within the socket's timeout from when its reading began (a
      deadline, not a limit per read); while ``connect_deadline`` is set, also by that
      (connecting, TLS and logging in, all within ``timeout``);
    * a line may hold ``maxline`` bytes (ftplib's 8 KiB), a whole reply MAX_REPLY.
    """

    #: monotonic time by which connecting and logging in must be done (None once connected)
    connect_deadline: float | None = None
    _rbuf: bytearray
    _deadline: float | None = None
    #: the reply's time budget (seconds), or None when the connect deadline is the tighter bound
    _budget: float | None = None
    #: when a list, every line read is also appended to it, undecoded and with its CR (a
    #: listing by STAT)
    raw_lines: list[bytes] | None = None

    def connect(self, host: str = "", port: int = 0, timeout: float = -999,
                source_address: tuple[str, int] | None = None) -> str:
        self._rbuf = bytearray()
        return super().connect(host, port, timeout, source_address)

    def _left(self) -> float | None:
        """Seconds left before ``connect_deadline`` (None when not connecting)."""
        if self.connect_deadline is None:
            return None
        return max(self.connect_deadline - time.monotonic(), 0.001)

    def getmultiline(self) -> str:
        sock = self.sock
        assert sock is not None
        started = time.monotonic()
        if self.connect_deadline is not None or self.raw_lines is not None:
            return self._multiline(sock, started)
        # The usual reply: one line, whole in the buffer or in the first read.  That read is
        # bounded by the socket's timeout, which is the reply's whole budget, so the deadline
        # bookkeeping of _multiline is needed only for a reply that takes more reads.
        buf = self._rbuf
        if not buf:
            try:
                chunk = sock.recv(_RECV)
            except TimeoutError:
                self._budget = sock.gettimeout()
                raise self._late() from None
            if not chunk:
                raise EOFError
            buf += chunk
        end = buf.find(b"\n")
        if 0 <= end <= self.maxline and buf[3:4] != b"-":
            return self._take_line(end)
        return self._multiline(sock, started)

    def _multiline(self, sock: socket.socket, started: float) -> str:
        """A reply read line by line (see :meth:`getline`) within its deadline, which runs from
        ``started``."""
        base = sock.gettimeout()
        self._deadline = started + base if base is not None else None
        self._budget = base
        if self.connect_deadline is not None and (self._deadline is None
                                                  or self.connect_deadline < self._deadline):
            self._deadline = self.connect_deadline
            self._budget = None
        try:
            line = self.getline()
            if line[3:4] == "-":
                code = line[:3]
                lines = [line]
                size = len(line)
                while True:
                    nextline = self.getline()
                    size += len(nextline) + 1
                    if size > MAX_REPLY:
                        raise ReplyTooLong(f"multi-line reply longer than {MAX_REPLY} bytes")
                    lines.append(nextline)
                    if nextline[:3] == code and nextline[3:4] != "-":
                        break
                line = "\n".join(lines)
            return line
        finally:
            self._deadline = None
            if sock.gettimeout() != base:
                sock.settimeout(base)

    def _late(self) -> DeadlineExceeded:
        if self._budget is None:
            return DeadlineExceeded(f"connecting and logging in took more than {self.timeout:g} s")
        return DeadlineExceeded(f"no reply within {self._budget:g} s (or only part of one)")

    def getline(self) -> str:
        buf = self._rbuf
        end = buf.find(b"\n")
        while end < 0:
            if len(buf) > self.maxline:
                raise ReplyTooLong(f"reply line longer than {self.maxline} bytes")
            sock = self.sock
            assert sock is not None
            if self._deadline is not None:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise self._late()
                current = sock.gettimeout()
                # settimeout is a system call: skipped when it would shorten the wait by little
                if current is None or current - remaining > 0.05:
                    sock.settimeout(remaining)
            try:
                chunk = sock.recv(_RECV)
            except TimeoutError:
                if self._deadline is None:
                    raise
                raise self._late() from None  # the read waited up to the deadline
            if not chunk:
                raise EOFError
            start = len(buf)
            buf += chunk
            end = buf.find(b"\n", start)
        if end > self.maxline:
            raise ReplyTooLong(f"reply line longer than {self.maxline} bytes")
        if self.raw_lines is not None:
            self.raw_lines.append(bytes(buf[:end]))  # with its CR, if it had one
        return self._take_line(end)

    def raw_reply(self, command: str) -> tuple[str, list[bytes], bool]:
        """Send ``command`` and read its reply as :meth:`sendcmd` does, keeping every line as it
        came, undecoded, with its CR (a listing by ``STAT``): the reply, its raw lines, and
        whether it ended whole, each line with its CRLF and nothing after it (a line without
        its CR is part of a name holding a line break, which may have passed for the end)."""
        self.raw_lines = []
        try:
            reply = self.sendcmd(command)
        finally:
            lines, self.raw_lines = self.raw_lines, None
        return reply, lines, not self._rbuf and all(raw[-1:] == b"\r" for raw in lines)

    def _take_line(self, end: int) -> str:
        """The buffer's first line, whose newline is at ``end``: removed, without its CRLF."""
        buf = self._rbuf
        line = bytes(buf[:end - 1 if end and buf[end - 1] == 0x0D else end])
        del buf[:end + 1]
        return line.decode(self.encoding, "replace")


class BoundedFTPS(BoundedFTP, ftplib.FTP_TLS):
    """Explicit FTPS (``AUTH TLS``) with bounded replies."""

    def auth(self) -> str:
        if isinstance(self.sock, ssl.SSLSocket):
            raise ValueError("Already using TLS")
        resp = self.voidcmd("AUTH TLS")
        if self._rbuf:
            # Bytes that came in clear after the reply would be read later as if they had come
            # through TLS (a man in the middle's "230 logged in"): refuse the session instead.
            raise BadReply("the server sent more after its reply to AUTH TLS, before TLS began")
        assert self.sock is not None
        # The TLS handshake is bounded as a whole by the socket timeout (CPython's ssl module
        # uses it as a deadline): while connecting, by what is left of the connect deadline.
        left = self._left()
        if left is not None:
            self.sock.settimeout(left)
        self.sock = self.context.wrap_socket(self.sock, server_hostname=self.host)
        self.file = self.sock.makefile(mode="r", encoding=self.encoding)
        return resp


class ImplicitFTPS(BoundedFTPS):
    """FTP_TLS whose control connection is TLS from the first byte (port 990 style)."""

    def connect(self, host: str = "", port: int = 0, timeout: float = -999,
                source_address: tuple[str, int] | None = None) -> str:
        if host:
            self.host = host
        if port > 0:
            self.port = port
        if timeout != -999:
            self.timeout = timeout
        self._rbuf = bytearray()
        raw = socket.create_connection((self.host, self.port), self.timeout)
        nodelay(raw)
        left = self._left()
        if left is not None:
            raw.settimeout(left)
        self.sock = self.context.wrap_socket(raw, server_hostname=self.host)
        self.af = self.sock.family
        self.file = self.sock.makefile("r", encoding=self.encoding)
        self.welcome = self.getresp()
        return self.welcome


def nodelay(sock: socket.socket | None) -> None:
    # Nagle's algorithm delays the small command packets FTP is made of.
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_timeout(s: Session, timeout: float) -> None:
    # settimeout() is a system call (it switches the socket's blocking mode): skip it when the
    # session has that timeout already, the usual case.
    if s.ftp.timeout != timeout or s.sock.gettimeout() != timeout:
        s.ftp.timeout = timeout
        s.sock.settimeout(timeout)


def close_session(s: Session) -> None:
    """End the session with QUIT (over TLS, then a close_notify), and close its socket.

    The server then ends the session as a normal logout instead of an aborted connection (which
    ProFTPD and pure-ftpd log as errors).  Skipped when the server has closed the connection or
    sent something nobody read (the session is broken); each wait lasts QUIT_TIMEOUT at most.
    """
    sock = s.ftp.sock
    with suppress(Exception):
        if sock is not None and not has_unread(sock):
            sock.settimeout(min(s.ftp.timeout or QUIT_TIMEOUT, QUIT_TIMEOUT))
            s.ftp.putcmd("QUIT")
            s.ftp.getresp()
            if isinstance(sock, ssl.SSLSocket):
                sock.unwrap()
    with suppress(Exception):
        s.ftp.close()


def has_unread(sock: socket.socket) -> bool:
    """True if the server sent something (or closed) while nobody was waiting for a reply."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    if not isinstance(sock, ssl.SSLSocket):
        return True
    # A TLS record may be a session ticket, not application data: peek without blocking.
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1)
        return True  # data or end-of-file
    except ssl.SSLWantReadError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


def ask_features(ftp: ftplib.FTP) -> set[str]:
    """What ``FEAT`` says the server supports (upper-case words); none if it refuses FEAT."""
    try:
        resp = ftp.sendcmd("FEAT")
    except ftplib.error_perm:
        return set()
    feats = set()
    for line in resp.splitlines()[1:-1]:
        word = line.strip().split(" ")[0].upper()
        if word:
            feats.add(word)
    if "MLST" in feats:
        feats.add("MLSD")  # RFC 3659: MLST in FEAT means both MLST and MLSD
    return feats


def connect_session(cfg: ServerConfig, context: ssl.SSLContext | None, timeout: float) -> Session:
    """A logged-in session with ``cfg``'s server (FTPS when ``context`` is given), set up as
    the module docstring says, all within ``timeout``; ftpbc's errors (connecting)."""
    with map_ftp_errors(cfg.display, connecting=True):
        ftp: BoundedFTP
        if context is None:
            ftp = BoundedFTP(timeout=timeout)
        elif cfg.tls == "implicit":
            ftp = ImplicitFTPS(context=context, timeout=timeout)
        else:
            ftp = BoundedFTPS(context=context, timeout=timeout)
        # Connecting, TLS, login and the session's setup, all within ``timeout``.
        ftp.connect_deadline = time.monotonic() + timeout
        try:
            ftp.connect(cfg.host, cfg.port, timeout=timeout)
            nodelay(ftp.sock)
            if isinstance(ftp, ftplib.FTP_TLS) and not isinstance(ftp.sock, ssl.SSLSocket):
                ftp.auth()
            ftp.login(cfg.user, cfg.password_value())
            if isinstance(ftp, ftplib.FTP_TLS):
                ftp.prot_p()
            assert ftp.sock is not None
            session = Session(ftp, peer_host=ftp.sock.getpeername()[0], family=int(ftp.sock.family))
            session.features = ask_features(ftp)
            ftp.voidcmd("TYPE I")
            if session.has("UTF8"):
                with suppress(ftplib.error_perm):
                    ftp.sendcmd("OPTS UTF8 ON")
            ftp.connect_deadline = None
            return session
        except BaseException:
            ftp.close()
            raise


def healthy(s: Session, idle_for: float, timeout: float) -> bool:
    """Whether a pooled session may be used again: False if the server closed it or sent
    something unasked ("421 Timeout"); one idle for over NOOP_AFTER_IDLE is asked a NOOP
    (within ``timeout``, 5 s at most) first."""
    sock = s.ftp.sock
    if sock is None or getattr(s.ftp, "_rbuf", None) or has_unread(sock):
        return False  # closed by the server, or an unsolicited reply ("421 Timeout")
    if idle_for > NOOP_AFTER_IDLE:
        set_timeout(s, min(timeout, 5.0))
        s.ftp.voidcmd("NOOP")
    return True


def tls_context(cfg: ServerConfig) -> ssl.SSLContext:
    """The TLS context of ``cfg``'s sessions: certificates verified (against ``ca_file`` when
    set) unless ``verify_tls`` is false, which is logged at WARNING."""
    if not cfg.verify_tls:
        # Built once per transport, i.e. once per server in a node: loud, not repeated per
        # connection.  Whoever can get between the node and the server can read the password.
        log.warning("%s: verify_tls is false: the server's certificate is not verified, so anyone "
                    "in between can pose as the server and read the password and the messages", cfg)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)


def run(pool: Pool[Session], server: str, path: str, op: Callable[[Session, Progress], T], *,
        timeout: float, repeatable: bool | Callable[[], bool]) -> T:
    """``op`` on a pooled session, its failures mapped to ftpbc's errors (naming ``server`` and
    ``path``) and retried as the transport promises: after ConnectionLost (the command did not
    take effect) up to len(TRANSIENT_BACKOFF) times, after OutcomeUnknown once, and only if
    ``repeatable`` (a flag, or asked at the time)."""
    for attempt in range(1, len(TRANSIENT_BACKOFF) + 2):
        progress = Progress()
        try:
            # Pool.session and map_ftp_errors written out: this wraps every remote command,
            # and the two context managers cost more than the code they run.
            s = pool.acquire(timeout)
            try:
                set_timeout(s, timeout)
                result = op(s, progress)
            except BaseException as exc:
                mapped = translated(exc, server, path, progress)
                failure = exc if mapped is None else mapped
                pool.release(s, broken=breaks_session(failure))
                if mapped is None:
                    raise
                raise mapped from exc
            pool.release(s)
            return result
        except ConnectionLost:
            # The command did not take effect (a dropped session, 421, 425, 450): any
            # operation may go again, after a growing pause for the busy cases.
            if attempt > len(TRANSIENT_BACKOFF):
                raise
            time.sleep(TRANSIENT_BACKOFF[attempt - 1])
        except OutcomeUnknown:
            again = repeatable() if callable(repeatable) else repeatable
            if attempt >= 2 or not again:
                raise
    raise AssertionError("unreachable")
