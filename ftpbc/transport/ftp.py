"""FTP and FTPS (explicit ``AUTH TLS`` + ``PROT P``, or implicit TLS) as a :class:`Transport`.

One :class:`FTPTransport` per server; it keeps up to ``cfg.pool_size`` logged-in control
connections in a :class:`~ftpbc.transport.pool.Pool` shared by all threads.

What each session does once, at login: ``TCP_NODELAY`` on the control socket (and on every data
socket), ``FEAT`` to learn MLSD/MLST/EPSV/MDTM/SIZE, ``TYPE I``.  ftplib's ``storbinary``/
``retrbinary`` re-send ``TYPE`` on every call; this module opens data connections itself
(EPSV when advertised, else PASV; active mode is not implemented, and ``passive: false`` is
refused), which is what makes one STOR cost one data connection and nothing more.  A PASV
reply naming another address than the control connection's peer (a server behind NAT
announcing its private address) is ignored in favour of the control host.

Listings use ``MLSD`` when the server advertises it (exact sizes, mtimes to the second) and
``LIST -a`` otherwise (vsftpd): unix-style lines are parsed for size, type and an mtime to the
minute (to the day for entries older than six months, as ``ls`` prints them).  A streamed
listing (``scan``) names a plain path in the command, one round trip instead of two; its ``.``
line is what proves the directory exists (vsftpd lists a missing one as empty, with ``226``),
and without one a ``CWD`` decides.  Other listings go from the directory as working directory.
``stat`` uses ``MLST`` where available, else ``SIZE`` + ``MDTM`` (and ``CWD`` for directories).
A listed name is taken whole or not at all (:mod:`ftpbc.transport.names`): an MLSD or LIST
entry named ``sub/req.X`` (or holding ``\\``, NUL, a line break, or a file called ``..``) is
skipped and logged once, never cut to ``req.X``; the rest of the listing is served.

Closing a session sends ``QUIT`` (over TLS, then a close_notify) unless the server has closed
it already.  TLS data connections set ``TCP_QUICKACK`` (Linux) after every read: a server that
sends its close_notify with Nagle on (pure-ftpd) would otherwise hold it until the client's
delayed ACK fires, a pause on every listing.  A ``425`` to EPSV/PASV (ProFTPD failing to bind the passive port
it picked) is asked again up to PASSIVE_RETRIES times: no transfer command was sent yet.

Bounds on the server (a hostile or broken one must not hang a node nor fill its memory):
connecting, TLS and logging in together take at most ``timeout``, and so does each command until
its whole reply is in (deadlines, not limits per read: a server trickling a byte a second gets
nowhere); a reply line may hold 8 KiB, a multi-line reply MAX_REPLY (64 KiB), or the reply is a
ProtocolError.  A transfer (get, put, listing) must move ``min_transfer_rate`` bytes/s over every
``min_rate_window`` seconds, or it fails as a timeout (TransportTimeout for a read, OutcomeUnknown
for a STOR, whose command went out).

Retries (at most one, on a fresh connection):

* any operation whose command provably did not reach the server (ConnectionLost);
* after a lost reply (OutcomeUnknown) only operations that are safe to repeat: list, stat, get
  (into a seekable stream, or before any byte was written), mkdir, and put from a seekable
  stream (the same bytes to the same path).  rename and delete are never repeated blindly.

Errors name ``cfg.display`` (``ftp://user@host:port``) and the path; the password is only ever
handed to ``PASS``.
"""

from __future__ import annotations

import builtins
import ftplib
import io
import logging
import posixpath
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import BinaryIO, TypeVar

from ftpbc import schemes
from ftpbc.config.servers import ACTIVE_MODE_REFUSAL, ServerConfig, tls_refusal
from ftpbc.errors import (
    AlreadyExists,
    ConfigError,
    ConnectionLost,
    NotFound,
    OutcomeUnknown,
    ProtocolError,
    SourceGone,
    TransportError,
)
from ftpbc.transport.base import Entry, GlobRefused, Refused, Transport, Visit, normalize, stream_position
from ftpbc.transport.errormap import (
    BadReply,
    DeadlineExceeded,
    Progress,
    RateGuard,
    ReplyTooLong,
    map_ftp_errors,
    translate_ftp_reply,
    translated,
)
from ftpbc.transport.names import LoggedOnce, OddName, listed_name
from ftpbc.transport.pool import Pool, breaks_session

T = TypeVar("T")

CHUNK = 256 * 1024
#: the closing reply of a glob listing the server could not make, though its code says success
#: (pure-ftpd past its listing cap: "226-Out of memory during globbing of *.0*")
_GLOB_FAILED = "during globbing"
#: an idle session older than this is probed with NOOP before reuse (cheaper checks always run)
NOOP_AFTER_IDLE = 10.0
#: bytes one control reply may take, all its lines together (FEAT and MLST replies are well under
#: 4 KiB); one line is limited to ftplib's MAXLINE (8 KiB)
MAX_REPLY = 64 * 1024
#: bytes asked for per read of the control connection
_RECV = 8192
#: bytes handed to a TLS data socket per write while its rate is watched (one TLS record)
_TLS_PIECE = 16 * 1024
#: bytes one listing line may take (a name is at most MAX_NAME characters, see names.py)
MAX_LISTING_LINE = 64 * 1024
#: a transient 425 to EPSV/PASV is asked again this many times, after 10, 20, 40 ms
PASSIVE_RETRIES = 3
#: a body of up to this many bytes, in memory, is written to a plain data connection right after
#: STOR, without waiting for the server's 150 first: one round trip less for every message
#: staged.  It fits in the socket buffers of a connection the server has not accepted yet, so
#: the write never waits on the server; a server refusing the STOR (550, 553, 452) never reads
#: it, and its refusal comes on the control connection as it would have.  Not over TLS, whose
#: handshake needs the server to accept first.
EARLY_STOR_MAX = 32 * 1024
#: rename pairs sent in one write by rename_each: their replies (two short lines each) stay
#: far below any socket buffer, so the server never blocks writing them while we write
RENAME_BATCH = 32
#: how long closing a session waits for the reply to QUIT, and for the server's close_notify
QUIT_TIMEOUT = 0.5
#: a directory whose listing had more lines than this is listed by LIST, not STAT: a STAT reply
#: must fit in MAX_REPLY (lines of 60-300 bytes)
STAT_MAX_ENTRIES = 200
#: large directories remembered per transport at most (forgetting one costs one oversized STAT)
LARGE_DIRS_REMEMBERED = 10_000
#: remote directories listed by ``LIST -a <path>`` rather than ``CWD`` + ``LIST -a``: those no
#: server would glob or split at a space (other paths are listed from their working directory)
_LISTABLE_BY_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


log = logging.getLogger("ftpbc.ftp")

#: pauses before retrying an operation that provably did nothing (dropped session, 421/425/450)
TRANSIENT_BACKOFF = (0.0, 0.05, 0.2, 0.5)


@dataclass
class _Session:
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


class _BoundedFTP(ftplib.FTP):
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

    def _take_line(self, end: int) -> str:
        """The buffer's first line, whose newline is at ``end``: removed, without its CRLF."""
        buf = self._rbuf
        line = bytes(buf[:end - 1 if end and buf[end - 1] == 0x0D else end])
        del buf[:end + 1]
        return line.decode(self.encoding, "replace")


class _BoundedFTPS(_BoundedFTP, ftplib.FTP_TLS):
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


class _ImplicitFTPS(_BoundedFTPS):
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
        _nodelay(raw)
        left = self._left()
        if left is not None:
            raw.settimeout(left)
        self.sock = self.context.wrap_socket(raw, server_hostname=self.host)
        self.af = self.sock.family
        self.file = self.sock.makefile("r", encoding=self.encoding)
        self.welcome = self.getresp()
        return self.welcome


class FTPTransport(Transport):
    """ftp:// and ftps:// servers.  Thread-safe; connections are opened on first use."""

    def __init__(self, cfg: ServerConfig) -> None:
        spec = schemes.lookup(cfg.scheme)
        if spec is None or spec.transport != "ftp":
            raise ValueError(f"FTPTransport cannot serve {cfg.display}")
        misplaced = cfg.misplaced_tls_keys()
        if misplaced:
            # Never a clear-text login when TLS was asked for (the loader refuses this already;
            # a config changed in code past validation gets here).
            raise ConfigError(tls_refusal(cfg.scheme), key=f"servers.{cfg.name}.{misplaced[0]}")
        if not cfg.passive:
            # Refused at load too; a config changed in code past validation gets here.  Sending
            # PASV anyway would silently ignore the setting.
            raise ConfigError(ACTIVE_MODE_REFUSAL, key=f"servers.{cfg.name}.passive")
        self.cfg = cfg
        self.server = cfg.display
        self._base = normalize(cfg.base)
        self._tls = spec.tls
        self._context = self._tls_context() if self._tls else None
        self._parsed = _ParsedLines()
        #: bad listing lines and refused names already logged (each once, not once per poll)
        self._bad_lines = LoggedOnce(PARSED_LINES)
        #: whether the server lists by glob (see scan): not known until it is asked
        self.globs: bool | None = None
        #: whether ``STAT -a <dir>`` lists a directory as LIST does (see _stat_scan): not known
        #: until it is asked
        self.stat_lists: bool | None = None
        #: directories whose last listing had more than STAT_MAX_ENTRIES lines: listed by LIST
        self._large_dirs: set[str] = set()
        self._pool: Pool[_Session] = Pool(connect=self._connect, check=self._healthy, close=_close,
                                          size=cfg.pool_size, server=self.server,
                                          default_timeout=cfg.timeout)

    # ------------------------------------------------------------------ Transport API

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        remote = self._remote(path)

        def op(s: _Session, progress: Progress) -> list[Entry]:
            if s.has("MLSD"):
                try:
                    lines = self._read_lines(s, f"MLSD {remote}", path)
                except ftplib.error_perm as exc:
                    if str(exc)[:3] in ("501", "550", "450"):  # pyftpdlib: "501 No such directory."
                        raise NotFound(f"no such directory: {exc}", server=self.server, path=path) from None
                    raise
                return _parse_listing(lines, self._parsed.mlsx, server=self.server, path=path,
                                      command="MLSD", reported=self._bad_lines)
            self._cwd(s, remote)
            now = datetime.now(UTC)
            return _parse_listing(self._read_lines(s, "LIST -a", path),
                                  lambda line: self._parsed.list_line(line, now), server=self.server,
                                  path=path, command="LIST", reported=self._bad_lines)

        return self._run(path, op, timeout=timeout, repeatable=True)

    def scan(self, path: str, visit: Visit, *, glob: str | None = None, refuse_dirs: bool = False,
             refused: builtins.list[Refused] | None = None, timeout: float | None = None) -> bool:
        """Streamed: lines are parsed and visited as they arrive, and a ``visit`` that stops the
        listing closes its data connection (the server reads no further, and nothing more is
        held here).  With ``glob`` the server is asked for ``LIST -a <glob>`` (vsftpd, ProFTPD
        and pure-ftpd select names so; MLSD takes no glob); one that refuses it (pyftpdlib:
        ``550``) raises GlobRefused once and is never asked again.  Names are matched here
        too, so a server that ignores the glob costs time, never correctness."""
        remote = self._remote(path)
        visited = [0]

        def counted(e: Entry) -> bool:
            if glob is not None and not fnmatchcase(e.name, glob):
                return True
            visited[0] += 1
            return visit(e)

        def op(s: _Session, progress: Progress) -> bool:
            if glob is not None and self.globs is not False:
                self._cwd(s, remote)
                now = datetime.now(UTC)
                closing: builtins.list[str] = []
                try:
                    done = self._stream(s, f"LIST -a {glob}", path,
                                        lambda ln: self._parsed.list_line(ln, now), counted, label="LIST",
                                        reply=closing)
                except ftplib.error_perm as exc:
                    if str(exc)[:3] not in ("501", "550", "450"):
                        raise
                    self.globs = False
                    raise GlobRefused(f"the server does not list by glob ({glob!r}): {exc}",
                                      server=self.server, path=path) from None
                if closing and _GLOB_FAILED in closing[0].lower():
                    # pure-ftpd past its listing cap (-L, 10,000 by default) answers a glob with
                    # no names and "226-Out of memory during globbing of ...": a success code
                    # on an empty listing, which would pass for an empty slice.
                    self.globs = False
                    first = closing[0].splitlines()[0]
                    raise GlobRefused(f"the server failed to list by glob ({glob!r}): {first}",
                                      server=self.server, path=path)
                self.globs = True
                return done
            if s.has("MLSD"):
                try:
                    return self._stream(s, f"MLSD {remote}", path, self._parsed.mlsx, counted, label="MLSD")
                except ftplib.error_perm as exc:
                    if str(exc)[:3] in ("501", "550", "450"):
                        raise NotFound(f"no such directory: {exc}", server=self.server, path=path) from None
                    raise
            if not _LISTABLE_BY_PATH.fullmatch(remote):
                self._cwd(s, remote)
                now = datetime.now(UTC)
                return self._stream(s, "LIST -a", path, lambda ln: self._parsed.list_line(ln, now), counted,
                                    label="LIST")
            now = datetime.now(UTC)
            stat_tried = self.stat_lists is not False and remote not in self._large_dirs
            if stat_tried:
                found = self._stat_scan(s, remote, path, now, counted)
                if found is not None:
                    return found
            dot = [False]
            lines = [0]

            def parse(line: str) -> Entry | None:
                lines[0] += 1
                dot[0] = dot[0] or _is_dot_line(line)
                return self._parsed.list_line(line, now)

            done = self._stream(s, f"LIST -a {remote}", path, parse, counted, label="LIST")
            if done:
                self._note_size(remote, lines[0])
            if done and dot[0] and stat_tried and self.stat_lists is None:
                self.stat_lists = False  # STAT said nothing of a directory LIST shows
            if done and not dot[0]:
                # No "." line: a missing directory (vsftpd lists it as empty), a file, or a
                # server that does not show dot entries; CWD tells them apart.
                self._cwd(s, remote)
            return done

        # Repeated after a lost connection only while nothing was visited (no duplicates then).
        return self._run(path, op, timeout=timeout, repeatable=lambda: visited[0] == 0)

    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        remote = self._remote(path)
        start = stream_position(stream)
        # A small body in memory goes out without waiting for the server's 150 (see EARLY_STOR_MAX).
        early = self._context is None and _small_in_memory(stream, start)

        def op(s: _Session, progress: Progress) -> int:
            if start is not None:
                stream.seek(start)
            total = 0
            try:
                with self._data(s, f"STOR {remote}", path, progress, early=early) as conn:
                    guard = self._guard(conn)
                    for chunk in _chunks(stream):
                        _send_all(conn, chunk, guard)
                        total += len(chunk)
                    _unwrap(conn)
            except OSError:
                if early and progress.sent:
                    # A server that refused the STOR may have reset the connection the body went
                    # into: its reply says why (and is raised as such), and keeps the session in
                    # step.  (Not when the data connection failed before STOR went out: no reply
                    # is coming then.)
                    _transfer_opened(s.ftp)
                raise
            if early:
                _transfer_opened(s.ftp)
            s.ftp.voidresp()
            return total

        return self._run(path, op, timeout=timeout, repeatable=start is not None)

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        remote = self._remote(path)
        start = stream_position(stream)
        written = [0]

        def op(s: _Session, progress: Progress) -> int:
            if start is not None:
                stream.seek(start)
                stream.truncate()
            total = 0
            buf, view = _buffer()
            with self._data(s, f"RETR {remote}", path, None) as conn:
                guard = self._guard(conn)
                while n := conn.recv_into(buf):
                    _quickack(conn)
                    stream.write(view[:n])
                    total += n
                    written[0] += n
                    if guard is not None:
                        guard.add(n)
                _unwrap(conn)
            s.ftp.voidresp()
            return total

        # Repeating a read is harmless, unless bytes already went into a stream we cannot rewind.
        return self._run(path, op, timeout=timeout,
                         repeatable=lambda: start is not None or written[0] == 0)

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        rsrc, rdst = self._remote(src), self._remote(dst)

        def op(s: _Session, progress: Progress) -> None:
            refused = self._rename_once(s, rsrc, rdst, src, progress)
            if refused is not None:
                self._settle_refusal(s, rsrc, rdst, src, dst, refused, progress)

        self._run(src, op, timeout=timeout, repeatable=False)

    def rename_each(self, pairs: Sequence[tuple[str, str]], *,
                    timeout: float | None = None) -> builtins.list[TransportError | None]:
        """The RNFR and RNTO of every pair in one write (up to RENAME_BATCH pairs), the replies
        read after, in order: one round trip for a poll's claims where :meth:`rename` takes one
        per pair.  See :meth:`Transport.rename_each` for what is returned.

        A server answers the commands of a session one after the other, in the order sent, so
        each two replies belong to one pair: a refused RNFR (the source is gone) makes its RNTO
        answer 503 and rename nothing, and the next pair goes on as usual (the conformance
        suite checks this on every server).  A refused RNTO is settled afterwards on the same
        session as :meth:`rename` settles it.  A session that fails before every reply is read
        leaves the pairs not answered yet with OutcomeUnknown: their commands went out.
        """
        if len(pairs) <= 1:
            return super().rename_each(pairs, timeout=timeout)
        remote = [(self._remote(src), self._remote(dst)) for src, dst in pairs]
        outcomes: builtins.list[TransportError | None] = [None] * len(pairs)
        unsettled = set(range(len(pairs)))  # pairs whose outcome is not known yet
        sent = [False]

        def op(s: _Session, progress: Progress) -> None:
            refusals: builtins.list[tuple[int, ftplib.Error]] = []
            for start in range(0, len(pairs), RENAME_BATCH):
                batch = range(start, min(start + RENAME_BATCH, len(pairs)))
                s.sock.sendall("".join(f"RNFR {remote[i][0]}\r\nRNTO {remote[i][1]}\r\n"
                                       for i in batch).encode(s.ftp.encoding))
                progress.sent = sent[0] = True
                for i in batch:
                    # Refusals of this pair only, both replies read (the session is in step);
                    # anything else fails the whole session (the rest: OutcomeUnknown below).
                    try:
                        refused = self._rename_replies(s, pairs[i][0])
                    except SourceGone as exc:
                        outcomes[i] = exc
                    except (ftplib.error_perm, ftplib.error_temp) as exc:
                        outcomes[i] = translate_ftp_reply(exc, server=self.server, path=pairs[i][0])
                    else:
                        if refused is not None:
                            refusals.append((i, refused))
                            continue
                    unsettled.discard(i)
            # Every reply read; the refused RNTOs (rare) are settled one by one.
            for i, refused in refusals:
                (src, dst), (rsrc, rdst) = pairs[i], remote[i]
                try:
                    self._settle_refusal(s, rsrc, rdst, src, dst, refused, progress)
                except TransportError as exc:
                    outcomes[i] = exc
                except (ftplib.error_perm, ftplib.error_temp) as exc:
                    outcomes[i] = translate_ftp_reply(exc, server=self.server, path=dst)
                unsettled.discard(i)

        try:
            self._run(pairs[0][0], op, timeout=timeout, repeatable=False)
        except TransportError as exc:
            # Nothing sent: nothing renamed (exc says why).  Else what was not settled when the
            # session failed may or may not have happened.
            for i in unsettled:
                outcomes[i] = exc if not sent[0] or isinstance(exc, OutcomeUnknown) else OutcomeUnknown(
                    f"the session failed after the rename was sent ({exc})", server=self.server,
                    path=pairs[i][0])
        return outcomes

    def delete(self, path: str, *, timeout: float | None = None) -> None:
        remote = self._remote(path)
        self._run(path, lambda s, p: self._command(s, f"DELE {remote}", path, p),
                  timeout=timeout, repeatable=False)

    def mkdir(self, path: str, *, timeout: float | None = None) -> None:
        remote = self._remote(path)
        self._run(path, lambda s, p: self._mkdirs(s, remote, path, p), timeout=timeout, repeatable=True)

    def stat(self, path: str, *, timeout: float | None = None) -> Entry:
        remote = self._remote(path)
        return self._run(path, lambda s, p: self._stat(s, remote, path), timeout=timeout, repeatable=True)

    def close(self) -> None:
        self._pool.close()

    @property
    def pool(self) -> Pool[_Session]:
        """The connection pool (for tests and metrics)."""
        return self._pool

    def rename_replaces(self, src: str, dst: str, *, timeout: float | None = None) -> bool:
        """Does this server rename onto an existing file?  A probe, for ``ftpbc check``.

        One RNFR + RNTO of ``src`` onto the existing ``dst``, without :meth:`rename`'s fallback:
        True if the server replaced ``dst`` (atomically); False if it refused with a 5xx
        (ProFTPD's default ``AllowOverwrite off``) and left both, where :meth:`rename` deletes
        ``dst`` first, so a crash in between loses the old ``dst``.
        """
        rsrc, rdst = self._remote(src), self._remote(dst)

        def op(s: _Session, progress: Progress) -> bool:
            refused = self._rename_once(s, rsrc, rdst, src, progress)
            if refused is not None and not isinstance(refused, ftplib.error_perm):
                raise translate_ftp_reply(refused, server=self.server, path=dst)
            return refused is None

        return self._run(src, op, timeout=timeout, repeatable=False)

    # ------------------------------------------------------------------ operations

    def _run(self, path: str, op: Callable[[_Session, Progress], T], *, timeout: float | None,
             repeatable: bool | Callable[[], bool]) -> T:
        timeout = self.cfg.timeout if timeout is None else timeout
        pool = self._pool
        for attempt in range(1, len(TRANSIENT_BACKOFF) + 2):
            progress = Progress()
            try:
                # Pool.session and map_ftp_errors written out: this wraps every remote command,
                # and the two context managers cost more than the code they run.
                s = pool.acquire(timeout)
                try:
                    _set_timeout(s, timeout)
                    result = op(s, progress)
                except BaseException as exc:
                    mapped = translated(exc, self.server, path, progress)
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

    def _command(self, s: _Session, line: str, path: str, progress: Progress | None) -> str:
        """Send one command and read its reply; ``progress`` marks it as state-changing."""
        s.ftp.putcmd(line)
        if progress is not None:
            progress.sent = True
        return s.ftp.voidresp()

    def _rename_once(self, s: _Session, rsrc: str, rdst: str, src: str,
                     progress: Progress) -> ftplib.Error | None:
        """RNFR + RNTO.  SourceGone if RNFR finds no source; RNTO's refusal is returned.

        Both commands go out in one write and their replies are read after: one round trip
        instead of two, for the step every message takes four to six times (stage, claim,
        commit, expose, collect, archive).  A server that refused RNFR answers the RNTO with 503
        (no rename pending) and renames nothing.  Both replies are always read, so the session
        stays in step whatever happened.
        """
        s.sock.sendall(f"RNFR {rsrc}\r\nRNTO {rdst}\r\n".encode(s.ftp.encoding))
        progress.sent = True
        return self._rename_replies(s, src)

    def _rename_replies(self, s: _Session, src: str) -> ftplib.Error | None:
        """Read the replies to one RNFR + RNTO sent (see :meth:`_rename_once`)."""
        ftp = s.ftp
        first: str | ftplib.Error
        try:
            first = ftp.getresp()
        except ftplib.Error as exc:
            first = exc
        try:
            ftp.voidresp()
            second: ftplib.Error | None = None
        except ftplib.Error as exc:
            second = exc
        if isinstance(first, ftplib.Error):
            if isinstance(first, ftplib.error_perm) and str(first)[:3] in ("550", "450"):
                raise SourceGone(f"rename source is gone: {first}", server=self.server, path=src) from None
            raise first
        if not first.startswith("3"):
            raise ProtocolError(f"unexpected reply to RNFR: {first!r}", server=self.server, path=src)
        if isinstance(second, ftplib.error_perm | ftplib.error_temp):
            # Refused (550), or failed because the source went between RNFR and RNTO: pure-ftpd
            # checks the source at RNFR only and answers "451 Rename/move failure" when a racing
            # client renamed it meanwhile.  The caller tells the cases apart.
            return second
        if second is not None:
            raise second
        return None

    def _settle_refusal(self, s: _Session, rsrc: str, rdst: str, src: str, dst: str, refused: ftplib.Error,
                        progress: Progress) -> None:
        """After a refused RNTO: SourceGone if the source went meanwhile (claimed by someone
        else), the rename done after deleting a target the server would not replace, or the
        refusal raised."""
        if not self._exists(s, rsrc, src):
            raise SourceGone("rename source is gone", server=self.server, path=src)
        if self._exists(s, rdst, dst):
            # A server that refuses to replace: the contract says replace, so delete first.
            self._command(s, f"DELE {rdst}", dst, progress)
            again = self._rename_once(s, rsrc, rdst, src, progress)
            if again is None:
                return
            refused = again
        raise translate_ftp_reply(refused, server=self.server, path=dst)

    def _exists(self, s: _Session, remote: str, path: str) -> bool:
        try:
            self._stat(s, remote, path)
        except NotFound:
            return False
        return True

    def _mkdirs(self, s: _Session, remote: str, path: str, progress: Progress) -> None:
        if remote == "/":
            return
        try:
            self._command(s, f"MKD {remote}", path, progress)
            return
        except ftplib.error_perm as exc:
            refused = exc
        # Either it exists already (fine if a directory), or a parent is missing.
        try:
            entry = self._stat(s, remote, path)
        except NotFound:
            parent = posixpath.dirname(remote)
            if parent == remote:
                raise translate_ftp_reply(refused, server=self.server, path=path) from None
            # The parent may exist now only because a racing client (another node preparing the
            # same exchange area) created it after our MKD failed: so try again either way.
            if not self._exists(s, parent, path):
                self._mkdirs(s, parent, path, progress)
            try:
                self._command(s, f"MKD {remote}", path, progress)
            except ftplib.error_perm as again:
                try:
                    made = self._stat(s, remote, path).is_dir  # by a racing client: fine
                except NotFound:
                    made = False
                if not made:
                    raise translate_ftp_reply(again, server=self.server, path=path) from None
            return
        if not entry.is_dir:
            raise AlreadyExists("exists and is not a directory", server=self.server, path=path)

    def _stat(self, s: _Session, remote: str, path: str) -> Entry:
        name = posixpath.basename(remote) or "/"
        try:
            if s.has("MLST"):
                resp = s.ftp.sendcmd(f"MLST {remote}")
                facts = [ln for ln in resp.splitlines()[1:-1] if ln.strip()]
                try:
                    entry = _parse_mlst(facts[0].lstrip(), name) if facts else None
                except ValueError as exc:  # a fact that does not parse, no type
                    raise ProtocolError(f"unexpected MLST reply {resp[:500]!r}: {exc}", server=self.server,
                                        path=path) from None
                if entry is None:
                    raise ProtocolError(f"unexpected MLST reply {resp!r}", server=self.server, path=path)
                return entry
            try:
                size = int(s.ftp.sendcmd(f"SIZE {remote}").split()[1])
            except ftplib.error_perm:
                self._cwd(s, remote)  # not a file: a directory, or NotFound
                return Entry(name, 0, None, True)
            mtime = None
            if s.has("MDTM"):
                with suppress(ftplib.error_perm, ValueError, IndexError):
                    mtime = _parse_time(s.ftp.sendcmd(f"MDTM {remote}").split()[1])
            return Entry(name, size, mtime, False)
        except ftplib.error_perm as exc:
            if str(exc)[:3] in ("550", "450", "501"):
                raise NotFound(f"no such file or directory: {exc}", server=self.server, path=path) from None
            raise

    def _stat_scan(self, s: _Session, remote: str, path: str, now: datetime, visit: Visit) -> bool | None:
        """List directory ``remote`` by ``STAT -a <dir>``: its lines come on the control connection,
        where LIST costs a data connection (a TCP handshake and close on both sides, per poll).

        None when this answer cannot be taken for the directory's listing: no ``.`` line (a
        missing directory: vsftpd answers it with an empty status; or a server whose STAT does
        not list), a refusal, or a reply other than 213; the caller lists by LIST then.  Nothing
        is visited before the whole reply is in and checked.  A reply over MAX_REPLY (a
        directory that grew past STAT_MAX_ENTRIES since its last listing) leaves the session
        out of step: it is dropped and the operation repeated (ConnectionLost), by LIST.
        """
        ftp = s.ftp
        assert isinstance(ftp, _BoundedFTP)
        ftp.raw_lines = []
        try:
            reply = ftp.sendcmd(f"STAT -a {remote}")
        except ReplyTooLong:
            self._note_size(remote, STAT_MAX_ENTRIES + 1)
            raise ConnectionLost("a listing by STAT longer than a reply may be; listed again by LIST",
                                 server=self.server, path=path) from None
        except (ftplib.error_perm, ftplib.error_temp) as exc:
            if str(exc)[:3] in ("500", "501", "502", "504"):
                self.stat_lists = False  # not understood: never asked again
            return None
        finally:
            lines, ftp.raw_lines = ftp.raw_lines, None
        if reply[:3] != "213" or len(lines) < 2:
            return None
        if ftp._rbuf or not all(raw[-1:] == b"\r" for raw in lines):
            # A line that ends without its CR is part of a name holding a line break, and one of
            # them may have looked like the end of the status (then more came after it).  The
            # session may be out of step: dropped, and the listing repeated at once by LIST;
            # this server is never asked to list by STAT again.
            self.stat_lists = False
            log.warning("%s%s: a STAT listing ended early (a name with a line break?); listing by LIST "
                        "from now on", self.server, path)
            raise ConnectionLost("a STAT listing ended before its end; listed again by LIST",
                                 server=self.server, path=path)
        body = [raw[:-1] for raw in lines[1:-1]]
        if not any(_is_dot_line(raw) for raw in body):
            return None
        self.stat_lists = True
        self._note_size(remote, len(body))
        limit = self.cfg.max_listing_entries + 1  # as LIST's, which may have a "total" line
        if len(body) > limit:
            del body[limit:]
            log.warning("%s %s: listing stopped at %d entries (max_listing_entries)", self.server, path,
                        self.cfg.max_listing_entries)
        parser = _LineParser(lambda ln: self._parsed.list_line(ln, now), server=self.server, path=path,
                             command="STAT", reported=self._bad_lines)
        entries = [e for raw in body if (e := parser.feed(raw)) is not None]
        parser.finish()
        return all(visit(e) for e in entries)

    def _note_size(self, remote: str, lines: int) -> None:
        """Remember whether directory ``remote`` is too large to be listed by STAT."""
        if lines > STAT_MAX_ENTRIES:
            if len(self._large_dirs) >= LARGE_DIRS_REMEMBERED:
                self._large_dirs.clear()
            self._large_dirs.add(remote)
        else:
            self._large_dirs.discard(remote)

    def _cwd(self, s: _Session, remote: str) -> None:
        # Never cached: a directory removed and re-created under the same name would otherwise
        # be listed through the stale working directory of the server process (empty).
        s.ftp.sendcmd(f"CWD {remote}")

    def _read_lines(self, s: _Session, command: str, path: str) -> builtins.list[str]:
        """The lines of a listing; no more than ``max_listing_entries`` (+1, for LIST's "total")."""
        limit = self.cfg.max_listing_entries + 1
        count = 0
        with self._data(s, command, path, None) as conn:
            guard = self._guard(conn)
            raw = bytearray()
            buf, view = _buffer()
            while n := conn.recv_into(buf):
                _quickack(conn)
                raw += view[:n]
                count += raw.count(b"\n", len(raw) - n)
                if guard is not None:
                    guard.add(n)
                if count > limit:
                    break
            else:
                _unwrap(conn)
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

    def _stream(self, s: _Session, command: str, path: str, parse: Callable[[str], Entry | None],
                visit: Visit, *, label: str, reply: builtins.list[str] | None = None) -> bool:
        """Parse a listing's lines as they arrive and hand each entry to ``visit``; True if read
        to its end, False if ``visit`` stopped it.  The bounds of :meth:`_read_lines` hold
        (``max_listing_entries``), a line may be MAX_LISTING_LINE bytes, and a line that does
        not parse is skipped as :func:`_parse_listing` does.  ``reply`` (a list) gets the
        server's closing reply of a listing read to its end."""
        limit = self.cfg.max_listing_entries + 1  # + LIST's "total" line
        lines = _LineParser(parse, server=self.server, path=path, command=label, reported=self._bad_lines)
        count = 0
        stopped = over = False
        with self._data(s, command, path, None) as conn:
            guard = self._guard(conn)
            pending = b""
            buf, view = _buffer()
            while not (stopped or over) and (n := conn.recv_into(buf)):
                _quickack(conn)
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
                _unwrap(conn)
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

    def _guard(self, conn: socket.socket) -> RateGuard | None:
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
    def _data(self, s: _Session, command: str, path: str, progress: Progress | None, *,
              early: bool = False) -> Iterator[socket.socket]:
        """A data connection for ``command`` (STOR/RETR/LIST...), closed after the block.

        ``early`` (plain connections only): the block starts as soon as the command is sent,
        before the server's reply opening the transfer, which the caller then reads with
        :func:`_transfer_opened` after the block (see EARLY_STOR_MAX).
        """
        ftp = s.ftp
        host, port = self._passive(s)
        conn = _dial(s.family, host, port, ftp.timeout)
        try:
            _nodelay(conn)
            ftp.putcmd(command)
            if progress is not None:
                progress.sent = True
            if not early:
                _transfer_opened(ftp)
            if self._context is not None:
                conn = self._context.wrap_socket(conn, server_hostname=self.cfg.host,
                                                 session=_tls_session(s))
                _quickack(conn)
        except BaseException:
            conn.close()
            raise
        try:
            yield conn
        finally:
            conn.close()

    def _passive(self, s: _Session) -> tuple[str, int]:
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

    # ------------------------------------------------------------------ sessions

    def _connect(self, timeout: float) -> _Session:
        cfg = self.cfg
        with map_ftp_errors(self.server, connecting=True):
            ftp: _BoundedFTP
            if not self._tls:
                ftp = _BoundedFTP(timeout=timeout)
            elif cfg.tls == "implicit":
                ftp = _ImplicitFTPS(context=self._context, timeout=timeout)
            else:
                ftp = _BoundedFTPS(context=self._context, timeout=timeout)
            # Connecting, TLS, login and the session's setup, all within ``timeout``.
            ftp.connect_deadline = time.monotonic() + timeout
            try:
                ftp.connect(cfg.host, cfg.port, timeout=timeout)
                _nodelay(ftp.sock)
                if isinstance(ftp, ftplib.FTP_TLS) and not isinstance(ftp.sock, ssl.SSLSocket):
                    ftp.auth()
                ftp.login(cfg.user, cfg.password_value())
                if isinstance(ftp, ftplib.FTP_TLS):
                    ftp.prot_p()
                assert ftp.sock is not None
                session = _Session(ftp, peer_host=ftp.sock.getpeername()[0], family=int(ftp.sock.family))
                session.features = _features(ftp)
                ftp.voidcmd("TYPE I")
                if session.has("UTF8"):
                    with suppress(ftplib.error_perm):
                        ftp.sendcmd("OPTS UTF8 ON")
                ftp.connect_deadline = None
                return session
            except BaseException:
                ftp.close()
                raise

    def _healthy(self, s: _Session, idle_for: float) -> bool:
        sock = s.ftp.sock
        if sock is None or getattr(s.ftp, "_rbuf", None) or _has_unread(sock):
            return False  # closed by the server, or an unsolicited reply ("421 Timeout")
        if idle_for > NOOP_AFTER_IDLE:
            _set_timeout(s, min(self.cfg.timeout, 5.0))
            s.ftp.voidcmd("NOOP")
        return True

    def _tls_context(self) -> ssl.SSLContext:
        cfg = self.cfg
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

    def _remote(self, path: str) -> str:
        rel = normalize(path)
        if rel == "/":
            return self._base
        return rel if self._base == "/" else self._base + rel


# --------------------------------------------------------------------------- helpers


def _dial(family: int, host: str, port: int, timeout: float | None) -> socket.socket:
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


def _nodelay(sock: socket.socket | None) -> None:
    # Nagle's algorithm delays the small command packets FTP is made of.
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _set_timeout(s: _Session, timeout: float) -> None:
    # settimeout() is a system call (it switches the socket's blocking mode): skip it when the
    # session has that timeout already, the usual case.
    if s.ftp.timeout != timeout or s.sock.gettimeout() != timeout:
        s.ftp.timeout = timeout
        s.sock.settimeout(timeout)


def _close(s: _Session) -> None:
    """End the session with QUIT (over TLS, then a close_notify), and close its socket.

    The server then ends the session as a normal logout instead of an aborted connection (which
    ProFTPD and pure-ftpd log as errors).  Skipped when the server has closed the connection or
    sent something nobody read (the session is broken); each wait lasts QUIT_TIMEOUT at most.
    """
    sock = s.ftp.sock
    with suppress(Exception):
        if sock is not None and not _has_unread(sock):
            sock.settimeout(min(s.ftp.timeout or QUIT_TIMEOUT, QUIT_TIMEOUT))
            s.ftp.putcmd("QUIT")
            s.ftp.getresp()
            if isinstance(sock, ssl.SSLSocket):
                sock.unwrap()
    with suppress(Exception):
        s.ftp.close()


def _send_all(conn: socket.socket, data: memoryview | bytes, guard: RateGuard | None) -> None:
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


def _transfer_opened(ftp: ftplib.FTP) -> None:
    """Read the reply that opens a transfer (1xx); a refusal is raised as ftplib's error."""
    resp = ftp.getresp()
    if resp[0] == "2":  # some servers send 2xx before the transfer reply
        resp = ftp.getresp()
    if resp[0] != "1":
        raise ftplib.error_reply(resp)


def _small_in_memory(stream: BinaryIO, start: int | None) -> bool:
    """Whether ``stream`` is in memory with at most EARLY_STOR_MAX bytes left from ``start``."""
    if start is None or not isinstance(stream, io.BytesIO):
        return False
    with stream.getbuffer() as view:
        return view.nbytes - start <= EARLY_STOR_MAX


def _unwrap(conn: socket.socket) -> None:
    # A clean TLS shutdown tells the server the transfer ended where it should have.
    if isinstance(conn, ssl.SSLSocket):
        with suppress(OSError, ValueError):
            conn.unwrap()


def _quickack(conn: socket.socket) -> None:
    """Acknowledge at once what arrives next on a TLS data connection (Linux TCP_QUICKACK).

    A server that writes its close_notify right after the last data with Nagle's algorithm on
    (pure-ftpd) holds it until that data is acknowledged, and a client in delayed-ACK mode
    acknowledges only when its timer fires, a pause far longer than the listing itself.  The
    kernel clears the flag by itself, so it is set again after every read.
    """
    if _TCP_QUICKACK is not None and isinstance(conn, ssl.SSLSocket):
        with suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)


def _tls_session(s: _Session) -> ssl.SSLSession | None:
    # Reusing the control connection's TLS session is required by vsftpd (require_ssl_reuse).
    sock = s.ftp.sock
    return sock.session if isinstance(sock, ssl.SSLSocket) else None


def _is_dot_line(line: str | bytes) -> bool:
    """Whether a unix-style listing line is the listed directory's own ``.`` entry: the proof,
    in a LIST or STAT answer, that the directory exists (vsftpd lists a missing one as empty)."""
    return line[:1] in ("d", b"d") and line[-2:] in (" .", b" .")


def _has_unread(sock: socket.socket) -> bool:
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


def _features(ftp: ftplib.FTP) -> set[str]:
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


_buffers = threading.local()


def _buffer() -> tuple[bytearray, memoryview]:
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


def _chunks(stream: BinaryIO) -> Iterator[memoryview | bytes]:
    """``stream``'s content in chunks of up to CHUNK bytes, into one reused buffer if it can."""
    if isinstance(stream, io.BytesIO):
        # A message body in memory: read() hands back the very bytes object it was made from
        # (no copy) when it is read whole from the start, the usual case.
        while chunk := stream.read(CHUNK):
            yield chunk
    elif isinstance(stream, io.BufferedIOBase):
        # readinto a single buffer: no allocation per chunk, so memory stays flat however
        # large the file (a fresh 256 KiB bytes per chunk lets the C heap fragment and grow).
        buf, view = _buffer()
        while n := stream.readinto(buf):
            yield view[:n]
    else:
        while chunk := stream.read(CHUNK):
            yield chunk


def _parse_listing(lines: Iterable[str], parse: Callable[[str], Entry | None], *, server: str, path: str,
                   command: str, reported: LoggedOnce) -> list[Entry]:
    """Parsed listing lines.  A line that does not parse (a fact like ``size=²``, an odd
    format) is logged once and skipped: one bad entry never hides the others.  Only a listing
    none of whose lines parse is refused, since that is a format ftpbc does not understand.
    An entry whose name is refused by :func:`~ftpbc.transport.names.listed_name` (a path such
    as ``sub/req.X``, ``\\``, a line break, NUL, ``..``, bytes that are not UTF-8) is skipped
    and logged once per name too, but the line did parse."""
    entries: list[Entry] = []
    bad: list[str] = []
    odd: list[OddName] = []
    for line in lines:
        try:
            entry = parse(line)
        except OddName as exc:
            odd.append(exc)
            continue
        except ValueError:
            bad.append(line)
            continue
        if entry is not None:
            entries.append(entry)
    if bad:
        if not entries and not odd and len(bad) >= 2:
            raise ProtocolError(f"cannot parse any {command} line, e.g. {bad[0][:200]!r} (only "
                                "unix-style LIST and RFC 3659 MLSD are understood)",
                                server=server, path=path)
        for line in bad:
            if reported.first(("line", line)):
                log.warning("%s%s: skipped a %s line that does not parse: %r", server, path,
                            command, line[:200])
    for refused in odd:
        if reported.first(("name", refused.name)):
            log.warning("%s%s: skipped a %s entry: %s", server, path, command, refused)
    return entries


class _LineParser:
    """:func:`_parse_listing` one line at a time, for a listing parsed as it streams in: the
    same rules (a bad line or an unusable name logged once and skipped), and :meth:`finish`
    refuses a listing none of whose lines parsed."""

    def __init__(self, parse: Callable[[str], Entry | None], *, server: str, path: str, command: str,
                 reported: LoggedOnce) -> None:
        self.parse = parse
        self.server, self.path, self.command, self.reported = server, path, command, reported
        self.parsed = 0
        self.bad: list[str] = []
        self.odd = 0

    def feed(self, raw: bytes) -> Entry | None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            return None
        line = raw.decode("utf-8", errors="surrogateescape")
        try:
            entry = self.parse(line)
        except OddName as exc:
            self.odd += 1
            self._report(("name", exc.name), f"skipped a {self.command} entry: {exc}")
            return None
        except ValueError:
            if len(self.bad) < 2:
                self.bad.append(line)  # kept for the "nothing parses" error only
            self._report(("line", line), f"skipped a {self.command} line that does not parse: {line[:200]!r}")
            return None
        if entry is not None:
            self.parsed += 1
        return entry

    def _report(self, key: tuple[str, str], message: str) -> None:
        if self.reported.first(key):
            log.warning("%s%s: %s", self.server, self.path, message)

    def finish(self) -> None:
        if len(self.bad) >= 2 and not self.parsed and not self.odd:
            raise ProtocolError(f"cannot parse any {self.command} line, e.g. {self.bad[0][:200]!r} (only "
                                "unix-style LIST and RFC 3659 MLSD are understood)",
                                server=self.server, path=self.path)


def _parse_time(value: str) -> datetime:
    """``YYYYMMDDHHMMSS[.sss]`` (MDTM, MLSD modify=) as UTC.  ValueError if malformed."""
    # Sliced by hand: strptime costs more than the rest of a 10,000-line listing's parsing.
    whole, _, frac = value.partition(".")
    if len(whole) != 14 or not whole.isdigit():
        raise ValueError(f"bad FTP time value {value!r}")
    micro = int(frac[:6].ljust(6, "0")) if frac.isdigit() else 0
    return datetime(int(whole[:4]), int(whole[4:6]), int(whole[6:8]), int(whole[8:10]),
                    int(whole[10:12]), int(whole[12:14]), micro, tzinfo=UTC)


def _facts(line: str) -> tuple[str, str, str, datetime | None] | None:
    """The name, type (lower case, "" if none), size fact and time of one
    ``fact=value;...; name`` line; None for a line without a name.  ValueError for a size fact
    that does not parse."""
    facts_part, sep, name = line.partition(" ")
    if not sep:
        return None
    kind = size = modify = ""
    for fact in facts_part.split(";"):
        key, _, value = fact.partition("=")
        key = key.lower()
        if key == "type":
            kind = value.lower()
        elif key == "size":
            size = value
        elif key == "modify":
            modify = value
    if size and not (size.isascii() and size.isdigit()):
        raise ValueError(f"bad size fact {size!r}")  # str.isdigit() takes '²', int() does not
    mtime = None
    if modify:
        with suppress(ValueError, OverflowError):  # modify=99999999999999: the time is unknown
            mtime = _parse_time(modify)
    return name, kind, size, mtime


def _typed(kind: str) -> None:
    if not kind:
        # Not even the type: a file cannot be told from a directory (or a link), so none is
        # guessed.  Every server ftpbc knows sends it.
        raise ValueError("no type fact")


def _sized(kind: str, size: str) -> int:
    # No size fact on a file: -1, "no size given" (a read is then bounded by
    # max_message_bytes), not 0, which would make a read of any byte look too long.
    return int(size) if size else 0 if kind == "dir" else -1


def _parse_mlsx(line: str) -> Entry | None:
    """One MLSD line: ``fact=value;...; name``.  None for the directory's own entries (``cdir``,
    ``pdir``, or a directory named ``.`` or ``..``) and lines without a name; OddName for a
    name :func:`listed_name` refuses (a path such as ``sub/req.X`` is refused, never cut to
    its last part); ValueError for a fact that does not parse."""
    parsed = _facts(line)
    if parsed is None:
        return None
    name, kind, size, mtime = parsed
    if kind in ("cdir", "pdir") or (kind in ("dir", "") and name in (".", "..")):
        return None
    _typed(kind)
    return Entry(listed_name(name), _sized(kind, size), mtime, kind == "dir")


def _parse_mlst(line: str, name: str) -> Entry | None:
    """The facts line of an MLST reply, as the entry named ``name``.  The server names the path
    it was asked about there, not a listed name, so that name is not used.  None for a line
    without a name or the type of a directory's own entry; ValueError for a fact that does
    not parse."""
    parsed = _facts(line)
    if parsed is None:
        return None
    _, kind, size, mtime = parsed
    if kind in ("cdir", "pdir"):
        return None
    _typed(kind)
    return Entry(name, _sized(kind, size), mtime, kind == "dir")


#: listing lines remembered, parsed, per transport (about 250 bytes each)
PARSED_LINES = 20_000


class _ParsedLines:
    """Listing lines already parsed, and their entries.

    A poller lists the same inbox again and again, and a large listing is mostly the same lines
    each time: parsing them is most of the poller thread's CPU per listing, a lookup per line a
    small part of that.  Bounded: emptied when it outgrows PARSED_LINES.  A LIST
    line's time may depend on the current date (``ls`` prints no year for the last six months),
    so one is remembered only when its entry is dated in the past of the year it was parsed in,
    where it stays the same for the rest of that year.
    """

    def __init__(self) -> None:
        self._mlsx: dict[str, Entry | None] = {}
        self._list: dict[tuple[str, int], Entry | None] = {}

    def mlsx(self, line: str) -> Entry | None:
        try:
            return self._mlsx[line]
        except KeyError:
            pass
        entry = _parse_mlsx(line)
        if len(self._mlsx) >= PARSED_LINES:
            self._mlsx = {}  # replaced, not cleared: another thread may be reading it
        self._mlsx[line] = entry
        return entry

    def list_line(self, line: str, now: datetime) -> Entry | None:
        key = (line, now.year)
        try:
            return self._list[key]
        except KeyError:
            pass
        entry = _parse_list_line(line, now)
        if entry is None or entry.mtime is None or entry.mtime <= now:
            if len(self._list) >= PARSED_LINES:
                self._list = {}
            self._list[key] = entry
        return entry


_LIST_RE = re.compile(
    r"^(?P<type>[-dlbcps])[-rwxsStTl+.@]{9}\S*\s+\d+\s+\S+\s+\S+\s+(?P<size>\d+)\s+"
    r"(?P<mon>[A-Za-z]{3})\s+(?P<day>\d{1,2})\s+(?P<time>\d{1,2}:\d{2}|\d{4})\s(?P<name>.+)$")
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}


def _parse_list_line(line: str, now: datetime) -> Entry | None:
    """One unix ``ls -l`` style LIST line (vsftpd, ProFTPD...).

    None for ``total N`` and the directories ``.`` and ``..``; OddName for a name
    :func:`listed_name` refuses; ValueError for a line in any other format.

    Times are taken as UTC (vsftpd's default, ``use_localtime=NO``).  A date without a year is
    in the last twelve months, as ``ls`` prints it.
    """
    m = _LIST_RE.match(line)
    if m is None:
        if line.startswith("total "):
            return None
        raise ValueError(f"not a unix-style LIST line: {line!r}")
    name = m["name"]
    if m["type"] == "l" and " -> " in name:
        name = name.split(" -> ", 1)[0]
    if m["type"] == "d" and name in (".", ".."):
        return None
    listed_name(name)
    mtime: datetime | None = None
    month = _MONTHS.get(m["mon"].lower())
    if month is not None:
        try:
            if ":" in m["time"]:
                hh, mm = (int(x) for x in m["time"].split(":"))
                mtime = datetime(now.year, month, int(m["day"]), hh, mm, tzinfo=UTC)
                if (mtime - now).days > 1:
                    mtime = mtime.replace(year=now.year - 1)
            else:
                mtime = datetime(int(m["time"]), month, int(m["day"]), tzinfo=UTC)
        except ValueError:
            mtime = None
    return Entry(name, int(m["size"]), mtime, m["type"] == "d")

