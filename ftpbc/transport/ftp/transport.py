"""FTP and FTPS as a :class:`~ftpbc.transport.base.Transport`: :class:`FTPTransport`.

One transport per server; it keeps up to ``cfg.pool_size`` logged-in control connections
(:mod:`~ftpbc.transport.ftp.control`) in a :class:`~ftpbc.transport.pool.Pool` shared by all
threads, opens a data connection per transfer (:mod:`~ftpbc.transport.ftp.data`) and parses
listings with :mod:`~ftpbc.transport.ftp.listing`.

Listings use ``MLSD`` when the server advertises it (exact sizes, mtimes to the second) and
``LIST -a`` otherwise (vsftpd).  A streamed listing (``scan``) names a plain path in the command,
one round trip instead of two; its ``.`` line is what proves the directory exists (vsftpd lists
a missing one as empty, with ``226``), and without one a ``CWD`` decides.  A small directory is
listed by ``STAT -a <dir>`` on the control connection where the server lists so (no data
connection).  Other listings go from the directory as working directory.  ``stat`` uses
``MLST`` where available, else ``SIZE`` + ``MDTM`` (and ``CWD`` for directories).  A listed name
is taken whole or not at all (:mod:`ftpbc.transport.names`): an entry named ``sub/req.X`` is
skipped and logged once, never cut to ``req.X``.

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
import logging
import posixpath
import re
from collections.abc import Callable, Sequence
from contextlib import suppress
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
from ftpbc.transport.errormap import Progress, ReplyTooLong, translate_ftp_reply
from ftpbc.transport.ftp.control import (
    BoundedFTP,
    Session,
    close_session,
    connect_session,
    healthy,
    run,
    tls_context,
)
from ftpbc.transport.ftp.data import Transfers, small_in_memory
from ftpbc.transport.ftp.listing import (
    PARSED_LINES,
    LineParser,
    ParsedLines,
    is_dot_line,
    parse_listing,
    parse_mlst_line,
    parse_time,
)
from ftpbc.transport.names import LoggedOnce
from ftpbc.transport.pool import Pool

__all__ = ["FTPTransport"]

T = TypeVar("T")

log = logging.getLogger("ftpbc.ftp")

#: the closing reply of a glob listing the server could not make, though its code says success
#: (pure-ftpd past its listing cap: "226-Out of memory during globbing of *.0*")
_GLOB_FAILED = "during globbing"
#: rename pairs sent in one write by rename_each: their replies (two short lines each) stay
#: far below any socket buffer, so the server never blocks writing them while we write
RENAME_BATCH = 32
#: a directory whose listing had more lines than this is listed by LIST, not STAT: a STAT reply
#: must fit in control.MAX_REPLY (lines of 60-300 bytes)
STAT_MAX_ENTRIES = 200
#: large directories remembered per transport at most (forgetting one costs one oversized STAT)
LARGE_DIRS_REMEMBERED = 10_000
#: remote directories listed by ``LIST -a <path>`` rather than ``CWD`` + ``LIST -a``: those no
#: server would glob or split at a space (other paths are listed from their working directory)
_LISTABLE_BY_PATH = re.compile(r"/[A-Za-z0-9._/-]*")


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
        self._context = tls_context(cfg) if self._tls else None
        self._parsed = ParsedLines()
        #: bad listing lines and refused names already logged (each once, not once per poll)
        self._bad_lines = LoggedOnce(PARSED_LINES)
        self._transfers = Transfers(cfg, self._context, self._bad_lines)
        #: whether the server lists by glob (see scan): not known until it is asked
        self.globs: bool | None = None
        #: whether ``STAT -a <dir>`` lists a directory as LIST does (see _stat_scan): not known
        #: until it is asked
        self.stat_lists: bool | None = None
        #: directories whose last listing had more than STAT_MAX_ENTRIES lines: listed by LIST
        self._large_dirs: set[str] = set()
        self._pool: Pool[Session] = Pool(connect=self._connect, check=self._healthy, close=close_session,
                                         size=cfg.pool_size, server=self.server,
                                         default_timeout=cfg.timeout)

    # ------------------------------------------------------------------ Transport API

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        remote = self._remote(path)

        def op(s: Session, progress: Progress) -> list[Entry]:
            if s.has("MLSD"):
                try:
                    lines = self._transfers.read_lines(s, f"MLSD {remote}", path)
                except ftplib.error_perm as exc:
                    if str(exc)[:3] in ("501", "550", "450"):  # pyftpdlib: "501 No such directory."
                        raise NotFound(f"no such directory: {exc}", server=self.server, path=path) from None
                    raise
                return parse_listing(lines, self._parsed.mlsx, server=self.server, path=path,
                                     command="MLSD", reported=self._bad_lines)
            self._cwd(s, remote)
            now = datetime.now(UTC)
            return parse_listing(self._transfers.read_lines(s, "LIST -a", path),
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

        def op(s: Session, progress: Progress) -> bool:
            if glob is not None and self.globs is not False:
                self._cwd(s, remote)
                now = datetime.now(UTC)
                closing: builtins.list[str] = []
                try:
                    done = self._transfers.stream(s, f"LIST -a {glob}", path,
                                                  lambda ln: self._parsed.list_line(ln, now), counted,
                                                  label="LIST", reply=closing)
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
                    return self._transfers.stream(s, f"MLSD {remote}", path, self._parsed.mlsx, counted,
                                                  label="MLSD")
                except ftplib.error_perm as exc:
                    if str(exc)[:3] in ("501", "550", "450"):
                        raise NotFound(f"no such directory: {exc}", server=self.server, path=path) from None
                    raise
            if not _LISTABLE_BY_PATH.fullmatch(remote):
                self._cwd(s, remote)
                now = datetime.now(UTC)
                return self._transfers.stream(s, "LIST -a", path, lambda ln: self._parsed.list_line(ln, now),
                                              counted, label="LIST")
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
                dot[0] = dot[0] or is_dot_line(line)
                return self._parsed.list_line(line, now)

            done = self._transfers.stream(s, f"LIST -a {remote}", path, parse, counted, label="LIST")
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
        # A small body in memory goes out without waiting for the server's 150 (data.EARLY_STOR_MAX).
        early = self._context is None and small_in_memory(stream, start)

        def op(s: Session, progress: Progress) -> int:
            if start is not None:
                stream.seek(start)
            return self._transfers.store(s, f"STOR {remote}", path, stream, progress, early=early)

        return self._run(path, op, timeout=timeout, repeatable=start is not None)

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        remote = self._remote(path)
        start = stream_position(stream)
        written = [0]

        def op(s: Session, progress: Progress) -> int:
            if start is not None:
                stream.seek(start)
                stream.truncate()
            return self._transfers.retrieve(s, f"RETR {remote}", path, stream, written)

        # Repeating a read is harmless, unless bytes already went into a stream we cannot rewind.
        return self._run(path, op, timeout=timeout,
                         repeatable=lambda: start is not None or written[0] == 0)

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        rsrc, rdst = self._remote(src), self._remote(dst)

        def op(s: Session, progress: Progress) -> None:
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

        def op(s: Session, progress: Progress) -> None:
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
    def pool(self) -> Pool[Session]:
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

        def op(s: Session, progress: Progress) -> bool:
            refused = self._rename_once(s, rsrc, rdst, src, progress)
            if refused is not None and not isinstance(refused, ftplib.error_perm):
                raise translate_ftp_reply(refused, server=self.server, path=dst)
            return refused is None

        return self._run(src, op, timeout=timeout, repeatable=False)

    # ------------------------------------------------------------------ operations

    def _run(self, path: str, op: Callable[[Session, Progress], T], *, timeout: float | None,
             repeatable: bool | Callable[[], bool]) -> T:
        return run(self._pool, self.server, path, op,
                   timeout=self.cfg.timeout if timeout is None else timeout, repeatable=repeatable)

    def _command(self, s: Session, line: str, path: str, progress: Progress | None) -> str:
        """Send one command and read its reply; ``progress`` marks it as state-changing."""
        s.ftp.putcmd(line)
        if progress is not None:
            progress.sent = True
        return s.ftp.voidresp()

    def _rename_once(self, s: Session, rsrc: str, rdst: str, src: str,
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

    def _rename_replies(self, s: Session, src: str) -> ftplib.Error | None:
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

    def _settle_refusal(self, s: Session, rsrc: str, rdst: str, src: str, dst: str, refused: ftplib.Error,
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

    def _exists(self, s: Session, remote: str, path: str) -> bool:
        try:
            self._stat(s, remote, path)
        except NotFound:
            return False
        return True

    def _mkdirs(self, s: Session, remote: str, path: str, progress: Progress) -> None:
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

    def _stat(self, s: Session, remote: str, path: str) -> Entry:
        name = posixpath.basename(remote) or "/"
        try:
            if s.has("MLST"):
                resp = s.ftp.sendcmd(f"MLST {remote}")
                facts = [ln for ln in resp.splitlines()[1:-1] if ln.strip()]
                try:
                    entry = parse_mlst_line(facts[0].lstrip(), name) if facts else None
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
                    mtime = parse_time(s.ftp.sendcmd(f"MDTM {remote}").split()[1])
            return Entry(name, size, mtime, False)
        except ftplib.error_perm as exc:
            if str(exc)[:3] in ("550", "450", "501"):
                raise NotFound(f"no such file or directory: {exc}", server=self.server, path=path) from None
            raise

    def _stat_scan(self, s: Session, remote: str, path: str, now: datetime, visit: Visit) -> bool | None:
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
        assert isinstance(ftp, BoundedFTP)
        try:
            reply, lines, whole = ftp.raw_reply(f"STAT -a {remote}")
        except ReplyTooLong:
            self._note_size(remote, STAT_MAX_ENTRIES + 1)
            raise ConnectionLost("a listing by STAT longer than a reply may be; listed again by LIST",
                                 server=self.server, path=path) from None
        except (ftplib.error_perm, ftplib.error_temp) as exc:
            if str(exc)[:3] in ("500", "501", "502", "504"):
                self.stat_lists = False  # not understood: never asked again
            return None
        if reply[:3] != "213" or len(lines) < 2:
            return None
        if not whole:
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
        if not any(is_dot_line(raw) for raw in body):
            return None
        self.stat_lists = True
        self._note_size(remote, len(body))
        limit = self.cfg.max_listing_entries + 1  # as LIST's, which may have a "total" line
        if len(body) > limit:
            del body[limit:]
            log.warning("%s %s: listing stopped at %d entries (max_listing_entries)", self.server, path,
                        self.cfg.max_listing_entries)
        parser = LineParser(lambda ln: self._parsed.list_line(ln, now), server=self.server, path=path,
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

    def _cwd(self, s: Session, remote: str) -> None:
        # Never cached: a directory removed and re-created under the same name would otherwise
        # be listed through the stale working directory of the server process (empty).
        s.ftp.sendcmd(f"CWD {remote}")

    # ------------------------------------------------------------------ sessions

    def _connect(self, timeout: float) -> Session:
        return connect_session(self.cfg, self._context, timeout)

    def _healthy(self, s: Session, idle_for: float) -> bool:
        return healthy(s, idle_for, self.cfg.timeout)

    def _remote(self, path: str) -> str:
        rel = normalize(path)
        if rel == "/":
            return self._base
        return rel if self._base == "/" else self._base + rel
