"""A bounded, thread-safe pool of sessions (FTP control connections, SSH/SFTP clients...).

Connection setup is the dearest step of a remote transport (a login costs many times a command,
an SSH handshake most of all), so transports keep sessions open and share them between threads
through a :class:`Pool`.  The pool knows nothing about the protocol; the transport hands it
three callables:

``connect(timeout) -> S``
    open and log in one session, raising a :class:`~ftpbc.errors.TransportError` on failure;
``check(session, idle_seconds) -> bool``
    called before an idle session is handed out again: True if it is still usable.  It should be
    cheap for a session idle a short while (e.g. "has the server closed the socket?" with a
    zero-timeout ``select``) and may send a no-op (``NOOP``, ``stat(".")``) after a longer idle;
``close(session)``
    release its resources; must not raise.

Use::

    pool = Pool(connect=..., check=..., close=..., size=4, server=cfg.display)
    with pool.session(timeout=10) as s:
        ...                          # an exception marks s broken when it says so (see below)
    pool.close()

Guarantees:

* at most ``size`` sessions exist at any time (idle plus in use); :meth:`acquire` waits up to
  ``timeout`` for one to free up, then raises :class:`~ftpbc.errors.TransportTimeout`;
* a session leaving :meth:`session` by a :class:`~ftpbc.errors.ConnectionLost`,
  :class:`~ftpbc.errors.OutcomeUnknown`, :class:`~ftpbc.errors.TransportTimeout` or
  :class:`~ftpbc.errors.ProtocolError` (or any non-ftpbc exception) is closed and discarded,
  because its protocol state is unknown; other TransportErrors (NotFound, SourceGone...) are
  ordinary answers and the session goes back to the pool;
* after a session was discarded as broken, the next connect is retried with exponential
  backoff (tenacity) on ConnectFailed/ConnectionLost/TransportTimeout, within the acquire
  timeout, to ride out a server restart.  A first connect is tried once, so a closed port fails
  fast.  Authentication and TLS failures are never retried;
* idle sessions are reused last-in first-out, so a burst's surplus sessions age and the
  health check weeds them out;
* a server that limits sessions per client (:class:`~ftpbc.errors.SessionLimit`) shrinks the pool
  to what it allows: operations then wait for a session instead of failing;
* an outage of a server this pool had reached is logged twice, whatever the number of threads
  and retries: its first failed connect at once (WARNING), and the connect that ends it
  ("reconnected after N s", WARNING too, so that whoever saw the first line sees the second).
  A server never reached is not logged here: the caller reports that error (a command's one
  line, a node's start-up that waits for its servers).

Not guaranteed: the pool does not retry *operations*; that is the transport's decision, because
only it knows which operations are safe to repeat.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from ftpbc.errors import (
    ConnectFailed,
    ConnectionLost,
    FtpbcError,
    OutcomeUnknown,
    ProtocolError,
    SessionLimit,
    TransportError,
    TransportTimeout,
)

S = TypeVar("S")

log = logging.getLogger("ftpbc.pool")

#: every pool of this process, so one starved by a server's session limit can ask its siblings
_POOLS: weakref.WeakSet[Pool[Any]] = weakref.WeakSet()

#: errors after which a session's protocol state is unknown: it must not be reused
BROKEN_ERRORS: tuple[type[TransportError], ...] = (ConnectionLost, OutcomeUnknown, TransportTimeout,
                                                   ProtocolError)
#: connect errors worth retrying after a drop (the server may be restarting)
RETRYABLE_CONNECT_ERRORS: tuple[type[TransportError], ...] = (ConnectFailed, ConnectionLost,
                                                              TransportTimeout)


def breaks_session(exc: BaseException) -> bool:
    """Whether a session that raised ``exc`` must be closed rather than reused: its protocol
    state is unknown after one of BROKEN_ERRORS, or after anything that is not ftpbc's own."""
    return isinstance(exc, BROKEN_ERRORS) or not isinstance(exc, FtpbcError)


class Pool(Generic[S]):
    """Up to ``size`` sessions of type ``S``, shared between threads.  See the module docstring."""

    def __init__(self, *, connect: Callable[[float], S], check: Callable[[S, float], bool],
                 close: Callable[[S], None], size: int, server: str,
                 default_timeout: float = 30.0) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self._connect = connect
        self._check = check
        self._close = close
        self.size = size
        self.server = server
        self.default_timeout = default_timeout
        # One plain lock guards the count of sessions in use and the idle list; a thread waits on
        # the condition only when all ``size`` are in use: a BoundedSemaphore plus a lock would
        # cost several times as much in Python code, and every remote command pays it.
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._in_use = 0
        self._waiting = 0
        self._idle: list[tuple[S, float]] = []  # (session, monotonic time it was released)
        self._dropped = False
        self._closed = False
        #: sessions opened so far (for tests and metrics)
        self.connects = 0
        #: monotonic time of the first failed connect of the current outage (None: no outage)
        self._down_since: float | None = None
        self._failed_connects = 0
        _POOLS.add(self)

    # ------------------------------------------------------------------ public API

    def session(self, timeout: float | None = None) -> _Lease[S]:
        """A session for the duration of the ``with`` block; released (or discarded if broken) after."""
        return _Lease(self, timeout)

    def acquire(self, timeout: float | None = None) -> S:
        """Take an idle healthy session or open a new one; wait at most ``timeout`` seconds.

        A server that refuses another session (:class:`~ftpbc.errors.SessionLimit`) shrinks the
        pool to the sessions open now, and the caller waits for one of them; with none open
        (other processes hold the server's sessions), it retries with backoff until ``timeout``.
        """
        timeout = self.default_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pause = 0.05
        while True:
            try:
                return self._acquire(timeout, deadline)
            except SessionLimit as exc:
                if not self._shrink(exc, deadline, pause):
                    raise
                pause = min(pause * 2, 2.0)

    def _shrink(self, exc: SessionLimit, deadline: float, pause: float) -> bool:
        """After a refused session: True to try again (the pool shrank, or after a pause)."""
        with self._lock:
            open_now = self._in_use + len(self._idle)
            if open_now >= 1:
                if open_now < self.size:
                    log.warning("%s allows %d session(s) from here; pool shrunk from %d (%s)",
                                self.server, open_now, self.size, exc)
                    self.size = open_now
                return time.monotonic() < deadline
        # None open here: other pools hold the server's sessions.  Those of this process give
        # their idle ones back (a node and a client in one process share a per-host limit).
        for sibling in list(_POOLS):
            if sibling is not self and sibling.server == self.server:
                sibling.discard_idle()
        remaining = deadline - time.monotonic()
        if remaining <= pause:
            return False
        time.sleep(pause)  # other processes hold the server's sessions: wait for one to go
        return True

    def _acquire(self, timeout: float, deadline: float) -> S:
        with self._lock:
            if self._closed:
                raise ConnectionLost("transport is closed", server=self.server)
            while self._in_use >= self.size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportTimeout(f"no free connection among {self.size} within {timeout:g} s",
                                           server=self.server)
                self._waiting += 1
                try:
                    self._freed.wait(remaining)
                finally:
                    self._waiting -= 1
            self._in_use += 1
            idle = self._idle.pop() if self._idle else None
        try:
            while idle is not None:
                s, since = idle
                if self._healthy(s, time.monotonic() - since):
                    return s
                self._dropped = True
                self._safe_close(s)
                idle = self._pop_idle()
            return self._open(deadline)
        except BaseException:
            self._give_back(None)
            raise

    def release(self, session: S, *, broken: bool = False) -> None:
        """Give ``session`` back; ``broken=True`` closes it instead (its state is unknown)."""
        if broken or self._closed:
            if broken:
                self._dropped = True
            try:
                self._safe_close(session)
            finally:
                self._give_back(None)
        else:
            self._give_back(session)

    def discard_idle(self) -> None:
        """Close every idle session (e.g. after the server was restarted on purpose)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for s, _ in idle:
            self._safe_close(s)

    def close(self) -> None:
        """Close idle sessions now and in-use ones when released; later acquires fail."""
        self._closed = True
        self.discard_idle()

    @property
    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    # ------------------------------------------------------------------ internals

    def _pop_idle(self) -> tuple[S, float] | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, session: S | None) -> None:
        """One session fewer in use; ``session`` (if any) goes back to the idle list."""
        with self._lock:
            if session is not None:
                self._idle.append((session, time.monotonic()))
            self._in_use -= 1
            if self._waiting:
                self._freed.notify()

    def _healthy(self, s: S, idle_for: float) -> bool:
        try:
            return self._check(s, idle_for)
        except Exception:
            return False  # a check that fails for any reason means "do not reuse"

    def _open(self, deadline: float) -> S:
        remaining = max(deadline - time.monotonic(), 0.001)
        if not self._dropped:
            s = self._connect_once(remaining)
        else:
            # After a drop the server may be restarting: back off and retry until the deadline.
            retrying = Retrying(
                retry=retry_if_exception_type(RETRYABLE_CONNECT_ERRORS),
                stop=stop_after_delay(remaining),
                wait=wait_exponential(multiplier=0.05, max=2.0),
                reraise=True,
            )
            s = retrying(lambda: self._connect_once(max(deadline - time.monotonic(), 0.001)))
        self._dropped = False
        self.connects += 1
        return s

    def _connect_once(self, timeout: float) -> S:
        """One connect, logging where an outage begins and where it ends (once each)."""
        try:
            s = self._connect(timeout)
        except SessionLimit:
            raise  # the server is up and answering: not an outage
        except TransportError as exc:
            if not self.connects:
                raise  # never reached: the caller's error to report (see the module docstring)
            with self._lock:
                self._failed_connects += 1
                first = self._down_since is None
                if first:
                    self._down_since = time.monotonic()
            if first:
                log.warning("%s: cannot connect: %s (next failures not logged until it reconnects)",
                            self.server, exc)
            else:
                log.debug("%s: cannot connect again: %s", self.server, exc)
            raise
        if self._down_since is not None:  # unlocked peek: the common case costs nothing
            with self._lock:
                since, failures = self._down_since, self._failed_connects
                self._down_since, self._failed_connects = None, 0
            if since is not None:
                log.warning("%s: reconnected after %.1f s (%d failed connect(s))", self.server,
                            time.monotonic() - since, failures)
        return s

    def _safe_close(self, s: S) -> None:
        try:
            self._close(s)
        except Exception:
            pass  # closing a dead session may fail; there is nothing left to release


class _Lease(Generic[S]):
    """What :meth:`Pool.session` returns: a class, not a generator, because it wraps every remote
    command and a generator-based context manager cost several microseconds per use."""

    __slots__ = ("_pool", "_session", "_timeout")

    def __init__(self, pool: Pool[S], timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout

    def __enter__(self) -> S:
        self._session = self._pool.acquire(self._timeout)
        return self._session

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self._pool.release(self._session)
        else:
            self._pool.release(self._session, broken=breaks_session(exc))
