"""SFTP (SSH File Transfer Protocol) transport, over paramiko, with pooled connections.

One *session* is one SSH connection carrying one SFTP channel.  Sessions are opened lazily and
shared between threads through :class:`ftpbc.transport.pool.Pool` (``cfg.pool_size`` at most),
because an SSH login costs many times an SFTP request.

Authentication
    With ``key_file`` the key (ed25519, ECDSA or RSA; not passphrase-protected) is offered first;
    with a password, password login is tried (after a refused key, too).  A key file that group
    or others may read or write is refused with a ConfigError naming it and its mode, as ssh
    refuses it, unless ``allow_insecure_secret_files`` is set.

Host keys
    The server's key is checked against ``known_hosts`` (``~/.ssh/known_hosts`` when unset, read
    by :mod:`ftpbc.transport.knownhosts`) before any credential is sent.  A key the file marks
    ``@revoked`` raises :class:`~ftpbc.errors.HostKeyRevoked`, whatever other lines say.  An
    unknown key raises :class:`~ftpbc.errors.HostKeyRejected` naming the server and the key's
    SHA256 fingerprint, unless ``auto_accept_host_keys`` is on and the file lists no key at all
    for the host (nor a ``@cert-authority`` line): then it is appended to the file and logged at
    WARNING with its type and fingerprint.  A key that *differs* from the recorded one, or is of
    a type the file does not list for a host it knows, is always refused, auto-accept or not:
    that is what a man-in-the-middle looks like.  ``@cert-authority`` lines are read but not
    used (paramiko does not verify host certificates).

Guarantees
    * Every socket has TCP_NODELAY (Nagle's algorithm made SFTP listings 4x slower).
    * ``put`` and ``get`` stream with up to 2 MiB of requests in flight: memory stays bounded
      whatever the file size (a 64 MiB round trip grows RSS by a few MiB).  ``put`` checks the
      reply to every WRITE and to the final CLOSE, so a full disk fails the put.  ``get`` reads
      the size the file had when opened (files are renamed into place whole, so the size does
      not change under a reader).
    * ``rename`` follows the contract in :mod:`ftpbc.transport.base`: ``posix-rename@openssh.com``
      (atomic replace) when the server announces it; otherwise remove the target, then rename.
    * Library errors are translated into :mod:`ftpbc.errors` here; messages name the server
      (``sftp://user@host:port``) and the path, never a password.  A request that was sent but
      not answered raises :class:`~ftpbc.errors.OutcomeUnknown`.
    * An operation that failed with ConnectionLost (nothing was sent, e.g. a pooled connection
      the server had closed) is retried once on a fresh connection; so is one whose repetition
      is harmless (list, stat, mkdir, put/get with a seekable stream) after OutcomeUnknown.

Bounds on the server (a hostile or broken one must not hang a node)
    Connecting (TCP, SSH negotiation, host key, login, the SFTP channel and its version
    exchange) takes at most ``timeout`` as a whole: a watchdog closes the connection when it runs
    out, which ends whichever step paramiko is waiting in (some, like opening the subsystem, wait
    without a limit of their own).  Each reply packet must be complete within ``timeout`` of
    starting to read it (a deadline, not a limit per read).  During a transfer the replies are
    bounded instead by ``min_transfer_rate`` over ``min_rate_window`` (curl's --speed-limit and
    --speed-time), counted on the bytes that go through the channel either way.

Not guaranteed: SFTP has no file locking, and ``put`` is not atomic (stage, then rename).
"""

from __future__ import annotations

import builtins
import errno
import logging
import posixpath
import socket
import stat as statmod
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar, cast

import paramiko
from paramiko.message import Message
from paramiko.sftp import (
    CMD_CLOSE,
    CMD_DATA,
    CMD_HANDLE,
    CMD_INIT,
    CMD_NAME,
    CMD_OPEN,
    CMD_OPENDIR,
    CMD_READ,
    CMD_READDIR,
    CMD_STATUS,
    CMD_VERSION,
    CMD_WRITE,
    SFTP_EOF,
    SFTP_FLAG_CREATE,
    SFTP_FLAG_TRUNC,
    SFTP_FLAG_WRITE,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_OP_UNSUPPORTED,
    SFTP_PERMISSION_DENIED,
    SFTPError,
    int64,
)

from ftpbc.config.servers import ServerConfig, open_secret_file_problem
from ftpbc.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectFailed,
    ConnectionLost,
    HostKeyRejected,
    HostKeyRevoked,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolError,
    SourceGone,
    TransportError,
)
from ftpbc.transport import knownhosts
from ftpbc.transport.base import Entry, Refused, Transport, Visit, normalize, stream_position
from ftpbc.transport.errormap import DeadlineExceeded, Progress, RateGuard, translate_os_error
from ftpbc.transport.knownhosts import HostKeys
from ftpbc.transport.names import LoggedOnce, OddName, listed_name
from ftpbc.transport.pool import Pool

log = logging.getLogger("ftpbc.sftp")

T = TypeVar("T")

CHUNK = 1 << 20
#: bytes per SFTP READ or WRITE request: 32 KiB is what every server must accept (SFTPv3 s. 3)
REQUEST_SIZE = 32 * 1024
#: requests in flight during a put or get: 2 MiB, paramiko's default channel window, which is
#: enough to keep loopback busy and is all the memory a transfer holds
PIPELINE_DEPTH = 64
#: an idle session older than this is probed with a round trip before reuse
PROBE_AFTER = 15.0
POSIX_RENAME = "posix-rename@openssh.com"
#: refused listed names logged per transport (each once); beyond this, still refused, silently
REPORTED_NAMES = 10_000

_SFTP_VERSION = 3
_WRITE_FLAGS = SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_TRUNC
#: failures after which the session is broken (the pool drops it): nothing more is asked of it
_BROKEN = (TimeoutError, EOFError, ConnectionError, paramiko.SSHException)
_known_hosts_lock = threading.Lock()


class _Status(IOError):
    """An SFTP status reply other than OK/EOF; ``code`` is the SSH_FX_* code.

    An IOError (with errno ENOENT/EACCES where they apply, as paramiko's own) so that paramiko's
    internals which catch IOError keep working.
    """

    def __init__(self, code: int, text: str) -> None:
        eno = {SFTP_NO_SUCH_FILE: errno.ENOENT, SFTP_PERMISSION_DENIED: errno.EACCES}.get(code)
        super().__init__(eno or 0, text)
        self.code = code
        self.text = text


def _listdir(c: paramiko.SFTPClient, remote: str, limit: int, server: str,
             reported: LoggedOnce) -> list[paramiko.SFTPAttributes]:
    """paramiko's ``listdir_attr``, stopped after ``limit`` entries (with a warning): a server
    that lists without end cannot fill this node's memory."""
    found: list[paramiko.SFTPAttributes] = []

    def keep(a: paramiko.SFTPAttributes) -> bool:
        found.append(a)
        return True
    _readdir(c, remote, limit, server, keep, reported)
    return found


def _readdir(c: paramiko.SFTPClient, remote: str, limit: int, server: str,
             visit: Callable[[paramiko.SFTPAttributes], bool], reported: LoggedOnce) -> bool:
    """The entries of ``remote`` to ``visit`` as each READDIR reply comes in (a hundred or so
    each from OpenSSH), at most ``limit`` of them (with a warning); False once ``visit``
    stopped the listing (the handle is closed, the rest never asked for).

    A name :func:`~ftpbc.transport.names.listed_name` refuses (a path such as ``sub/req.X``,
    ``\\``, NUL, a line break, bytes that are not UTF-8) is skipped, logged once per name
    (``reported``), and counts toward ``limit``; the rest of the listing goes on."""
    request = c._request  # type: ignore[attr-defined]  # private, not in the stubs
    t, msg = request(CMD_OPENDIR, remote)
    if t != CMD_HANDLE:
        raise SFTPError("Expected handle")
    handle = msg.get_binary()
    count = 0
    try:
        while count < limit:
            try:
                t, msg = request(CMD_READDIR, handle)
            except EOFError:
                return True
            if t != CMD_NAME:
                raise SFTPError("Expected name response")
            for _ in range(msg.get_int()):
                # Decoded here rather than by paramiko (strict UTF-8): one name that is not
                # UTF-8 would fail the whole listing; decoded so, listed_name refuses it alone.
                filename = msg.get_string().decode("utf-8", "surrogateescape")
                longname = msg.get_string().decode("utf-8", "replace")
                attr = paramiko.SFTPAttributes._from_msg(msg, filename, longname)  # type: ignore[attr-defined]
                if filename in (".", "..") or count >= limit:
                    continue
                count += 1
                try:
                    listed_name(filename)
                except OddName as exc:
                    if reported.first(filename):
                        log.warning("%s%s: skipped a listed entry: %s", server, remote, exc)
                    continue
                if not visit(attr):
                    return False
        log.warning("%s %s: listing stopped at %d entries (max_listing_entries)", server, remote, limit)
        return True
    finally:
        request(CMD_CLOSE, handle)


class _Client(paramiko.SFTPClient):
    """paramiko's SFTPClient plus the three things it does not expose.

    * the extensions the server announced in its VERSION packet (to know about posix-rename);
    * ``progress.sent``: set once a request's bytes were handed to the channel, which is what
      separates "not done" from "outcome unknown" when the reply never comes;
    * status replies as :class:`_Status` carrying the numeric code instead of text only;
    * bounds on the server: each reply packet complete within ``limit`` seconds of starting to
      read it, or, while ``guard`` is set (a transfer), the guard's minimum rate.
    """

    def __init__(self, chan: paramiko.Channel, limit: float) -> None:
        self.extensions: dict[str, bytes] = {}
        self.progress = Progress()
        #: seconds a reply packet may take (the operation's timeout)
        self.limit = limit
        #: the minimum-rate check of the transfer under way, if any
        self.guard: RateGuard | None = None
        self._deadline: float | None = None
        super().__init__(chan)

    def _read_packet(self) -> tuple[int, bytes]:
        self._deadline = time.monotonic() + self.limit if self.guard is None else None
        try:
            return super()._read_packet()  # type: ignore[misc,no-any-return]  # private, not in stubs
        finally:
            self._deadline = None

    def _read_all(self, n: int) -> bytes:
        """paramiko's, with the reply deadline (or the transfer's rate) enforced between reads."""
        chan = self.sock
        out = b""
        while n > 0:
            guard, deadline = self.guard, self._deadline
            if guard is not None:
                wait = guard.read_timeout(self.limit)
            elif deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise self._late()
            else:
                wait = self.limit
            if chan.gettimeout() != wait:
                chan.settimeout(wait)
            try:
                x = chan.recv(n)
            except TimeoutError:
                if guard is None and deadline is not None:
                    raise self._late() from None
                raise
            if not x:
                raise EOFError()
            if guard is not None:
                guard.add(len(x))
            out += x
            n -= len(x)
        return out

    def _write_all(self, out: bytes) -> None:
        guard = self.guard
        if guard is None:
            super()._write_all(out)  # type: ignore[misc]  # private, not in the stubs
            return
        chan = self.sock
        wait = guard.read_timeout(self.limit)
        if chan.gettimeout() != wait:
            chan.settimeout(wait)
        while out:
            n = chan.send(out)
            if n <= 0:
                raise EOFError()
            guard.add(n)
            out = out[n:]

    def _late(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"no reply within {self.limit:g} s (or only part of one)")

    def _send_version(self) -> int:
        msg = Message()
        msg.add_int(_SFTP_VERSION)
        self._send_packet(CMD_INIT, msg)
        kind, data = self._read_packet()  # type: ignore[attr-defined]  # private, not in stubs
        if kind != CMD_VERSION:
            raise SFTPError("Incompatible sftp protocol")
        reply = Message(data)
        version = reply.get_int()
        while reply.get_remainder():
            name = reply.get_text()
            self.extensions[name] = reply.get_binary()
        return int(version)

    def _send_packet(self, t: int, packet: Any) -> None:  # type: ignore[override]
        super()._send_packet(t, packet)  # type: ignore[misc]  # private, not in the stubs
        self.progress.sent = True

    def _convert_status(self, msg: Message) -> None:
        code = msg.get_int()
        text = msg.get_text()
        if code == SFTP_OK:
            return
        if code == SFTP_EOF:
            raise EOFError(text)  # paramiko's read loop relies on EOFError for end of file
        raise _Status(code, text)


class _Replies:
    """Collects the replies paramiko's ``_read_response`` routes to the requests made with it."""

    def __init__(self, client: _Client, handle: bytes) -> None:
        self.client = client
        self.handle = handle
        self.replies: dict[int, tuple[int, Message]] = {}

    def _async_response(self, t: int, msg: Message, num: int) -> None:
        self.replies[num] = (t, msg)

    def _send(self, kind: int, *args: Any) -> int:
        return int(self.client._async_request(self, kind, self.handle, *args))  # type: ignore[attr-defined]

    def _wait(self, num: int) -> tuple[int, Message]:
        while num not in self.replies:
            self.client._read_response()  # type: ignore[attr-defined]
        return self.replies.pop(num)


class _PipelinedWriter(_Replies):
    """Writes a stream and closes the handle, with up to PIPELINE_DEPTH requests in flight.

    Every WRITE reply and the CLOSE reply are checked.  paramiko's pipelined SFTPFile is not
    used: it drops the status of the last writes (their replies reach no one while CLOSE is
    awaited), so a write to a full disk reported success.  CLOSE is sent behind the last writes
    without waiting for them, so a small put costs two round trips (OPEN, then WRITE+CLOSE).
    """

    def write_and_close(self, stream: BinaryIO) -> int:
        pending: deque[int] = deque()
        offset = 0
        failure: _Status | None = None
        broken = False
        try:
            while failure is None and (chunk := stream.read(CHUNK)):
                view = memoryview(chunk)
                for start in range(0, len(view), REQUEST_SIZE):
                    if len(pending) >= PIPELINE_DEPTH:
                        failure = self._check(pending.popleft())
                        if failure is not None:
                            break
                    piece = bytes(view[start:start + REQUEST_SIZE])
                    pending.append(self._send(CMD_WRITE, int64(offset), piece))
                    offset += len(piece)
        except _BROKEN:
            broken = True  # the session is dropped: waiting for the other replies would only add time
            raise
        finally:
            # Also when the stream raised: the handle must be closed for the session to be reused.
            if not broken:
                pending.append(self._send(CMD_CLOSE))
                for num in pending:
                    failure = self._check(num) or failure
        if failure is not None:
            raise failure
        return offset

    def _check(self, num: int) -> _Status | None:
        kind, msg = self._wait(num)
        if kind != CMD_STATUS:
            raise SFTPError(f"expected a STATUS reply, got packet type {kind}")
        try:
            self.client._convert_status(msg)
        except _Status as exc:
            return exc
        return None


class _PipelinedReader(_Replies):
    """Copies a remote file with up to PIPELINE_DEPTH READ requests in flight, in order.

    paramiko's own ``prefetch`` is not used: when the reader catches up with the prefetch
    thread it falls back to synchronous reads while the thread goes on requesting the whole
    file, whose replies then pile up unread (a 64 MiB get held 40 MiB and read the file twice).
    Here a request is only sent when a reply has been consumed, so memory is bounded.
    """

    def copy(self, size: int, stream: BinaryIO) -> int:
        """Read ``size`` bytes (fewer if the file is shorter) into ``stream``; return the count."""
        c = self.client
        pending: deque[tuple[int, int, int]] = deque()  # (request number, offset, length)
        total = 0
        ahead = 0  # next offset to request
        while total < size:
            while ahead < size and len(pending) < PIPELINE_DEPTH:
                length = min(REQUEST_SIZE, size - ahead)
                pending.append((self._send(CMD_READ, int64(ahead), length), ahead, length))
                ahead += length
            num, offset, length = pending.popleft()
            kind, msg = self._wait(num)
            if kind == CMD_STATUS:
                try:
                    c._convert_status(msg)
                except EOFError:
                    break  # the file is shorter than when it was opened
            if kind != CMD_DATA:
                raise SFTPError(f"expected DATA, got packet type {kind}")
            data = msg.get_string()
            if not data:
                break  # a server answering DATA with nothing would otherwise loop forever
            stream.write(data)
            total += len(data)
            if len(data) < length:
                # A short read (allowed by the protocol): the replies in flight are for offsets
                # beyond a gap, so drop them and carry on from where the data stopped.
                for stale, _, _ in pending:
                    self.replies.pop(stale, None)
                pending.clear()
                ahead = offset + len(data)
        return total


@dataclass
class _Session:
    ssh: paramiko.Transport
    sftp: _Client

    def close(self) -> None:
        try:
            self.sftp.close()
        finally:
            self.ssh.close()


# --------------------------------------------------------------------------- host keys


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key."""
    return knownhosts.fingerprint(key.asbytes())


def _known_hosts_path(cfg: ServerConfig) -> Path:
    return cfg.known_hosts if cfg.known_hosts is not None else Path("~/.ssh/known_hosts").expanduser()


def _host_entry_name(cfg: ServerConfig) -> str:
    # OpenSSH's known_hosts spelling: bare host on port 22, "[host]:port" otherwise.
    return cfg.host if cfg.port == 22 else f"[{cfg.host}]:{cfg.port}"


def _load_known(cfg: ServerConfig) -> HostKeys:
    """What known_hosts says about this server (nothing when the file does not exist)."""
    return knownhosts.load(_known_hosts_path(cfg), _host_entry_name(cfg))


def _prefer_known_key_types(t: paramiko.Transport, known: HostKeys) -> None:
    # Like OpenSSH, ask first for the host key types already recorded, so a server with several
    # host keys shows the one known_hosts can vouch for.
    wanted = set(known.types())
    if not wanted:
        return
    if "ssh-rsa" in wanted:
        wanted |= {"rsa-sha2-512", "rsa-sha2-256"}
    options = t.get_security_options()
    current = list(options.key_types)
    options.key_types = tuple([k for k in current if k in wanted] + [k for k in current if k not in wanted])


def _verify_host_key(cfg: ServerConfig, key: paramiko.PKey, known: HostKeys) -> None:
    """Return only if ``key`` may be trusted for ``cfg``'s host; otherwise raise HostKeyRejected
    (HostKeyRevoked for a revoked key) and leave known_hosts untouched."""
    path = known.path
    kind, blob = key.get_name(), key.asbytes()
    shown = f"{kind} {knownhosts.fingerprint(blob)}"
    revoked = known.revocation(blob)
    if revoked is not None:
        # Checked first: a revocation wins over any line that lists the same key.
        raise HostKeyRevoked(f"host key {shown} is marked @revoked in {path} (line {revoked.line}); "
                             f"refusing to connect", server=cfg.display)
    if known.find(blob) is not None:
        return
    same_type = [k for k in known.keys if k.key_type == kind]
    if same_type:
        raise HostKeyRejected(
            f"host key {shown} differs from the one recorded in {path} "
            f"({same_type[0].fingerprint}); refusing to connect (the key changed or someone is in between)",
            server=cfg.display)
    entry = _host_entry_name(cfg)
    add = f"ssh-keyscan -p {cfg.port} -t {kind} {cfg.host} >> {path}"
    if known.keys:
        # A server that suddenly shows a key of another type is what someone in between looks
        # like (a stripped or downgraded negotiation): never learned, even with auto-accept.
        raise HostKeyRejected(
            f"host key {shown} is not in {path}, which knows {entry} only by "
            f"{', '.join(known.types())}; refusing a new key type for a known host "
            f"(auto_accept_host_keys never adds one); if the server has a new key, add it ({add})",
            server=cfg.display)
    if known.authorities:
        # The operator meant the host to be vouched for by a CA, which cannot be checked here;
        # learning a key on first sight instead would quietly replace that with no check at all.
        raise HostKeyRejected(
            f"host key {shown} is not in {path}; {entry} is listed only by a @cert-authority line "
            f"(line {known.authorities[0].line}), and host certificates are not accepted: list the "
            f"host's own key ({add})", server=cfg.display)
    if not cfg.auto_accept_host_keys:
        raise HostKeyRejected(
            f"host key {shown} is not in {path}; add it ({add}) or set auto_accept_host_keys",
            server=cfg.display)
    if _remember_host_key(entry, kind, blob, path):
        log.warning("%s: learned host key %s for %s (auto_accept_host_keys), recorded in %s",
                    cfg.display, shown, entry, path)


def _remember_host_key(entry: str, kind: str, blob: bytes, path: Path) -> bool:
    """Append the key to known_hosts; False if an identical line was already there."""
    line = knownhosts.line_for(entry, kind, blob)
    with _known_hosts_lock:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                return False  # another session of this process recorded it a moment ago
            # One append of one short line: O_APPEND keeps concurrent writers' lines whole.
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            raise ConfigError(f"cannot record the host key: {exc.strerror}", file=str(path),
                              key="known_hosts") from None
    return True


# --------------------------------------------------------------------------- connecting


def _load_key(cfg: ServerConfig) -> paramiko.PKey | None:
    """The private key, or None without ``key_file``; ConfigError if it cannot be used, including
    when group or others may read or write it (unless ``allow_insecure_secret_files``)."""
    if cfg.key_file is None:
        return None
    path = cfg.key_file.expanduser()
    if not cfg.allow_insecure_secret_files:
        try:
            mode = path.stat().st_mode
        except OSError:
            pass  # reported below, by the load itself
        else:
            problem = open_secret_file_problem(path, mode)
            if problem is not None:
                raise ConfigError(problem, key=f"servers.{cfg.name}.key_file")
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise ConfigError("the key is passphrase-protected; ftpbc needs an unencrypted key file",
                          file=str(cfg.key_file), key="key_file") from None
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise ConfigError(f"cannot load the private key: {exc}", file=str(cfg.key_file),
                          key="key_file") from None


def _authenticate(cfg: ServerConfig, t: paramiko.Transport) -> None:
    key = _load_key(cfg)
    password = cfg.password_value()
    reasons: list[str] = []
    if key is not None:
        try:
            t.auth_publickey(cfg.user, key)
            return
        except paramiko.AuthenticationException:
            reasons.append(f"key {cfg.key_file} ({key.get_name()}) refused")
    if password:
        try:
            t.auth_password(cfg.user, password)
            return
        except paramiko.BadAuthenticationType:
            reasons.append("password login not allowed by the server")
        except paramiko.AuthenticationException:
            reasons.append("password refused")
    if not reasons:
        reasons.append("no key_file and no password configured")
    raise AuthenticationFailed(f"login as {cfg.user!r} failed: {'; '.join(reasons)}", server=cfg.display)


class _Watchdog:
    """Closes an SSH transport not connected and logged in within ``seconds``.

    paramiko bounds some steps of a connect and not others (opening the SFTP subsystem waits
    for the server's answer without a limit): closing the transport ends every wait at once.
    """

    def __init__(self, t: paramiko.Transport, seconds: float) -> None:
        self._t = t
        self._lock = threading.Lock()
        self._done = False
        #: the deadline passed and the transport was closed
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
        self._t.close()

    def disarm(self) -> bool:
        """Stop watching; False if the deadline had passed (the transport is closed)."""
        self._timer.cancel()
        with self._lock:
            self._done = True
            return not self.fired


def _connect(cfg: ServerConfig, timeout: float) -> _Session:
    """Open one SSH connection, verify the host key, log in and start the SFTP channel, all
    within ``timeout``."""
    deadline = time.monotonic() + timeout
    known = _load_known(cfg)
    try:
        sock = socket.create_connection((cfg.host, cfg.port), timeout=timeout)
    except OSError as exc:
        raise translate_os_error(exc, server=cfg.display, connecting=True) from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = paramiko.Transport(sock)
    watchdog = _Watchdog(t, max(deadline - time.monotonic(), 0.001))
    try:
        t.banner_timeout = t.handshake_timeout = t.auth_timeout = timeout
        _prefer_known_key_types(t, known)
        t.start_client(timeout=timeout)
        _verify_host_key(cfg, t.get_remote_server_key(), known)
        _authenticate(cfg, t)
        chan = t.open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.invoke_subsystem("sftp")
        client = _Client(chan, timeout)
        if not watchdog.disarm():
            raise EOFError("closed at the connect deadline")
        return _Session(t, client)
    except BaseException as exc:
        watchdog.disarm()
        t.close()
        sock.close()
        if watchdog.fired and not isinstance(exc, ConfigError):
            # Whatever the step reported (a closed channel, a refused login...), the cause is
            # the connection closed at the deadline.
            raise ConnectFailed(f"timed out while connecting: connecting and logging in took more "
                                f"than {timeout:g} s", server=cfg.display) from exc
        if isinstance(exc, TransportError | ConfigError):
            raise
        if isinstance(exc, OSError | EOFError):
            raise translate_os_error(exc, server=cfg.display, connecting=True) from exc
        if isinstance(exc, paramiko.SSHException | SFTPError):
            raise ConnectFailed(f"SSH negotiation failed: {exc}", server=cfg.display) from exc
        raise


def _healthy(session: _Session, idle_for: float) -> bool:
    if not session.ssh.is_active() or session.sftp.sock.closed:
        return False
    if idle_for > PROBE_AFTER:
        # A firewall may have dropped a long-idle connection without either end noticing.
        session.sftp.sock.settimeout(5.0)
        session.sftp.limit = 5.0
        session.sftp.normalize(".")
    return True


def _close(session: _Session) -> None:
    session.close()


# --------------------------------------------------------------------------- the transport


class SFTPTransport(Transport):
    """Transport over SFTP.  Thread-safe; see the module docstring for what it guarantees."""

    #: Use ``posix-rename@openssh.com`` when the server offers it.  Set False to force the
    #: portable remove-then-rename path (for a server whose extension misbehaves, and for tests).
    use_posix_rename: bool = True

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.server = cfg.display
        self._base = normalize(cfg.base).rstrip("/")
        #: listed names refused and logged already (each once, not once per poll)
        self._reported = LoggedOnce(REPORTED_NAMES)
        self._pool: Pool[_Session] = Pool(
            connect=lambda timeout: _connect(cfg, timeout), check=_healthy, close=_close,
            size=cfg.pool_size, server=cfg.display, default_timeout=cfg.timeout)

    def __repr__(self) -> str:
        return f"SFTPTransport({self.server}{self._base or '/'})"

    # ------------------------------------------------------------------ plumbing

    def _remote(self, path: str) -> str:
        return self._base + normalize(path) if self._base else normalize(path)

    def _guard(self) -> RateGuard | None:
        """The minimum-rate check for one transfer, None when it is off."""
        if self.cfg.min_transfer_rate <= 0:
            return None
        return RateGuard(self.cfg.min_transfer_rate, self.cfg.min_rate_window)

    def _mapped(self, path: str, progress: Progress) -> _Mapped:
        return _Mapped(self.server, path, progress)

    def _run(self, path: str, op: Callable[[_Client], T], timeout: float | None, *,
             repeatable: bool = False, rewind: Callable[[], None] | None = None) -> T:
        """Run ``op`` on a pooled session; once more on a fresh one if nothing had been sent.

        A ``repeatable`` operation (one whose repetition has the same effect: list, stat, mkdir,
        a put or get whose stream ``rewind`` can reset) is also repeated after OutcomeUnknown,
        the usual result of a connection dropped mid-operation.  Renames and deletes are not:
        a lost reply to them must reach the caller, which decides from the server's state.
        """
        limit = self.cfg.timeout if timeout is None else timeout
        for attempt in (1, 2):
            try:
                with self._pool.session(limit) as s:
                    client = s.sftp
                    client.progress.sent = False
                    client.limit = limit
                    if client.sock.gettimeout() != limit:  # settimeout is a system call
                        client.sock.settimeout(limit)
                    with self._mapped(path, client.progress):
                        return op(client)
            except ConnectionLost:
                if attempt == 2:
                    raise
            except OutcomeUnknown:
                if attempt == 2 or not repeatable:
                    raise
            if rewind is not None:
                rewind()
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ operations

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        remote = self._remote(path)

        def op(c: _Client) -> list[Entry]:
            return [_entry(a.filename, a) for a in _listdir(c, remote, self.cfg.max_listing_entries,
                                                            self.server, self._reported)]

        return self._run(path, op, timeout, repeatable=True)

    def scan(self, path: str, visit: Visit, *, glob: str | None = None, refuse_dirs: bool = False,
             refused: builtins.list[Refused] | None = None, timeout: float | None = None) -> bool:
        """Streamed, READDIR reply by READDIR reply; SFTP has no globs, so ``glob`` is applied
        here (the server still sends every name)."""
        remote = self._remote(path)

        def one(a: paramiko.SFTPAttributes) -> bool:
            return (glob is not None and not fnmatchcase(a.filename, glob)) or visit(_entry(a.filename, a))

        return self._run(path, lambda c: _readdir(c, remote, self.cfg.max_listing_entries, self.server, one,
                                                  self._reported),
                         timeout, repeatable=True)

    def stat(self, path: str, *, timeout: float | None = None) -> Entry:
        remote = self._remote(path)
        return self._run(path, lambda c: _entry(posixpath.basename(remote), c.stat(remote)), timeout,
                         repeatable=True)

    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        remote = self._remote(path)

        def op(c: _Client) -> int:
            kind, msg = c._request(CMD_OPEN, remote, _WRITE_FLAGS, paramiko.SFTPAttributes())  # type: ignore[attr-defined]
            if kind != CMD_HANDLE:
                raise SFTPError(f"expected a HANDLE reply to OPEN, got packet type {kind}")
            handle = msg.get_binary()
            c.guard = self._guard()
            try:
                return _PipelinedWriter(c, handle).write_and_close(stream)
            except _Status as exc:
                raise _status_error(exc, server=self.server, path=path, prefix="write failed: ") from None
            finally:
                c.guard = None

        start = stream_position(stream)

        def rewind_source() -> None:
            assert start is not None
            stream.seek(start)

        return self._run(path, op, timeout, repeatable=start is not None,
                         rewind=None if start is None else rewind_source)

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        remote = self._remote(path)

        def op(c: _Client) -> int:
            with c.open(remote, "rb") as fh:
                size = fh.stat().st_size or 0
                c.guard = self._guard()
                try:
                    return _PipelinedReader(c, cast(bytes, fh.handle)).copy(size, stream)
                except _BROKEN:
                    fh._closed = True  # type: ignore[attr-defined]  # the session is dropped: no CLOSE
                    raise
                finally:
                    c.guard = None

        start = stream_position(stream)

        def rewind() -> None:
            assert start is not None
            stream.seek(start)
            stream.truncate()

        return self._run(path, op, timeout, repeatable=start is not None,
                         rewind=None if start is None else rewind)

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        rsrc, rdst = self._remote(src), self._remote(dst)

        def op(c: _Client) -> None:
            try:
                if self.use_posix_rename and POSIX_RENAME in c.extensions:
                    c.posix_rename(rsrc, rdst)
                else:
                    self._plain_rename(c, rsrc, rdst)
            except _Status as exc:
                if not _exists(c, rsrc):
                    raise SourceGone("rename source is gone", server=self.server, path=src) from None
                raise _status_error(exc, server=self.server, path=dst,
                                    prefix=f"rename {src} -> {dst}: ") from None

        self._run(src, op, timeout)

    @staticmethod
    def _plain_rename(c: _Client, rsrc: str, rdst: str) -> None:
        # SFTPv3 RENAME refuses an existing target; the contract says replace it.  Removing it
        # first can lose the old target on a crash in between, never the file being moved.
        try:
            c.rename(rsrc, rdst)
        except _Status as exc:
            if exc.code == SFTP_NO_SUCH_FILE or not _exists(c, rdst) or not _exists(c, rsrc):
                raise
            c.remove(rdst)
            c.rename(rsrc, rdst)

    def delete(self, path: str, *, timeout: float | None = None) -> None:
        remote = self._remote(path)
        self._run(path, lambda c: c.remove(remote), timeout)

    def mkdir(self, path: str, *, timeout: float | None = None) -> None:
        remote = self._remote(path)

        def make(c: _Client, target: str) -> None:
            try:
                attrs = c.stat(target)
            except _Status as exc:
                if exc.code != SFTP_NO_SUCH_FILE:
                    raise
            else:
                if statmod.S_ISDIR(attrs.st_mode or 0):
                    return
                raise TransportError("exists and is not a directory", server=self.server,
                                     path=target[len(self._base):] or "/")
            parent = posixpath.dirname(target)
            if parent != target:
                make(c, parent)
            try:
                c.mkdir(target)
            except _Status:
                # Another node may have created it between our stat and mkdir.
                if not statmod.S_ISDIR(c.stat(target).st_mode or 0):
                    raise

        self._run(path, lambda c: make(c, remote), timeout, repeatable=True)

    def close(self) -> None:
        self._pool.close()

    # ------------------------------------------------------------------ introspection

    @property
    def connects(self) -> int:
        """SSH connections opened so far (for tests and metrics)."""
        return self._pool.connects


def _entry(name: str, attrs: paramiko.SFTPAttributes) -> Entry:
    mtime = datetime.fromtimestamp(attrs.st_mtime, UTC) if attrs.st_mtime is not None else None
    return Entry(name, attrs.st_size or 0, mtime, statmod.S_ISDIR(attrs.st_mode or 0))


def _exists(c: _Client, remote: str) -> bool:
    try:
        c.stat(remote)
    except _Status as exc:
        if exc.code == SFTP_NO_SUCH_FILE:
            return False
        raise
    return True


def _status_error(exc: _Status, *, server: str, path: str, prefix: str = "") -> TransportError:
    text = f"{prefix}{exc.text or 'failed'}"
    if exc.code == SFTP_NO_SUCH_FILE:
        return NotFound(text, server=server, path=path)
    if exc.code == SFTP_PERMISSION_DENIED:
        return PermissionDenied(text, server=server, path=path)
    if exc.code == SFTP_OP_UNSUPPORTED:
        return ProtocolError(f"server does not support the operation: {text}", server=server, path=path)
    return TransportError(text, server=server, path=path)


__all__ = ["SFTPTransport", "fingerprint"]


class _Mapped:
    """Library errors inside the block as TransportErrors naming the server and ``path``.

    A class, not a generator-based context manager: it wraps every remote command, and the
    generator cost several microseconds per command.
    """

    __slots__ = ("path", "progress", "server")

    def __init__(self, server: str, path: str, progress: Progress) -> None:
        self.server = server
        self.path = path
        self.progress = progress

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or isinstance(exc, TransportError):
            return
        server, path, sent = self.server, self.path, self.progress.sent
        if isinstance(exc, _Status):
            raise _status_error(exc, server=server, path=path) from None
        if isinstance(exc, OSError | EOFError):
            raise translate_os_error(exc, server=server, path=path, sent=sent) from exc
        if isinstance(exc, paramiko.SSHException):
            # paramiko reports a dropped connection as SSHException("Server connection dropped")
            raise translate_os_error(EOFError(str(exc)), server=server, path=path, sent=sent) from exc
        if isinstance(exc, SFTPError):
            raise ProtocolError(f"unexpected SFTP reply: {exc}", server=server, path=path) from exc
