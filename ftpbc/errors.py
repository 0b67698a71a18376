"""Every exception ftpbc raises, in one short hierarchy.

Low-level errors (``ftplib.error_perm``, ``socket.timeout``, ``paramiko.SSHException``,
``OSError``...) never escape a transport: each implementation translates them at its boundary
(see ``ftpbc.transport.errormap``) into one of the classes below, so the protocol code above the
transport reasons about *what happened*, not about which library said it.

Two properties hold for every message built here:

* it names the server (``scheme://user@host:port``, never a password) and the path involved;
* it says whether the operation may have happened.  :class:`OutcomeUnknown` is reserved for a
  command that was sent but whose reply never arrived: a lost reply to ``RNTO`` must not be taken
  for a failure, because the file may already have moved.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists", "AuthenticationFailed", "ConfigError", "ConnectFailed", "ConnectionLost",
    "FtpbcError", "HostKeyRejected", "HostKeyRevoked", "IncompleteRead", "JournalError",
    "MessageTooLarge", "MissingDependency", "NotFound", "OutcomeUnknown", "PatternError",
    "PermissionDenied", "ProtocolError", "QueueFull", "ReadPastSize", "RemoteHandlerError",
    "RequestExpired", "RequestTimeout", "SelectorError", "SequenceError", "ServerBusy", "SessionLimit",
    "SourceGone", "TLSFailed", "TransportError", "TransportTimeout", "UnknownRequest", "UnsafeEntry",
    "UnsafeNameError", "UnsafeSource",
]


class FtpbcError(Exception):
    """Base class of every error ftpbc raises on purpose."""


# --------------------------------------------------------------------------- configuration


class ConfigError(FtpbcError):
    """A configuration file or value is invalid.

    ``str(err)`` is one line naming the file, the line and the key path when they are known,
    e.g. ``ftpbc.yaml:14: endpoints.quote.poll_interval: expected a number, got 'fast'``.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.reason = message
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        what = f"{key}: " if key else ""
        super().__init__(f"{where}{what}{message}")


class PatternError(ConfigError):
    """A file-name pattern is malformed; the message names the pattern and the column."""

    def __init__(self, pattern: str, column: int, expected: str) -> None:
        self.pattern = pattern
        self.column = column
        super().__init__(f"pattern {pattern!r}, column {column}: {expected}")


class SelectorError(ConfigError):
    """A message selector is malformed; the message names the selector and the column (1-based)."""

    def __init__(self, selector: str, column: int, problem: str) -> None:
        self.selector = selector
        self.column = column
        self.problem = problem
        super().__init__(f"selector {selector!r}, column {column}: {problem}")


class UnsafeNameError(ConfigError):
    """A file name or path would escape its directory (``/``, ``..``, NUL, empty)."""


class SequenceError(FtpbcError):
    """A persisted sequence file is unreadable or does not hold a number."""


class JournalError(FtpbcError):
    """The journal cannot be written or read; the node must not go on without it."""


# --------------------------------------------------------------------------- transport


class TransportError(FtpbcError):
    """A remote operation failed.  ``server`` and ``path`` say where.

    ``may_have_happened`` is False for every subclass except :class:`OutcomeUnknown`: when it is
    False the server did not apply the operation (it refused it, or it was never sent).
    """

    may_have_happened = False

    def __init__(self, message: str, *, server: str = "", path: str = "") -> None:
        self.server = server
        self.path = path
        self.reason = message
        parts = [p for p in (server, path) if p]
        where = " ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)


class NotFound(TransportError):
    """The path does not exist."""


class SourceGone(NotFound):
    """A rename's source no longer exists: typically a competing consumer claimed it first.

    This is the normal outcome of losing a claim race and should be handled quietly.
    """


class AlreadyExists(TransportError):
    """The target exists and the operation does not replace it."""


class PermissionDenied(TransportError):
    """The server refused the operation for lack of rights."""


class AuthenticationFailed(TransportError):
    """Login was refused (wrong user, password or key)."""


class HostKeyRejected(AuthenticationFailed):
    """The SFTP server's host key is not in known_hosts (or differs from it)."""


class HostKeyRevoked(HostKeyRejected):
    """The SFTP server presented a key that known_hosts marks ``@revoked``: refused whatever
    else the file says about it."""


class TLSFailed(TransportError):
    """The TLS handshake or certificate verification failed."""


class ConnectFailed(TransportError):
    """No connection could be established (refused, unreachable, DNS)."""


class SessionLimit(ConnectFailed):
    """The server refuses another session from this client (a per-host or per-user limit, e.g.
    ``421 Too many connections`` or ``530 ... maximum number of clients``): not a wrong password.
    A transport's pool shrinks to the sessions the server allows and waits for one of them."""


class ConnectionLost(TransportError):
    """The connection dropped before the command was sent; the operation did not happen."""


class ServerBusy(ConnectionLost):
    """A transient refusal that provably did nothing (``425`` no data connection, ``450`` file
    busy): the operation did not happen and is retried with backoff."""


class TransportTimeout(TransportError):
    """The server did not answer in time before the command took effect."""


class OutcomeUnknown(TransportError):
    """The command was sent but no reply came: the operation may or may not have happened.

    Callers must find out from the server's state (does the target exist?) before acting.
    """

    may_have_happened = True


class ProtocolError(TransportError):
    """The server answered something this client cannot interpret."""


class IncompleteRead(TransportError):
    """A read ended with a byte count other than the size the listing gave.

    The server reported success, so the transfer looked complete; a message in a box never
    changes size, so the data cannot be trusted.  Nothing was changed on the server.
    """


class ReadPastSize(IncompleteRead, ProtocolError):
    """A read went on past the size the listing gave (plus a small margin) and was stopped there.

    An :class:`IncompleteRead` (the data cannot be trusted, nothing changed on the server) that
    is also a :class:`ProtocolError`: the transfer was cut in the middle, so the session that
    carried it is dropped, never reused.
    """


# --------------------------------------------------------------------------- messaging


class MessageTooLarge(FtpbcError):
    """A message body is larger than ``max_message_bytes``: refused before it is sent, or filed
    in the error directory unread when a listing shows it that large."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(f"{what}: {size} bytes is more than max_message_bytes ({limit})")


class RequestTimeout(FtpbcError):
    """No response arrived within the request's timeout."""

    def __init__(self, endpoint: str, request_file: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.request_file = request_file
        self.timeout = timeout
        super().__init__(f"endpoint {endpoint!r}: no response to {request_file} within {timeout:g} s")


class RequestExpired(FtpbcError):
    """The request expired (its ttl ran out) before a provider served it; a provider that found
    it so sent this answer instead of calling its handler.  ``ftpbc request`` exits 5."""

    exit_code = 5

    def __init__(self, endpoint: str, request: str, reason: str) -> None:
        self.endpoint = endpoint
        self.request = request
        self.reason = reason
        super().__init__(f"endpoint {endpoint!r}: request {request} expired unserved: {reason}")


class QueueFull(FtpbcError):
    """A send found the endpoint's inbox at its bound (``max_messages`` or ``max_bytes``,
    docs/queues.md).  With ``on_overflow: reject`` nothing was staged, journaled or sent; with
    ``on_overflow: dead_letter`` a request was filed as a dead letter at ``filed`` instead (its
    caller is told at once rather than left waiting for a reply that cannot come).
    ``ftpbc send`` and ``ftpbc request`` exit 6."""

    exit_code = 6

    def __init__(self, endpoint: str, limit: str, bound: int, messages: int, waiting_bytes: int,
                 size: int | None, *, filed: str | None = None) -> None:
        self.endpoint = endpoint
        self.limit = limit  # "max_messages" or "max_bytes"
        self.bound = bound
        self.messages = messages
        self.waiting_bytes = waiting_bytes
        self.size = size
        self.filed = filed
        this = f" and this message has {size} bytes" if limit == "max_bytes" and size is not None else ""
        outcome = f"filed as a dead letter: {filed}" if filed else "the message was not sent"
        super().__init__(f"endpoint {endpoint!r} is full: {messages} message(s) of {waiting_bytes} "
                         f"bytes waiting, {limit} is {bound}{this}; {outcome}")


class RemoteHandlerError(FtpbcError):
    """The request was answered with an error reply: its handler raised, or it was filed
    unserved (in the error directory or the dead letters: unreadable, too large, out of
    deliveries); ``reason`` is what the reply says."""

    def __init__(self, endpoint: str, request_file: str, reason: str) -> None:
        self.endpoint = endpoint
        self.request_file = request_file
        self.reason = reason
        super().__init__(f"endpoint {endpoint!r}: error reply to {request_file}: {reason}")


# --------------------------------------------------------------------------- hostile peers


class UnsafeEntry(NotFound):
    """A shared ``file://`` repository holds something ftpbc refuses to touch at the path: a
    symbolic link (as the entry itself or as a directory on the way to it, below the base
    directory), a fifo, a socket or a device.  Nothing was opened, read, written or followed.

    A :class:`NotFound`, because to the message lifecycle there is no message there: code that
    skips a file that vanished (a claim lost to another node, a response already collected)
    skips this one as well, rather than retrying it for ever.  The message says what was found.
    """


class UnsafeSource(UnsafeEntry, SourceGone):
    """A rename's source is an :class:`UnsafeEntry`; like a lost claim race, nothing was moved."""


# --------------------------------------------------------------------------- environment


class MissingDependency(FtpbcError):
    """Something a command needs is not installed here: an optional extra (``pip install
    'ftpbc[spark]'``) or a program (Java for Spark).  The message says what to install."""


class UnknownRequest(FtpbcError):
    """:meth:`ftpbc.Client.collect` of a request id with nothing to wait for: never sent (by this
    client, or still waiting in the exchange area), or its response already collected."""

    def __init__(self, endpoint: str, uuid: str, reason: str) -> None:
        self.endpoint = endpoint
        self.uuid = uuid
        self.reason = reason
        super().__init__(f"endpoint {endpoint!r}: request {uuid}: {reason}")
