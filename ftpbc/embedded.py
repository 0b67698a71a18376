"""An FTP or FTPS server inside this process (pyftpdlib), for tests, the demo and ``ftpbc ftpd``.

    with EmbeddedFTPServer(root, user="app", password="s3cret") as srv:
        cfg = ServerConfig.from_url(srv.url, password="s3cret")

Guarantees: the server listens on ``host:port`` (port 0 picks a free one; :attr:`port` tells
which) once :meth:`start` returns, serves from a background thread, and is gone (listening
socket and every client connection closed, thread joined) once :meth:`stop` returns.  Passive
data ports come from a window below 32768, because inside the kernel's ephemeral range a port
held in TIME_WAIT makes passive binds fail (docs/servers.md); if the whole window is busy
pyftpdlib falls back to a kernel-assigned port.  With ``certfile`` it is an FTPS server (explicit
``AUTH TLS``, or TLS from the first byte with ``implicit_tls=True``) that requires TLS on the
control connection before login and on every data connection (``PROT P``).  The user may do what
ftpbc does and no more: no ``SITE CHMOD``.

Not guaranteed: this is a single-user test and demo server; it is not hardened for the internet
(pyftpdlib's 3 s delay after a failed login is kept by default, nothing more).

Concurrency model: pyftpdlib's default ``FTPServer``, every session on one asynchronous loop
(:class:`EventLoop`: pyftpdlib's, made never to hand one connection's event to another).
``ThreadedFTPServer`` starts a thread per login and its threads contend for the GIL, so it serves
fewer short sessions a second, and fewer still with more clients: it is not offered.
"""

from __future__ import annotations

import logging
import random
import select
import socket
import threading
from pathlib import Path
from typing import Any

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler, TLS_FTPHandler
from pyftpdlib.ioloop import IOLoop
from pyftpdlib.servers import FTPServer

#: passive ports are drawn from a window of this size placed at random in PASSIVE_RANGE
PASSIVE_WINDOW = 400
PASSIVE_RANGE = (20000, 32000)
#: the rights ftpbc needs: cwd, list, retrieve, append, delete, rename, mkdir, store, set mtime.
#: Not ``M`` (SITE CHMOD): ftpbc never changes modes, and a client that could would make the
#: served root, and everything the node user owns below it, writable by every local user.
USER_PERMS = "elradfmwT"


#: whether pyftpdlib's loop here is its epoll loop (the one EventLoop changes)
_EPOLL_LOOP = hasattr(select, "epoll") and getattr(IOLoop, "_poller", None) is select.epoll


class EventLoop(IOLoop):  # type: ignore[valid-type,misc]
    """pyftpdlib's event loop (epoll on Linux), minus a window in which one connection's
    event is handled as another's.

    One round of pyftpdlib's loop handles the events one ``epoll_wait`` returned, looking each
    handler up by its file descriptor as it goes.  A handler closed by an earlier event of the
    round frees its descriptor number, and a connection accepted later in the same round may get
    that number; the closed socket's event, still in the round's list, then reaches the new
    handler.  A hang-up (a client killed while the server sent it a file) reaching a data
    connection that an upload had just opened ends the upload at once: ``226 Transfer complete``
    for an empty file, the body still unread.

    Guaranteed here: an event reaches only the handler that held its descriptor when the round
    was polled; one whose handler was closed or replaced meanwhile is dropped.  Nothing is lost:
    epoll is level-triggered, so the new socket's own readiness is reported by the next round.
    Only the epoll loop is changed; pyftpdlib's other loops (BSD, Solaris, select) keep theirs.
    """

    def poll(self, timeout: float | None) -> None:
        if not _EPOLL_LOOP:
            super().poll(timeout)
            return
        try:
            events = self._poller.poll(-1 if timeout is None else timeout)
        except InterruptedError:
            return
        handlers = self.socket_map
        # Whose each event is, taken before any is handled: handling one may close another's
        # handler and hand its descriptor number to a new connection.
        polled = [(fd, event, handlers.get(fd)) for fd, event in events]
        for fd, event, handler in polled:
            if handler is None or handlers.get(fd) is not handler:
                continue
            if event & self._ERROR and not event & self.READ:
                handler.handle_close()
                continue
            if event & self.READ and handler.readable():
                _dispatch(handler, handler.handle_read_event)
            if event & self.WRITE and handler.writable():
                _dispatch(handler, handler.handle_write_event)


def _dispatch(handler: Any, step: Any) -> None:
    """One event's step, as pyftpdlib runs it: a failure goes to the handler's own handle_error."""
    try:
        step()
    except Exception:
        handler.handle_error()


class EmbeddedFTPServer:
    """One pyftpdlib server bound to ``host:port`` serving ``root`` to one user."""

    def __init__(self, root: str | Path, *, password: str, user: str = "ftpbc",
                 host: str = "127.0.0.1", port: int = 0, certfile: str | Path | None = None,
                 keyfile: str | Path | None = None, implicit_tls: bool = False,
                 passive_ports: range | None = None,
                 auth_failed_delay: float = 3.0, masquerade_address: str | None = None,
                 disabled_commands: tuple[str, ...] = (), quiet: bool = True) -> None:
        if implicit_tls and certfile is None:
            raise ValueError("implicit_tls needs a certfile")
        self.root = Path(root)
        self.user = user
        self.host = host
        self.port = port
        self.certfile = Path(certfile) if certfile else None
        self.keyfile = Path(keyfile) if keyfile else None
        self.implicit_tls = implicit_tls
        if passive_ports is None:
            start = random.randrange(PASSIVE_RANGE[0], PASSIVE_RANGE[1] - PASSIVE_WINDOW)
            passive_ports = range(start, start + PASSIVE_WINDOW)
        self.passive_ports = passive_ports
        self._password = password
        self._handler = self._handler_class(auth_failed_delay, masquerade_address, disabled_commands)
        self._server: FTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._clients: set[Any] = set()
        self._clients_lock = threading.Lock()
        if quiet:
            # pyftpdlib logs every command at INFO, and installs a stderr handler of its own
            # unless the logger has one: thousands of lines per test run help nobody.
            pylog = logging.getLogger("pyftpdlib")
            pylog.setLevel(logging.WARNING)
            if not pylog.handlers:
                pylog.addHandler(logging.NullHandler())

    # ------------------------------------------------------------------ public API

    @property
    def url(self) -> str:
        """``ftp://user@host:port/`` (``ftps://`` with a certificate); never the password."""
        scheme = "ftps" if self.certfile else "ftp"
        return f"{scheme}://{self.user}@{self.host}:{self.port}/"

    def start(self) -> EmbeddedFTPServer:
        """Bind and serve from a daemon thread; returns once the port accepts connections."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        # An IOLoop of its own: pyftpdlib's default is a process-wide singleton, and two servers
        # polling one loop from two threads corrupt each other (OpenSSL crashed in a handshake).
        self._server = FTPServer((self.host, self.port), self._handler, ioloop=EventLoop())
        self.port = int(self._server.socket.getsockname()[1])
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name=f"ftpd-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every session; wait for the serving thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        self._server = None

    def restart(self) -> None:
        """Stop, then serve again on the same port (clients must reconnect)."""
        self.stop()
        self.start()

    def drop_connections(self) -> int:
        """Close every client control connection from the server side; return how many.

        ``shutdown`` on the raw socket is safe from any thread: the session's own loop then
        sees end-of-file and cleans up, as it would after a network failure.
        """
        with self._clients_lock:
            clients = list(self._clients)
        for handler in clients:
            try:
                handler.raw_socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closing
        return len(clients)

    @property
    def handler_class(self) -> type[FTPHandler]:
        """The pyftpdlib handler class of this server's sessions.

        Tests patch commands on it (before or while serving) to inject faults, such as a reply
        that never comes; every server has its own class, so patches stay local to it.
        """
        return self._handler

    @property
    def connection_count(self) -> int:
        """Client control connections currently open."""
        with self._clients_lock:
            return len(self._clients)

    def __enter__(self) -> EmbeddedFTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _serve(self) -> None:
        server = self._server
        assert server is not None
        try:
            while not self._stop.is_set():
                # Non-blocking rounds so that stop() is noticed within one poll timeout.
                server.ioloop.loop(0.05, blocking=False)
        finally:
            server.close_all()

    def _handler_class(self, auth_failed_delay: float, masquerade_address: str | None,
                       disabled_commands: tuple[str, ...]) -> type[FTPHandler]:
        authorizer = DummyAuthorizer()
        authorizer.add_user(self.user, self._password, str(self.root), perm=USER_PERMS)
        base: type[FTPHandler] = TLS_FTPHandler if self.certfile else FTPHandler
        embedded = self
        implicit = self.implicit_tls

        class Handler(base):  # type: ignore[valid-type,misc]
            def __init__(self, conn: socket.socket, server: Any, ioloop: Any = None) -> None:
                # Kept before TLS wraps it: drop_connections() needs the plain socket.
                self.raw_socket = conn
                super().__init__(conn, server, ioloop)

            def handle(self) -> None:
                if implicit:
                    # Implicit FTPS: the TLS handshake comes before the 220 banner.
                    self.secure_connection(self.ssl_context)
                super().handle()

            def on_connect(self) -> None:
                with embedded._clients_lock:
                    embedded._clients.add(self)

            def on_disconnect(self) -> None:
                with embedded._clients_lock:
                    embedded._clients.discard(self)

        Handler.authorizer = authorizer
        Handler.banner = "ftpbc embedded FTP server ready."
        Handler.passive_ports = self.passive_ports
        Handler.auth_failed_timeout = auth_failed_delay
        Handler.masquerade_address = masquerade_address
        Handler.proto_cmds = {k: v for k, v in base.proto_cmds.items() if k not in disabled_commands}
        if self.certfile:
            # With a certificate, TLS is not optional: USER/PASS are refused (550) before AUTH TLS,
            # and PASV/EPSV before PROT P, so neither the password nor a file travels in clear.
            Handler.tls_control_required = True
            Handler.tls_data_required = True
            Handler.certfile = str(self.certfile)
            Handler.keyfile = str(self.keyfile) if self.keyfile else None
            Handler.ssl_context = None  # built per class from certfile/keyfile on first use
        return Handler
