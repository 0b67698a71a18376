"""Translate library exceptions into :mod:`ftpbc.errors` at a transport's boundary.

In the manner of httpcore's ``map_exceptions``: a transport wraps each remote step in one of the
context managers below, and whatever ``socket``, ``ssl``, ``ftplib`` or the OS raises leaves as a
:class:`~ftpbc.errors.TransportError` naming the server and the path.

The one distinction that matters to callers is *whether the command reached the server*.  A
transport records it in a :class:`Progress` (``progress.sent = True`` right after the command's
bytes were handed to the socket); a failure afterwards becomes
:class:`~ftpbc.errors.OutcomeUnknown` (the operation may have happened), before it
:class:`~ftpbc.errors.TransportTimeout` or :class:`~ftpbc.errors.ConnectionLost` (it did not).
While ``connecting=True`` (TCP connect, TLS handshake, login) every network failure is
:class:`~ftpbc.errors.ConnectFailed` or :class:`~ftpbc.errors.TLSFailed`.

Public API (stable; the SFTP transport reuses the first three):

* :class:`Progress` - the mutable "was it sent?" flag;
* :func:`translate_os_error` - one ``OSError``/``EOFError`` (timeouts, resets, refusals, TLS) to
  a TransportError;
* :func:`map_os_errors` - context manager applying :func:`translate_os_error`;
* :func:`translate_ftp_reply` / :func:`map_ftp_errors` - the same plus ``ftplib``'s reply errors;
* :class:`DeadlineExceeded`, :class:`BadReply` and :class:`RateGuard` - the bounds a transport
  puts on a peer (a reply's time and size, a transfer's rate), raised as library-level errors
  inside a mapped block so that they translate like any other timeout or protocol failure.

Messages carry the server's reply text, the server display name and the path; never a password
(no caller passes one, and FTP servers do not echo ``PASS``).
"""

from __future__ import annotations

import ftplib
import re
import socket
import ssl
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType

from ftpbc.errors import (
    AlreadyExists,
    AuthenticationFailed,
    ConnectFailed,
    ConnectionLost,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolError,
    ServerBusy,
    SessionLimit,
    TLSFailed,
    TransportError,
    TransportTimeout,
)


class DeadlineExceeded(TimeoutError):
    """One of ftpbc's own time bounds ran out (a reply not complete by its deadline, a transfer
    slower than the minimum rate).  A TimeoutError, so it translates like a socket timeout; its
    text says which bound, and the translated error carries it."""


class BadReply(ftplib.error_proto):
    """A control reply ftpbc refuses; its text says why (it becomes a ProtocolError)."""


class ReplyTooLong(BadReply):
    """A control reply (one line, or all lines of a multi-line reply) exceeded its size limit."""


class RateGuard:
    """Fails a transfer slower than ``rate`` bytes/s over a whole ``window`` of seconds.

    As curl's ``--speed-limit``/``--speed-time``: call :meth:`add` with each chunk's byte count
    as it is sent or received; once ``window`` seconds have passed since the window began, the
    bytes counted must be at least ``rate`` per second of it, or :class:`DeadlineExceeded` is
    raised; then a new window begins.  A transfer that stalls completely is caught by the socket
    timeout instead, which callers set to at most ``window`` (see :meth:`read_timeout`).
    """

    __slots__ = ("_bytes", "_start", "rate", "window")

    def __init__(self, rate: float, window: float) -> None:
        self.rate = rate
        self.window = window
        self._start = time.monotonic()
        self._bytes = 0

    def add(self, n: int) -> None:
        self._bytes += n
        now = time.monotonic()
        elapsed = now - self._start
        if elapsed < self.window:
            return
        if self._bytes < self.rate * elapsed:
            raise DeadlineExceeded(
                f"transfer slower than {self.rate:g} bytes/s over {self.window:g} s "
                f"({self._bytes} bytes in {elapsed:.1f} s)")
        self._start = now
        self._bytes = 0

    def read_timeout(self, timeout: float) -> float:
        """The socket timeout for one read or write of the transfer: at most the window."""
        return min(timeout, self.window)


@dataclass
class Progress:
    """Whether a state-changing command has been sent.  Set ``sent`` right after the send succeeds.

    Read-only commands (LIST, RETR, SIZE...) need not set it: losing their reply changes nothing
    on the server, so ConnectionLost/TransportTimeout describe the outcome exactly.
    """

    sent: bool = False


def translate_os_error(exc: BaseException, *, server: str, path: str = "", sent: bool = False,
                       connecting: bool = False) -> TransportError:
    """The TransportError for a network-level failure ``exc`` (OSError, EOFError, ssl errors).

    ``connecting``: the failure happened while establishing the session (connect, TLS, login).
    ``sent``: the command had been sent; its effect is therefore unknown.
    """
    detail = _describe(exc)
    if isinstance(exc, DeadlineExceeded):
        if connecting:
            return ConnectFailed(f"timed out while connecting: {exc}", server=server, path=path)
        if sent:
            return OutcomeUnknown(f"{exc}, after the command was sent: it may have taken effect",
                                  server=server, path=path)
        return TransportTimeout(f"{exc}; the operation did not take effect", server=server, path=path)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSFailed(f"TLS certificate verification failed: {exc.verify_message or detail}",
                         server=server, path=path)
    if connecting:
        if isinstance(exc, ssl.SSLError):
            return TLSFailed(f"TLS handshake failed: {detail}", server=server, path=path)
        if isinstance(exc, TimeoutError):
            return ConnectFailed("timed out while connecting", server=server, path=path)
        if isinstance(exc, socket.gaierror):
            return ConnectFailed(f"cannot resolve host: {detail}", server=server, path=path)
        if isinstance(exc, EOFError):
            return ConnectFailed("server closed the connection during login", server=server, path=path)
        return ConnectFailed(f"cannot connect: {detail}", server=server, path=path)
    if sent:
        if isinstance(exc, TimeoutError):
            return OutcomeUnknown("command sent but no reply within the timeout", server=server, path=path)
        return OutcomeUnknown(f"connection lost after the command was sent ({detail})",
                              server=server, path=path)
    # Nothing was sent that could change state (or only a read-only command was).
    if isinstance(exc, TimeoutError):
        return TransportTimeout("timed out; the operation did not take effect", server=server, path=path)
    return ConnectionLost(f"connection lost ({detail}); the operation did not take effect",
                          server=server, path=path)


def map_os_errors(server: str, path: str = "", *, progress: Progress | None = None,
                  connecting: bool = False) -> AbstractContextManager[None]:
    """Re-raise OSError/EOFError (socket, ssl, timeouts) inside the block as TransportErrors.

    ``progress.sent`` is read when the error happens, so the block can flip it half-way.
    TransportErrors raised inside pass through untouched.
    """
    return _Mapped(server, path, progress, connecting, ftp=False)


#: words of a session-limit refusal (ProFTPD MaxClientsPerHost, pure-ftpd -C, vsftpd max_per_ip)
_LIMIT_WORDS = re.compile(r"too many|maximum|\bmax\b|limit|already (connected|logged in)")

#: words of a login refused because the server requires TLS (ProFTPD and pyftpdlib: "550 SSL/TLS
#: required on the control channel", vsftpd: "530 Non-anonymous sessions must use encryption",
#: pure-ftpd: "421 Sorry, cleartext sessions are not accepted")
_TLS_WORDS = re.compile(r"\b(?:ssl|tls|encryption|cleartext)\b", re.IGNORECASE)


#: vsftpd's reply when the process behind a session failed (``500 OOPS: priv_sock_send_cmd``
#: while the server restarts, and the like): the session is gone, whatever the command was
_SESSION_DIED = re.compile(r"^500 OOPS:")
#: ...except an allocation that failed for the command's sake (a listing too large to hold),
#: which says something about the request, not about the session
_REFUSED_FOR_SIZE = re.compile(r"\bmalloc\b|\balloc", re.IGNORECASE)


def translate_ftp_reply(exc: ftplib.Error, *, server: str, path: str = "",
                        connecting: bool = False, sent: bool = True) -> TransportError:
    """The TransportError for an FTP error reply (``ftplib.error_perm``, ``error_temp``...).

    550 is "file unavailable": NotFound unless the text says permission, then PermissionDenied.
    Callers that know more (RNFR's 550 means SourceGone) catch the result and refine it.
    A reply saying the server's session died (vsftpd's ``500 OOPS:``) is a dropped session,
    not a refusal: ConnectionLost when no state-changing command was ``sent`` (it is retried
    like any dropped session), OutcomeUnknown when one was (the caller checks the server).
    """
    reply = str(exc).strip()
    code = reply[:3]
    low = reply.lower()
    if _SESSION_DIED.match(reply) and not _REFUSED_FOR_SIZE.search(reply):
        if connecting:
            return ConnectFailed(f"the server's session died during login: {reply}", server=server, path=path)
        if sent:
            return OutcomeUnknown(f"the server's session died after the command was sent: {reply}",
                                  server=server, path=path)
        return ConnectionLost(f"the server's session died; the operation did not take effect: {reply}",
                              server=server, path=path)
    if isinstance(exc, BadReply):
        return ProtocolError(reply, server=server, path=path)
    if isinstance(exc, ftplib.error_proto | ftplib.error_reply) or not code.isdigit():
        return ProtocolError(f"unexpected reply {reply!r}", server=server, path=path)
    if connecting and code[0] in "45" and _TLS_WORDS.search(reply):
        # Not a missing file, nor a dropped session to retry: every command would be refused
        # alike, so it is said once, as what it is.
        return TLSFailed(f"the server requires TLS (an ftps:// URL): {reply}", server=server, path=path)
    if connecting and code in ("421", "530") and _LIMIT_WORDS.search(low):
        return SessionLimit(f"server refuses more sessions: {reply}", server=server, path=path)
    if code in ("530", "331", "332") and connecting:
        return AuthenticationFailed(f"login refused: {reply}", server=server, path=path)
    if code == "421":
        return ConnectionLost(f"server closed the session: {reply}", server=server, path=path)
    if code in ("425", "450"):
        return ServerBusy(f"server busy, nothing done: {reply}", server=server, path=path)
    if code == "426":
        return OutcomeUnknown(f"transfer aborted: {reply}", server=server, path=path)
    if code in ("550", "553"):
        if "exist" in low and "not" not in low and "no such" not in low:
            return AlreadyExists(reply, server=server, path=path)
        if "permission" in low or "denied" in low or "not allowed" in low or code == "553":
            return PermissionDenied(reply, server=server, path=path)
        return NotFound(reply, server=server, path=path)
    if code in ("530", "532", "534", "535"):
        return PermissionDenied(reply, server=server, path=path)
    if code in ("500", "501", "502", "503", "504"):
        return ProtocolError(f"server rejected the command: {reply}", server=server, path=path)
    return TransportError(reply, server=server, path=path)


def map_ftp_errors(server: str, path: str = "", *, progress: Progress | None = None,
                   connecting: bool = False) -> AbstractContextManager[None]:
    """:func:`map_os_errors` plus ftplib's reply errors, for one FTP step."""
    return _Mapped(server, path, progress, connecting, ftp=True)


class _Mapped(AbstractContextManager[None]):
    """The context manager behind :func:`map_os_errors` and :func:`map_ftp_errors`.

    A class rather than a generator: it wraps every remote command, and a generator-based
    context manager (two of them, nested) cost several microseconds per command.
    """

    __slots__ = ("connecting", "ftp", "path", "progress", "server")

    def __init__(self, server: str, path: str, progress: Progress | None, connecting: bool, *,
                 ftp: bool) -> None:
        self.server = server
        self.path = path
        self.progress = progress
        self.connecting = connecting
        self.ftp = ftp

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        mapped = translated(exc, self.server, self.path, self.progress, connecting=self.connecting,
                            ftp=self.ftp)
        if mapped is not None:
            raise mapped from exc


def translated(exc: BaseException, server: str, path: str, progress: Progress | None, *,
               connecting: bool = False, ftp: bool = True) -> TransportError | None:
    """What :func:`map_ftp_errors` (``ftp``) or :func:`map_os_errors` raises for ``exc``
    instead of it; None for an exception that leaves as it is (a TransportError already, or
    not a library error).  For code that maps errors without a ``with`` block."""
    if isinstance(exc, TransportError):
        return None
    if isinstance(exc, OSError | EOFError):
        sent = progress.sent if progress is not None else False
        return translate_os_error(exc, server=server, path=path, sent=sent, connecting=connecting)
    if ftp and isinstance(exc, ftplib.Error):
        sent = progress.sent if progress is not None else False
        return translate_ftp_reply(exc, server=server, path=path, connecting=connecting, sent=sent)
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return text or type(exc).__name__
