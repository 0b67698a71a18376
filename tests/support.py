"""Helpers shared by the tests: waiting on conditions, free ports, binaries that CI must have."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from ftpbc.model.message import Message
from tests.servers.handle import ServerHandle

if TYPE_CHECKING:
    from ftpbc.client import Client
    from ftpbc.config.models import Config
    from ftpbc.sequences import SequenceStore

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


# --------------------------------------------------------------------------- a node and a client in process


@contextmanager
def echo_client(config: Config, handler: Callable[[Message], bytes | str]) -> Iterator[Client]:
    """Node ``prov`` serving endpoint ``echo`` with ``handler``, and a Client ``cli`` for the
    test's requests; on the way out, also after a failed assertion, the node must stop clean
    (no claim left for recovery or the lease)."""
    from ftpbc.client import Client
    from ftpbc.node.serve import Node

    node = Node(config.with_node_id("prov"), handlers={"echo": handler})
    node.start()
    try:
        with Client(config.with_node_id("cli")) as client:
            yield client
    finally:
        assert node.stop() is True


# --------------------------------------------------------------------------- a node killed at a crash point

#: handler module ``crashhandlers`` (``crashhandlers:upper``), written beside a test's
#: configuration: each call appends the message's name to $CALLS_LOG, so a test counts the calls
#: across the crashes and restarts of its node
CRASH_HANDLERS = '''
import os
def upper(message):
    with open(os.environ["CALLS_LOG"], "a") as log:
        log.write(message.name + "\\n")
    return message.body.upper()
'''


def handler_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an ``ftpbc`` subprocess that imports handler modules from
    ``tmp_path`` (:data:`CRASH_HANDLERS`) and the checkout, its calls logged in
    ``tmp_path/calls.log``; ``extra`` added (``FTPBC_CRASH_AT=...``)."""
    repo = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (str(tmp_path), repo, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "CALLS_LOG": str(tmp_path / "calls.log"), **extra}


def crash_area(server: ServerHandle, tmp_path: Path) -> tuple[str, Path]:
    """A fresh directory on ``server`` with a partner's ``out`` directory in it (open to the
    server's user), and :data:`CRASH_HANDLERS` written to ``tmp_path``; returns the remote
    directory and the local path of ``out``."""
    base = server.fresh_dir()
    out = server.local(base) / "out"
    out.mkdir()
    out.chmod(0o777)
    (tmp_path / "crashhandlers.py").write_text(CRASH_HANDLERS, encoding="utf-8")
    return base, out


def run_until_killed(config: Path, tmp_path: Path, point: str, *args: str) -> None:
    """Run ``ftpbc ARGS -c CONFIG`` with ``FTPBC_CRASH_AT=point`` (ftpbc.faults) and assert
    that the crash point killed it (SIGKILL)."""
    crashed = subprocess.run([*FTPBC, *args, "-c", str(config)], capture_output=True, timeout=60,
                             env=handler_env(tmp_path, FTPBC_CRASH_AT=point), check=False)
    assert crashed.returncode == -signal.SIGKILL, f"{point}: {crashed.stderr.decode()[-2000:]}"


# --------------------------------------------------------------------------- processes drawing a sequence

#: A child process drawing from global sequence NAME of a SequenceStore with THREADS threads.
#: "burst": COUNT each, then prints them as JSON.  "loop": until killed, each value appended to
#: LOG (one os.write) once next() returned.
SEQUENCE_DRAWER = r"""
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
from ftpbc.sequences import SequenceStore
local, shared, name, mode, threads, count, log = sys.argv[2:9]
store = SequenceStore(local, shared)
out = []
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if mode == "loop" else -1
def work():
    for _ in range(int(count)) if mode == "burst" else iter(int, 1):
        value = store.next("global", None, name)
        if fd >= 0:
            os.write(fd, b"%d\n" % value)
        else:
            out.append(value)
ts = [threading.Thread(target=work, daemon=True) for _ in range(int(threads))]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"""


def spawn_drawer(store: SequenceStore, name: str, mode: str, threads: int, count: int, log: str = "-"
                 ) -> subprocess.Popen[bytes]:
    """A process running :data:`SEQUENCE_DRAWER` on ``store``'s files (stdout, stderr: pipes)."""
    repo = str(Path(__file__).resolve().parent.parent)
    return subprocess.Popen(
        [sys.executable, "-c", SEQUENCE_DRAWER, repo, str(store.local_dir), str(store.shared_dir), name,
         mode, str(threads), str(count), log],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextmanager
def reaped() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to put child processes in: on the way out each still running is killed, and every
    one is waited for (its pipes read, so that none blocks on a full one)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


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
