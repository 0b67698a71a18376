"""What the real-server fixtures share: probing the listener, dropping sessions, the listener's
controls (:class:`ListeningProcess`), and for the servers unpacked beside vsftpd (ProFTPD,
pure-ftpd): finding them, password hashes, the temporary root and the foreground process."""

from __future__ import annotations

import ctypes
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.servers.handle import ServerHandle
from tests.support import IN_CI, free_port, wait_until


def accepts(proc: subprocess.Popen[bytes], port: int, name: str, log: Path, *,
            read_banner: bool = False, host: str = "127.0.0.1") -> bool:
    """True once ``host``:``port`` accepts a connection; fail the test if the server died.

    ``read_banner`` reads the greeting first, so the probe ends as a clean session rather than
    an error in the server's log (vsftpd).
    """
    if proc.poll() is not None:
        pytest.fail(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            if read_banner:
                s.recv(100)
            return True
    except OSError:
        return False


def kill_sessions(proc: subprocess.Popen[bytes], name: str) -> None:
    """Kill every per-connection process (the listener's descendants); keep the listener.

    Waits until each is dead or a zombie: a dead process's sockets are closed before it is
    reaped, and grandchildren may be reaped late by init.
    """
    children = psutil.Process(proc.pid).children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    wait_until(lambda: all(gone(c) for c in children), timeout=5, what=f"{name} sessions to die")


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ListeningProcess:
    """A server's listener (``proc``, named ``name``, on ``port``): the controls every real-server
    fixture gives.

    A subclass's ``start`` runs the listener into ``proc`` and returns once it answers.
    ``drop_connections`` kills the per-session processes (the listener stays); ``stop`` does
    that, then SIGTERMs the listener and reaps it (nothing if it already exited); ``restart``
    is ``stop`` then ``start``.
    """

    name: str
    port: int
    proc: subprocess.Popen[bytes] | None

    def start(self) -> None:
        raise NotImplementedError

    def launch(self, argv: list[str], log: Path, what: str, listening: Callable[[], bool], *,
               die_with_parent: bool) -> None:
        """Run ``argv`` (stdin empty, stdout and stderr appended to ``log``) as ``proc``, then wait
        up to 10 s for ``listening()`` (``what`` names it when that times out).

        ``die_with_parent``: SIGTERM it when its parent (this process) dies."""
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         preexec_fn=_die_with_parent if die_with_parent else None)
        wait_until(listening, timeout=10, what=what)

    def drop_connections(self) -> None:
        """Kill every per-session process (the listener's descendants); the listener stays."""
        assert self.proc is not None
        kill_sessions(self.proc, self.name)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.drop_connections()
            terminate(self.proc)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


# --------------------------------------------------------------------------- unpacked servers

#: where ``.ci/run`` unpacks servers that conflict with vsftpd in Debian (ProFTPD, pure-ftpd):
#: one directory per server, holding its packages' files as dpkg -x lays them out
UNPACKED_DIR = Path(os.environ.get("FTPBC_SERVERS_DIR", "/opt/ftpbc-servers"))


def unpacked_binary(name: str, relpath: str, packages: str) -> Path:
    """``UNPACKED_DIR/name/relpath`` if executable, else the same file installed system-wide.

    Locally a missing binary skips the test (with the install recipe); under CI=true it fails.
    """
    for candidate in (UNPACKED_DIR / name / relpath, Path("/") / relpath):
        if os.access(candidate, os.X_OK):
            return candidate
    message = (f"{name} is not installed: .ci/run unpacks it into {UNPACKED_DIR / name} "
               f"(apt-get download {packages}; dpkg -x each .deb there)")
    if IN_CI:
        pytest.fail(f"CI=true but {message}")
    pytest.skip(message)


def require_root(name: str, why: str = "the server chroots and switches users") -> None:
    """Skip (fail under CI) unless this runs as root, which the ``name`` fixture needs (``why``)."""
    if os.geteuid() != 0:
        message = f"the {name} fixture must run as root ({why})"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def sha512_crypt(password: str) -> str:
    """``password`` as a SHA-512 crypt(3) hash (``$6$...``), made by ``openssl passwd``.

    A few milliseconds per login to check, where pure-pw's default (argon2id) costs seconds.
    The password goes through stdin, never the command line.
    """
    out = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password.encode(),
                         capture_output=True, check=True)
    return out.stdout.decode().strip()


def nobody() -> tuple[int, int]:
    """The uid and gid the virtual users run as (``nobody``/``nogroup``, 65534 on Debian)."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def private_root(label: str, uid: int, gid: int) -> Path:
    """A new directory for remote "/", outside pytest's root-only temp tree, owned by ``uid``.

    The server enters it as the unprivileged user, so every directory above it must be
    searchable by that user.
    """
    root = Path(tempfile.mkdtemp(prefix=f"ftpbc-{label}-", dir="/tmp"))
    os.chown(root, uid, gid)
    root.chmod(0o755)
    return root


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 5 s; reaped either way."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@dataclass
class ForegroundServer(ListeningProcess):
    """A server daemon run in the foreground: ``argv`` listens on 127.0.0.1:``port``.

    ``start`` waits until the port answers with a greeting; the listener dies with this process.
    """

    name: str
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch(self.argv, self.log, f"{self.name} on 127.0.0.1:{self.port} ({self.log})",
                    self._listening, die_with_parent=True)

    def _listening(self) -> bool:
        assert self.proc is not None
        return accepts(self.proc, self.port, self.name, self.log, read_banner=True)


@dataclass(frozen=True)
class VirtualLogin:
    """The one login of an unpacked server: ``user`` with ``password``, run as ``uid``/``gid``
    (``nobody``), chrooted into ``root``."""

    user: str
    password: str
    uid: int
    gid: int
    root: Path


@dataclass
class ServerInstance:
    """A running FTP server with its one login user and the directory remote "/" maps to."""

    server: ListeningProcess
    user: str
    password: str
    root: Path

    def handle(self, kind: str, *, scheme: str = "ftp", options: dict[str, object] | None = None,
               host: str = "127.0.0.1") -> ServerHandle:
        """The fixture's ServerHandle (the server reached at ``host``), with the controls
        ``drop_connections`` and ``restart``."""
        return ServerHandle(kind=kind, root=self.root,
                            url=f"{scheme}://{self.user}@{host}:{self.server.port}/",
                            password=self.password, options=dict(options or {}),
                            controls={"drop_connections": self.server.drop_connections,
                                      "restart": self.server.restart})


@contextmanager
def running_unpacked(name: str, workdir: Path, *, user: str, label: str,
                     argv: Callable[[VirtualLogin, int], list[str]]) -> Iterator[ServerInstance]:
    """A ``name`` server in the foreground on a free loopback port, with one virtual ``user``
    (a new random password, run as ``nobody``) chrooted into a new root.

    ``argv(login, port)`` writes what the server needs for ``login`` into ``workdir`` (made
    first) and returns the command line that serves on 127.0.0.1:``port``.  Needs root.  The
    root directory is removed on exit, the server stopped.
    """
    uid, gid = nobody()
    root = private_root(label, uid, gid)
    server: ForegroundServer | None = None
    try:
        login = VirtualLogin(user, secrets.token_urlsafe(12), uid, gid, root)
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        server = ForegroundServer(name, argv(login, port), port, workdir / "stderr.log")
        server.start()
        yield ServerInstance(server, user, login.password, root)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _die_with_parent() -> None:
    # A pytest killed by a signal skips fixture teardown; the listener then dies with it rather
    # than holding its port (PR_SET_PDEATHSIG; the session processes end with their clients).
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
