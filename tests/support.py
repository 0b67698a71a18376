"""Helpers shared by the tests: waiting on conditions, free ports, binaries that CI must have."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ftpbc.model.message import Message
from tests.servers.handle import ServerHandle

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
               what: str = "condition") -> T:
    """Poll ``condition`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def require_binary(name: str, *candidates: str) -> str:
    """Path of a server binary.  Locally a missing binary skips; under CI=true it fails."""
    for cand in (name, *candidates):
        found = shutil.which(cand) or (cand if os.path.isabs(cand) and os.access(cand, os.X_OK) else None)
        if found:
            return found
    message = f"{name} is not installed (apt-get install the Debian package)"
    if IN_CI:
        pytest.fail(f"CI=true but {message}")
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (below the ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- the real command line

#: runs ``ftpbc.cli.main`` exactly as the installed ``ftpbc`` script does; ``-P``: without the
#: working directory on sys.path (``python -c`` puts it first, the script does not)
FTPBC = [sys.executable, "-P", "-c", "from ftpbc.cli import main; main()"]


def ftpbc_env(extra: dict[str, str] | None = None, *, cwd_imports: str | None = None) -> dict[str, str]:
    """os.environ plus ``extra``; ``cwd_imports`` is put on PYTHONPATH (e.g. the repo, for
    ``tests.chaos:handler``; the examples name their handler directory in handler_path)."""
    env = {**os.environ, **(extra or {})}
    if cwd_imports is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd_imports, env.get("PYTHONPATH")) if p)
    return env


def run_ftpbc(*args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
              timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ftpbc ARGS`` to completion; ``env`` is the whole environment (see :func:`ftpbc_env`)."""
    return subprocess.run([*FTPBC, *args], env=env, cwd=cwd, timeout=timeout, input=stdin,
                          capture_output=True, text=True, check=False)


def popen_ftpbc(*args: str, log: Path, env: dict[str, str] | None = None,
                cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``ftpbc ARGS`` (e.g. ``serve``), its output going to the file ``log``.

    A file, not a pipe: a long-running node's log would fill a pipe nobody reads and block it.
    The caller must end the process (SIGTERM, then wait).
    """
    with open(log, "ab") as out:
        return subprocess.Popen([*FTPBC, *args], env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


def server_yaml(handle: ServerHandle, password_env: str, base: str = "") -> dict[str, object]:
    """A fixture server as a YAML ``servers`` entry, its password read from ``password_env``.

    ``base`` (a remote directory such as ``handle.fresh_dir()``) is appended to the url.
    """
    entry: dict[str, object] = {"url": handle.url.rstrip("/") + base if base else handle.url}
    if handle.password is not None:
        entry["password_env"] = password_env
    entry.update({k: str(v) if isinstance(v, Path) else v for k, v in handle.options.items()})
    return entry


# --------------------------------------------------------------------------- an exchange area's files


def area_files(handle: ServerHandle, repo: str, directory: str) -> list[str]:
    """The names in ``<repo>/<directory>`` of ``handle``'s server, read from its local root, sorted."""
    path = handle.local(f"{repo}/{directory}")
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def drop_message(handle: ServerHandle, repo: str, name: str, body: bytes) -> None:
    """Put a message into ``<repo>/inbox`` as a foreign producer does: written to ``instage``
    first, then renamed, so no consumer sees it partial.  The area must exist."""
    staged = handle.local(f"{repo}/instage") / (name + "~test")
    staged.write_bytes(body)
    staged.rename(handle.local(f"{repo}/inbox") / name)


def embedded_config(port: int, tmp_path: Path, *, node: dict[str, object] | None = None,
                    endpoint: dict[str, object] | None = None) -> Any:
    """A configuration with one endpoint, ``echo`` (repository ``/ex/echo``, quick polls), on an
    in-process pyftpdlib at ``port`` whose user ``ftpbc`` has the password ``pw`` (written to a
    0600 password file: a file group or others may read is refused).  ``node`` and ``endpoint``
    add or override settings."""
    from ftpbc.config.loader import parse_config

    pw = tmp_path / "pw"
    pw.write_text("pw")
    pw.chmod(0o600)
    ep = {"server": "s", "repository": "/ex/echo", "poll_interval": 0.02, "timeout": 20, **(endpoint or {})}
    nd = {"state_dir": f"{tmp_path}/state", "journal_dir": f"{tmp_path}/journals", **(node or {})}
    return parse_config(json.dumps({
        "node": nd,
        "servers": {"s": {"url": f"ftp://ftpbc@127.0.0.1:{port}/", "password_file": str(pw)}},
        "endpoints": {"echo": ep}}))


class Seen:
    """A handler that records, thread-safe, what it was given (``messages``, their ``bodies``
    and ``names``) and answers ``reply(body)`` (the body itself by default).  The body is read
    during the call: a message's spool is gone once its handler has returned."""

    def __init__(self, reply: Callable[[bytes], bytes] = lambda body: body) -> None:
        self.lock = threading.Lock()
        self.messages: list[Message] = []
        self.bodies: list[bytes] = []
        self.names: list[str] = []
        self._reply = reply

    def handler(self, message: Message) -> bytes:
        body = message.body
        with self.lock:
            self.messages.append(message)
            self.bodies.append(body)
            self.names.append(message.name)
        return self._reply(body)

    def count(self) -> int:
        with self.lock:
            return len(self.messages)
