"""Scripted misbehaving servers on loopback, for tests/test_hostile_transport.py.

:class:`HostileFTPServer` speaks just enough FTP to get a client to the step under test, then
misbehaves in the one way it was told to (``behaviour``):

``welcome``
    trickles its greeting ``220 ...`` one byte per ``interval``, never ending the line;
``feat``
    logs in normally, then answers FEAT with a multi-line reply that never ends, one line per
    ``interval``;
``feat_flood``
    the same, as fast as loopback goes (a few MiB at most, then it stalls);
``retr``
    logs in, and sends a RETR's (or a listing's) data one byte per ``interval``, for ever;
``retr_flood``
    logs in, and answers a RETR with ``FLOOD_RETR`` bytes (300 MiB) as fast as loopback goes,
    whatever size the file was listed with;
``dele``
    logs in, and trickles its reply to DELE one byte per ``interval``;
``auth_inject``
    answers AUTH TLS with its 234 reply followed, in the same clear-text packet, by a forged
    ``230 logged in``, then speaks TLS (with ``tls``, a certificate and its key);
``mlsd``
    advertises MLSD, and answers MLSD with ``listing`` (raw bytes: odd names, odd facts...);
``list``
    does not advertise MLSD, and answers LIST with ``listing``;

    both accept RNFR and RNTO (350, 250) and rename nothing, so a client can claim what it
    listed: what it claimed is in ``commands``;
``closed_pasv``
    answers PASV with a port nothing listens on, so every data connection is refused.

With ``pasv_host`` (a loopback address other than 127.0.0.1, such as 127.0.0.2), every PASV
reply names that host instead of the server's own, with a port on which the server listens on
127.0.0.1 as well as on ``pasv_host``: ``trapped`` counts the connections that followed the
reply to ``pasv_host``, ``data_connections`` those that came to the control host's address.

:class:`HostileSFTPServer` (SSH by paramiko in server mode, SFTP packets by hand) lets a client
log in with any password, then:

``subsystem``
    never answers the request to start the SFTP subsystem;
``version``
    starts it, and trickles its SFTP VERSION packet one byte per ``interval``;
``read``
    serves a 1 MiB file whose READ replies trickle one byte per ``interval``;
``listing``
    lists any directory as ``names`` (raw bytes: a path, a line break, bytes that are not
    UTF-8...), each a 5-byte file, in one READDIR reply, then end-of-directory.

:class:`RecordingProxy` forwards TCP connections to another server and records what clients
sent, to check what went over the wire in clear.

Both run on threads of their own; :meth:`stop` (or leaving the ``with`` block) closes every
socket they hold and joins every thread, which also unblocks a client stuck reading from them.
"""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import paramiko

#: how much ``feat_flood`` sends before it stalls (a client without a reply limit buffers it all)
FLOOD_LIMIT = 4 << 20
#: what ``retr_flood`` sends for any RETR
FLOOD_RETR = 300 << 20


class _Threads:
    """Sockets and threads to close and join on stop."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._transports: list[paramiko.Transport] = []

    def track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        if self.stopped.is_set():
            _shut(sock)
        return sock

    def track_transport(self, t: paramiko.Transport) -> None:
        with self._lock:
            self._transports.append(t)
        if self.stopped.is_set():
            t.close()

    def spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def accept(self, listener: socket.socket, handle: Callable[[socket.socket], None], *,
               thread_each: bool = True) -> None:
        """Until stopped or ``listener`` is closed, on a thread of its own: accept each connection,
        track it and pass it to ``handle``, on a new thread each (``thread_each``) or on that one."""
        def loop() -> None:
            while not self.stopped.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                self.track(conn)
                if thread_each:
                    self.spawn(handle, conn)
                else:
                    handle(conn)

        self.spawn(loop)

    def stop(self) -> None:
        self.stopped.set()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
            transports = list(self._transports)
        for t in transports:
            t.close()
        for sock in sockets:
            _shut(sock)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(10)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class _LoopbackServer:
    """Listens on a port of its own on 127.0.0.1 (``port``); :meth:`stop`, or leaving the ``with``
    block, closes every socket and joins every thread of :attr:`_t`."""

    def __init__(self) -> None:
        self._t = _Threads()
        self.stopped = self._t.stopped
        self._listener = self._t.track(socket.create_server(("127.0.0.1", 0)))
        self.port: int = self._listener.getsockname()[1]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        self._t.stop()


class HostileFTPServer(_LoopbackServer):
    def __init__(self, behaviour: str, *, interval: float = 0.25,
                 tls: tuple[Path, Path] | None = None, listing: bytes = b"",
                 pasv_host: str | None = None) -> None:
        if behaviour not in ("welcome", "feat", "feat_flood", "retr", "retr_flood", "dele", "auth_inject",
                             "mlsd", "list", "closed_pasv", "dele_silent"):
            raise ValueError(f"unknown behaviour {behaviour!r}")
        self.behaviour = behaviour
        self.interval = interval
        self.listing = listing
        self.pasv_host = pasv_host
        #: data connections made to ``pasv_host`` (a client that followed the PASV reply)
        self.trapped = 0
        #: data connections made to the control connection's address
        self.data_connections = 0
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
        super().__init__()
        self.url = f"ftp://tester@127.0.0.1:{self.port}/"
        #: commands received, in order (for assertions)
        self.commands: list[str] = []
        #: retr_flood: bytes of the last RETR that went out before the client closed the connection
        self.flooded = 0
        self._t.accept(self._listener, self._session)

    # ------------------------------------------------------------------ serving

    def _trickle(self, sock: socket.socket, data: bytes | None = None) -> None:
        """Send ``data`` (or 'x' for ever) one byte per interval, until stopped."""
        i = 0
        while not self._t.stopped.wait(self.interval):
            byte = data[i:i + 1] if data is not None else b"x"
            if not byte:
                return
            try:
                sock.sendall(byte)
            except OSError:
                return
            i += 1

    def _session(self, conn: socket.socket) -> None:
        try:
            self._converse(conn)
        except OSError:
            pass

    def _converse(self, conn: socket.socket) -> None:
        if self.behaviour == "welcome":
            conn.sendall(b"220 ")
            self._trickle(conn)
            return
        conn.sendall(b"220 hostile test server\r\n")
        reader = conn.makefile("rb")
        data_listener: socket.socket | None = None
        while not self._t.stopped.is_set():
            raw = reader.readline(4096)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.commands.append(line)
            verb = line.split(" ", 1)[0].upper()
            if verb == "AUTH" and self.behaviour == "auth_inject" and self._tls is not None:
                conn.sendall(b"234 go ahead\r\n230 logged in (forged, in clear)\r\n")
                conn = self._t.track(self._tls.wrap_socket(conn, server_side=True))
                reader = conn.makefile("rb")
                continue
            if verb == "USER":
                conn.sendall(b"331 password please\r\n")
            elif verb == "PASS":
                conn.sendall(b"230 logged in\r\n")
            elif verb == "FEAT":
                if self.behaviour == "feat":
                    conn.sendall(b"211-Features:\r\n")
                    self._endless_lines(conn, flood=False)
                    return
                if self.behaviour == "feat_flood":
                    conn.sendall(b"211-Features:\r\n")
                    self._endless_lines(conn, flood=True)
                    return
                mlsd = b" MLSD\r\n" if self.behaviour == "mlsd" else b""
                conn.sendall(b"211-Features:\r\n SIZE\r\n" + mlsd + b"211 End\r\n")
            elif verb in ("TYPE", "OPTS", "NOOP"):
                conn.sendall(b"200 ok\r\n")
            elif verb == "PASV" and self.behaviour == "closed_pasv":
                listener, port = self._passive_listener()
                _shut(listener)  # nothing listens there any more: a data connection is refused
                conn.sendall(f"227 Entering Passive Mode (127,0,0,1,{port >> 8},{port & 255})\r\n".encode())
            elif verb == "PASV":
                data_listener, port = self._passive_listener()
                host = (self.pasv_host or "127.0.0.1").replace(".", ",")
                conn.sendall(f"227 Entering Passive Mode ({host},{port >> 8},{port & 255})\r\n".encode())
            elif (verb in ("MLSD", "LIST") and self.behaviour in ("mlsd", "list")
                  and data_listener is not None):
                conn.sendall(b"150 here it is\r\n")
                data, _ = data_listener.accept()
                self._t.track(data)
                self.data_connections += 1
                data.sendall(self.listing)
                _shut(data)
                data_listener.close()
                data_listener = None
                conn.sendall(b"226 done\r\n")
            elif verb == "RETR" and self.behaviour == "retr_flood" and data_listener is not None:
                conn.sendall(b"150 here it comes, all of it\r\n")
                data, _ = data_listener.accept()
                self._t.track(data)
                self.flooded = self._flood(data)
                _shut(data)
                conn.sendall(b"226 done\r\n")
            elif verb in ("RETR", "LIST", "MLSD") and data_listener is not None:
                conn.sendall(b"150 here it comes, slowly\r\n")
                data, _ = data_listener.accept()
                self._t.track(data)
                self._trickle(data)
                return
            elif verb == "DELE" and self.behaviour == "dele_silent":
                self._t.stopped.wait()  # no reply, not a byte of one
                return
            elif verb == "DELE" and self.behaviour == "dele":
                self._trickle(conn, b"250 deleted, eventually" + b"." * 10_000 + b"\r\n")
                return
            elif verb == "CWD":
                conn.sendall(b"250 ok\r\n")
            elif verb == "RNFR" and self.behaviour in ("mlsd", "list"):
                conn.sendall(b"350 ready for RNTO\r\n")
            elif verb == "RNTO" and self.behaviour in ("mlsd", "list"):
                conn.sendall(b"250 renamed\r\n")
            elif verb == "QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"502 not implemented\r\n")

    def _passive_listener(self) -> tuple[socket.socket, int]:
        """A data listener on 127.0.0.1 and its port; with ``pasv_host``, a trap listening on
        the same port there, counting (and closing) what connects to it."""
        for _ in range(50):
            listener = self._t.track(socket.create_server(("127.0.0.1", 0)))
            port: int = listener.getsockname()[1]
            if self.pasv_host is None:
                return listener, port
            try:
                trap = self._t.track(socket.create_server((self.pasv_host, port)))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:  # not an address of this machine (10.0.0.1):
                    return listener, port  # nothing to trap, a client following it fails
                _shut(listener)  # that port is taken on the other address: try another one
                continue
            self._t.accept(trap, self._trapped, thread_each=False)
            return listener, port
        raise OSError(f"no port free on both 127.0.0.1 and {self.pasv_host}")

    def _trapped(self, conn: socket.socket) -> None:
        self.trapped += 1
        _shut(conn)

    def _flood(self, data: socket.socket) -> int:
        """Send FLOOD_RETR bytes on ``data`` (until the client closes it); return how many went."""
        chunk = b"x" * (1 << 20)
        sent = 0
        while sent < FLOOD_RETR and not self._t.stopped.is_set():
            try:
                data.sendall(chunk)
            except OSError:
                break
            sent += len(chunk)
        return sent

    def _endless_lines(self, conn: socket.socket, *, flood: bool) -> None:
        sent = 0
        n = 0
        while not self._t.stopped.is_set():
            if flood:
                if sent >= FLOOD_LIMIT:
                    self._t.stopped.wait()  # stall; the test's stop ends it
                    return
                chunk = b"".join(f" FEATURE{n + i:09d} with a long description\r\n".encode()
                                 for i in range(1000))
                n += 1000
            else:
                if self._t.stopped.wait(self.interval):
                    return
                chunk = f" FEATURE{n}\r\n".encode()
                n += 1
            conn.sendall(chunk)
            sent += len(chunk)


class RecordingProxy(_LoopbackServer):
    """Forwards every connection to ``upstream`` (host, port); records the client's bytes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        super().__init__()
        self.lock = threading.Lock()
        #: what clients sent, per connection, in order
        self.sent: list[bytearray] = []
        self._t.accept(self._listener, self._forward, thread_each=False)

    def client_bytes(self) -> bytes:
        with self.lock:
            return b"".join(bytes(b) for b in self.sent)

    def _forward(self, client: socket.socket) -> None:
        try:
            server = self._t.track(socket.create_connection(self.upstream, timeout=10))
        except OSError:
            _shut(client)
            return
        server.settimeout(None)
        record = bytearray()
        with self.lock:
            self.sent.append(record)
        self._t.spawn(self._pump, client, server, record)
        self._t.spawn(self._pump, server, client, None)

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if record is not None:
                with self.lock:
                    record += data
            try:
                dst.sendall(data)
            except OSError:
                return


# --------------------------------------------------------------------------- SFTP

_INIT, _VERSION, _OPEN, _CLOSE, _READ, _FSTAT, _OPENDIR, _READDIR = 1, 2, 3, 4, 5, 8, 11, 12
_STATUS, _HANDLE, _DATA, _NAME, _ATTRS = 101, 102, 103, 104, 105
_FX_EOF = 1
#: ATTRS flags: size, permissions, access and modification times
_ATTR_SIZE, _ATTR_PERMISSIONS, _ATTR_TIMES = 0x1, 0x4, 0x8
#: the size the ``read`` behaviour announces for any file
SFTP_FILE_SIZE = 1 << 20


def _packet(kind: int, payload: bytes) -> bytes:
    return struct.pack(">IB", len(payload) + 1, kind) + payload


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: HostileSFTPServer) -> None:
        self.server = server

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        if self.server.behaviour == "subsystem":
            self.server.stopped.wait()  # no answer until the test stops the server
            return False
        return name == "sftp"


class HostileSFTPServer(_LoopbackServer):
    def __init__(self, behaviour: str, host_key: paramiko.PKey, *, interval: float = 0.25,
                 names: list[bytes] | None = None) -> None:
        if behaviour not in ("subsystem", "version", "read", "listing"):
            raise ValueError(f"unknown behaviour {behaviour!r}")
        self.behaviour = behaviour
        self.names = list(names or [])
        self.host_key = host_key
        self.interval = interval
        super().__init__()
        self.url = f"sftp://tester@127.0.0.1:{self.port}/"
        self._t.accept(self._listener, self._session)

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def _session(self, conn: socket.socket) -> None:
        t = paramiko.Transport(conn)
        self._t.track_transport(t)
        try:
            t.add_server_key(self.host_key)
            t.start_server(server=_Interface(self))
            chan = None
            while chan is None and t.is_active() and not self.stopped.is_set():
                chan = t.accept(0.2)
            if chan is not None:
                self._sftp(chan)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            t.close()

    def _recv(self, chan: paramiko.Channel, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = chan.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def _trickle(self, chan: paramiko.Channel, data: bytes) -> None:
        for i in range(len(data)):
            if self.stopped.wait(self.interval):
                return
            chan.sendall(data[i:i + 1])

    def _name_packet(self, rid: bytes) -> bytes:
        attrs = struct.pack(">IQIII", _ATTR_SIZE | _ATTR_PERMISSIONS | _ATTR_TIMES, 5, 0o100644,
                            1767268800, 1767268800)
        entries = b"".join(_string(name) + _string(b"-rw-r--r-- 1 u g 5 Jan 1 12:00 " + name) + attrs
                           for name in self.names)
        return _packet(_NAME, rid + struct.pack(">I", len(self.names)) + entries)

    def _sftp(self, chan: paramiko.Channel) -> None:
        listed = False  # whether the open directory's READDIR was answered with its names
        while not self.stopped.is_set():
            length, kind = struct.unpack(">IB", self._recv(chan, 5))
            body = self._recv(chan, length - 1)
            if kind == _INIT:
                if self.behaviour == "version":
                    # with an extension, so that the packet takes minutes at this pace
                    self._trickle(chan, _packet(_VERSION, struct.pack(">I", 3) + _string(b"x@hostile")
                                                + _string(b"y" * 1000)))
                    return
                chan.sendall(_packet(_VERSION, struct.pack(">I", 3)))
                continue
            rid = body[:4]
            if kind in (_OPEN, _OPENDIR):
                listed = False
                chan.sendall(_packet(_HANDLE, rid + _string(b"h")))
            elif kind == _READDIR and self.behaviour == "listing" and not listed:
                listed = True
                chan.sendall(self._name_packet(rid))
            elif kind == _READDIR:
                chan.sendall(_packet(_STATUS, rid + struct.pack(">I", _FX_EOF) + _string(b"") + _string(b"")))
            elif kind == _FSTAT:
                chan.sendall(_packet(_ATTRS, rid + struct.pack(">IQ", 1, SFTP_FILE_SIZE)))
            elif kind == _READ:
                (length,) = struct.unpack(">I", body[-4:])
                self._trickle(chan, _packet(_DATA, rid + _string(b"x" * length)))
                return
            else:  # CLOSE and anything else: OK
                chan.sendall(_packet(_STATUS, rid + struct.pack(">I", 0) + _string(b"") + _string(b"")))
