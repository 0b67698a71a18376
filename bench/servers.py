"""The servers the benchmarks run against: pyftpdlib, vsftpd and OpenSSH, each its own process.

    with running(["pyftpdlib", "vsftpd", "sshd"], workdir) as targets:
        target = fresh(targets["vsftpd"])      # a new empty directory on that server

A *target* is a plain dict (it crosses process boundaries as JSON): ``kind``, ``host``, ``port``,
``user``, ``password`` or ``key_file``/``known_hosts``, ``base`` (remote directory), ``root``
(the local directory behind remote ``/``... for FTP, behind ``base`` for SFTP) and ``url``.

pyftpdlib runs as ``ftpbc ftpd`` in a subprocess, so that the server does not share the GIL
with the code being measured.  vsftpd and sshd reuse the test rig's process classes and config
writers (tests/servers/); the user and PAM set-up that the test fixtures do inline is repeated
here in a few lines.  Every server process is started with PDEATHSIG (it dies with the runner)
and stopped by :func:`running` on the way out, including on Ctrl-C and SIGTERM.

The test rig (and with it pytest) is imported only where a server is started: every benchmark
side is a fresh process that imports this module for :func:`server_config`, and pytest's import
alone cost about 0.4 s per run, over 120 runs in the quick set.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

Target = dict[str, Any]
KINDS = ("pyftpdlib", "vsftpd", "sshd")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> bool:
    import socket

    if proc.poll() is not None:
        raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.recv(100)
            return True
    except OSError:
        return False


@contextmanager
def pyftpdlib_server(workdir: Path) -> Iterator[Target]:
    from tests.support import free_port, wait_until

    root = workdir / "pyftpdlib-root"
    root.mkdir(parents=True)
    port, password = free_port(), secrets.token_urlsafe(12)
    log = workdir / "pyftpdlib.log"
    env = {**os.environ, "FTPBC_FTPD_PASSWORD": password, "PYTHONPATH": str(REPO)}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from ftpbc.cli import main; main()", "ftpd",
                                 "--root", str(root), "--port", str(port), "--user", "bench"],
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                preexec_fn=_die_with_parent)
    try:
        wait_until(lambda: _listening(port, proc, log), timeout=20, what=f"pyftpdlib on {port}")
        yield {"kind": "pyftpdlib", "host": "127.0.0.1", "port": port, "user": "bench",
               "password": password, "base": "/", "root": str(root), "pid": proc.pid}
    finally:
        _stop(proc)


@contextmanager
def vsftpd_server(workdir: Path) -> Iterator[Target]:
    from tests.servers import vsftpd as vsftpd_rig
    from tests.support import wait_until

    class _Vsftpd(vsftpd_rig.VsftpdProcess):
        """The rig's vsftpd, started so that it dies with the benchmark runner."""

        def start(self) -> None:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([self.binary, str(self.config)], stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log, preexec_fn=_die_with_parent)
            wait_until(self._listening, timeout=10, what=f"vsftpd on 127.0.0.1:{self.port}")

    binary = shutil.which("vsftpd") or "/usr/sbin/vsftpd"
    with vsftpd_rig.running_vsftpd(binary, workdir / "vsftpd", label="bench", process_class=_Vsftpd) as v:
        assert v.server.proc is not None
        yield {"kind": "vsftpd", "host": "127.0.0.1", "port": v.server.port, "user": v.user,
               "password": v.password, "base": "/", "root": str(v.root), "pid": v.server.proc.pid}


@contextmanager
def sshd_server(workdir: Path) -> Iterator[Target]:
    from tests.servers import sshd as sshd_rig
    from tests.support import free_port

    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    sdir = workdir / "sshd"
    sdir.mkdir(parents=True)
    host_key = sshd_rig._keygen(sdir / "host_ed25519", "ed25519")
    client_key = sshd_rig._keygen(sdir / "client_ed25519", "ed25519")
    (sdir / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    port = free_port()
    host_pub = host_key.with_suffix(".pub").read_text().split()
    (sdir / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    server = sshd_rig.SshdProcess(binary=binary, workdir=sdir, port=port,
                                  config=sshd_rig._write_config(binary, sdir, port), log=sdir / "sshd.log")
    root = sdir / "root"
    root.mkdir()
    try:
        server.start()
        assert server.proc is not None
        yield {"kind": "sshd", "host": "127.0.0.1", "port": port, "user": "root", "password": None,
               "key_file": str(client_key), "known_hosts": str(sdir / "known_hosts"),
               "base": str(root), "root": str(root), "pid": server.proc.pid}
    finally:
        server.stop()


STARTERS = {"pyftpdlib": pyftpdlib_server, "vsftpd": vsftpd_server, "sshd": sshd_server}


@contextmanager
def running(kinds: list[str], workdir: Path) -> Iterator[dict[str, Target]]:
    """Start the servers named in ``kinds``; stop every one of them on the way out.

    SIGTERM is turned into KeyboardInterrupt for the duration, so ``kill`` cleans up as Ctrl-C does.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        with ExitStack() as stack:
            yield {kind: stack.enter_context(STARTERS[kind](workdir)) for kind in kinds}
    finally:
        signal.signal(signal.SIGTERM, previous)


def fresh(target: Target) -> Target:
    """``target`` moved into a new empty, world-writable directory (one per benchmark run)."""
    name = f"run-{uuid.uuid4().hex[:10]}"
    local = Path(target["root"]) / name
    local.mkdir()
    local.chmod(0o777)  # vsftpd's user writes where root created the directory
    base = target["base"].rstrip("/") + "/" + name
    return {**target, "base": base, "root": str(local)}


def url(target: Target) -> str:
    """The ftpbc server URL of ``target`` (no password)."""
    scheme = "sftp" if target["kind"] == "sshd" else "ftp"
    return f"{scheme}://{target['user']}@{target['host']}:{target['port']}{target['base']}"


def server_config(target: Target, **overrides: Any) -> Any:
    """An ftpbc ServerConfig for ``target`` (server name ``srv``)."""
    from ftpbc.config.servers import ServerConfig

    options: dict[str, Any] = {}
    if target.get("key_file"):
        options = {"key_file": target["key_file"], "known_hosts": target["known_hosts"]}
    return ServerConfig.from_url(url(target), password=target.get("password"), name="srv",
                                 **{**options, **overrides})


def remove(target: Target) -> None:
    """Delete a run directory made by :func:`fresh` (large-message runs leave GiB behind)."""
    shutil.rmtree(target["root"], ignore_errors=True)
