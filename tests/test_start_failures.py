"""No zombie nodes: a node whose start-up fails says so everywhere and serves once the cause is
gone, and a killed node is shown dead at once.

* ``ftpbc serve`` with a wrong password in its ``password_file`` keeps trying (one log line for
  the refused login, not one per try); its heartbeat, ``ftpbc status`` and ``/readyz`` say
  ``not serving: AuthenticationFailed ...``; once the file holds the right password it serves a
  request, with no restart.  A one-shot command with the same file fails at once.
* ``ftpbc status`` shows a node killed with SIGKILL as DEAD at once (its heartbeat names a pid of
  this host that no process has), with ``coordination: state_dir`` and ``server``; a heartbeat
  from another host is judged by its age alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.cluster.heartbeat import Heartbeat, Serves, beat_info, not_serving_reason, process_alive
from ftpbc.config.loader import load_config
from ftpbc.errors import ConfigError
from ftpbc.model.message import Message
from ftpbc.node.health import not_ready
from ftpbc.node.serve import Node
from tests.servers.handle import ServerHandle
from tests.support import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
FTPBC = [sys.executable, "-c", "from ftpbc.cli import main; main()"]
HOST = socket.gethostname().replace(" ", "-") or "localhost"


def _echo(message: Message) -> bytes:
    return b"re:" + message.body


def _write_config(tmp_path: Path, handle: ServerHandle, password: str, *,
                  coordination: str = "state_dir") -> Path:
    """A configuration serving ``echo`` (tests.chaos:handler) on ``handle``'s server, its
    password in a 0600 ``password_file`` holding ``password``."""
    secret = tmp_path / "pw"
    _set_password(secret, password)
    server: dict[str, Any] = {"url": handle.url, "password_file": str(secret), "timeout": 5}
    server.update({k: str(v) if isinstance(v, Path) else v for k, v in handle.options.items()})
    node: dict[str, Any] = {"id": "unset", "state_dir": str(tmp_path / "state"),
                            "journal_dir": str(tmp_path / "journals"), "coordination": coordination,
                            "heartbeat_interval": 0.5, "lease": 60}
    if coordination == "server":
        node["coordination_dir"] = f"{handle.fresh_dir()}/cluster"
    path = tmp_path / "ftpbc.yaml"
    path.write_text(yaml.safe_dump({
        "node": node,
        "servers": {"srv": server},
        "endpoints": {"echo": {"server": "srv", "repository": f"{handle.fresh_dir()}/echo",
                               "handler": "tests.chaos:handler", "poll_interval": 0.05}},
    }, sort_keys=False), encoding="utf-8")
    return path


def _set_password(secret: Path, password: str) -> None:
    # Written whole under another name and renamed over the old one, as a secret is rotated:
    # a login never reads half a password.
    tmp = secret.with_name(secret.name + ".new")
    tmp.write_text(password + "\n", encoding="utf-8")
    tmp.chmod(0o600)
    os.replace(tmp, secret)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPBC_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _ftpbc(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*FTPBC, *args], cwd=REPO, env=env, capture_output=True, timeout=timeout)


def _status(config: Path, env: dict[str, str]) -> dict[str, Any]:
    done = _ftpbc(["status", "-c", str(config), "--json"], env)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _node(status: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((n for n in status["nodes"] if n["id"] == node_id), None)


def _wait_for_node(config: Path, env: dict[str, str], node_id: str,
                   condition: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """``node_id`` as ``ftpbc status --json`` lists it, once ``condition`` holds (deadline 60 s)."""
    found: dict[str, Any] = {}

    def check() -> bool:
        node = _node(_status(config, env), node_id)
        if node is None or not condition(node):
            return False
        found.update(node)
        return True

    wait_until(check, timeout=60, interval=0.2, what=what)
    return found


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM and wait; kill it if it does not exit (then fail)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"serve did not stop on SIGTERM:\n{log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]


# --------------------------------------------------------------------------- a refused login


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_serve_with_a_wrong_password_says_so_and_serves_once_the_file_is_right(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    wrong = "wrong-" + os.urandom(6).hex()
    config = _write_config(tmp_path, handle, wrong)
    env = _env()
    # A one-shot command does not retry: one line, at once, non-zero.
    quick = _ftpbc(["send", "-c", str(config), "echo", "--data", "x"], env)
    assert quick.returncode == 2 and quick.stderr.count(b"\n") == 1, quick.stderr
    assert b"AuthenticationFailed" in quick.stderr or b"login" in quick.stderr.lower(), quick.stderr
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([*FTPBC, "serve", "-c", str(config), "--node-id", "node-a",
                                  "--metrics-port", str(port)], cwd=REPO, env=env,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_until(lambda: "start-up: failed: AuthenticationFailed" in log.read_text(), timeout=30,
                   what="the refused login in the log")
        node = _wait_for_node(config, env, "node-a",
                              lambda n: (n["not_serving"] or "").startswith("AuthenticationFailed"),
                              "status to say node-a is not serving")
        assert node["alive"] and node["serves"] is None, node
        text = _ftpbc(["status", "-c", str(config)], env).stdout.decode()
        assert "    not serving: AuthenticationFailed" in text and "serves echo" not in text, text
        code, body = _get(f"http://127.0.0.1:{port}/readyz")
        assert code == 503 and "not serving: AuthenticationFailed" in body, body
        assert serve.poll() is None, log.read_text()

        _set_password(tmp_path / "pw", str(handle.password))
        wait_until(lambda: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=90,
                   interval=0.1, what=f"node-a to serve with the right password:\n{log.read_text()}")
        served = _ftpbc(["request", "-c", str(config), "echo", "--data", "up", "--timeout", "30"], env)
        assert served.returncode == 0 and served.stdout == b"re:up", served.stderr.decode()
        node = _wait_for_node(config, env, "node-a", lambda n: n["not_serving"] is None,
                              "status to say node-a serves")
        assert node["serves"] == {"endpoints": ["echo"], "transfers": []}, node
        text = log.read_text()
        assert text.count("start-up: failed") == 1, text  # one line per kind of failure
        assert wrong not in text and str(handle.password) not in text
    finally:
        _stop(serve, log)


def test_a_node_waits_through_refused_logins_with_server_coordination(
        pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """With ``coordination: server`` even the first question (is this node id live elsewhere?)
    needs a login: it is tried again too, and the node serves once the password is right."""
    config = load_config(_write_config(tmp_path, pyftpdlib_server, "wrong",
                                       coordination="server"), node_id="node-s")
    node = Node(config, {"echo": _echo})
    starter = threading.Thread(target=node.start, name="start")
    starter.start()
    try:
        wait_until(lambda: (node.not_serving or "").startswith("AuthenticationFailed"), timeout=30,
                   what="the refused login")
        [why] = not_ready(node)
        assert why.startswith("not serving: AuthenticationFailed") and not node.providers, why
        _set_password(tmp_path / "pw", str(pyftpdlib_server.password))
        wait_until(lambda: not starter.is_alive(), timeout=90, what="the start-up to succeed")
        assert node.not_serving is None and set(node.providers) == {"echo"}
        wait_until(lambda: (b := {x.node_id: x for x in node.runtime.coordination.heartbeats()}
                            .get("node-s")) is not None and b.serves == Serves(("echo",), ()),
                   timeout=30, what="the heartbeat to say what it serves")
    finally:
        node.interrupt()
        starter.join(timeout=60)
        assert not starter.is_alive()
        node.stop(drain_timeout=5)


# --------------------------------------------------------------------------- a killed node


@pytest.mark.parametrize("coordination", ["state_dir", "server"])
def test_status_shows_a_killed_node_dead_at_once(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                 coordination: str) -> None:
    config = _write_config(tmp_path, pyftpdlib_server, str(pyftpdlib_server.password),
                           coordination=coordination)
    env = _env()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([*FTPBC, "serve", "-c", str(config), "--node-id", "node-a"], cwd=REPO,
                                 env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        node = _wait_for_node(config, env, "node-a", lambda n: n["serves"] is not None,
                              f"node-a to serve ({log})")
        assert node["alive"] and node["pid"] == serve.pid and node["host"] == HOST, node
    finally:
        serve.kill()
        serve.wait(timeout=10)  # reaped: a zombie process still answers kill(pid, 0)
    status = _status(config, env)
    gone = _node(status, "node-a")
    assert gone is not None and gone["heartbeat_age"] < status["lease"], gone
    assert not gone["alive"] and gone["process_gone"], gone
    text = _ftpbc(["status", "-c", str(config)], env).stdout.decode()
    assert "DEAD   heartbeat" in text, text
    assert f"pid {serve.pid} host {HOST} (no such process on this host)" in text, text


# --------------------------------------------------------------------------- the pieces


def _dead_pid() -> int:
    """A pid no process of this host has now (a child that exited and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert not process_alive(child.pid)
    return child.pid


def test_beat_info_trusts_a_pid_only_on_this_host() -> None:
    dead = _dead_pid()
    here = beat_info("a", f"{dead} {time.time():.3f} {HOST}\n", 1.0, 60.0, host_field=2)
    assert not here.alive and here.process_gone
    elsewhere = beat_info("a", f"{dead} {time.time():.3f} not-{HOST}\n", 1.0, 60.0, host_field=2)
    assert elsewhere.alive and not elsewhere.process_gone
    live = beat_info("a", f"{os.getpid()} {time.time():.3f} {HOST}\n", 1.0, 60.0, host_field=2)
    assert live.alive and not live.process_gone
    old = beat_info("a", f"{os.getpid()} {time.time():.3f} {HOST}\n", 61.0, 60.0, host_field=2)
    assert not old.alive and not old.process_gone
    # the server's heartbeat: pid, host time, server time, host
    server = beat_info("a", f"{dead} 1.0 2.0 {HOST}\n", 1.0, 60.0, host_field=3)
    assert not server.alive and server.process_gone


def test_a_not_serving_heartbeat_lists_nothing_as_served(tmp_path: Path) -> None:
    beat = Heartbeat(tmp_path, "n", 1.0)
    beat.serves = Serves(("echo",), ())
    beat.not_serving = "AuthenticationFailed: 530 \"no\"\nsecond line é"
    beat.beat()
    text = beat.path.read_text(encoding="ascii")
    assert text.count("\n") == 2  # the reason stays on one line, in ASCII
    assert not_serving_reason(text) == beat.not_serving
    assert Serves.parse(text.split("\n")[1]) is None  # an older reader shows no endpoints
    info = beat_info("n", text, 0.0, 60.0, host_field=2)
    assert info.alive and info.serves is None and info.not_serving == beat.not_serving
    beat.not_serving = None
    beat.beat()
    info = beat_info("n", beat.path.read_text(), 0.0, 60.0, host_field=2)
    assert info.serves == Serves(("echo",), ()) and info.not_serving is None


def test_password_file_is_read_at_each_login(tmp_path: Path) -> None:
    """Each call reads the file again, with the load's checks; a failure names the server and
    the file, never what it holds."""
    secret = tmp_path / "pw"
    _set_password(secret, "first")
    path = tmp_path / "ftpbc.yaml"
    path.write_text(yaml.safe_dump({
        "node": {"id": "n", "state_dir": str(tmp_path / "s"), "journal_dir": str(tmp_path / "j")},
        "servers": {"srv": {"url": "ftp://u@127.0.0.1:1/", "password_file": str(secret)}},
        "endpoints": {"e": {"server": "srv", "repository": "/e"}}}))
    server = load_config(path).servers["srv"]
    assert server.password_value() == "first"
    _set_password(secret, "second")
    assert server.password_value() == "second"
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"servers\.srv: password_file: .* mode 0644") as err:
        server.password_value()
    assert "second" not in str(err.value)
    secret.unlink()
    with pytest.raises(ConfigError, match=r"servers\.srv: password_file: cannot read"):
        server.password_value()
    assert "second" not in repr(server) and "first" not in repr(server)
