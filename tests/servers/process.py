"""What the real-server fixtures (vsftpd, sshd) share: probing the listener, dropping sessions."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support import wait_until


def accepts(proc: subprocess.Popen[bytes], port: int, name: str, log: Path, *,
            read_banner: bool = False) -> bool:
    """True once 127.0.0.1:``port`` accepts a connection; fail the test if the server died.

    ``read_banner`` reads the greeting first, so the probe ends as a clean session rather than
    an error in the server's log (vsftpd).
    """
    if proc.poll() is not None:
        pytest.fail(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
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
    wait_until(lambda: all(_gone(c) for c in children), timeout=5, what=f"{name} sessions to die")


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
