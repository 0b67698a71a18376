"""deploy/systemd/: the unit passes ``systemd-analyze verify``, its example configuration loads,
and a real ``ftpbc serve`` speaks systemd's notify protocol as the unit expects (READY=1 only
once it serves, WATCHDOG=1 only while it heartbeats, STATUS= saying why not, STOPPING=1 when it
drains).  No systemd runs as PID 1 here: the test binds the notify socket itself."""

from __future__ import annotations

import queue
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import Heartbeat
from ftpbc.config.loader import load_config, parse_config
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.node.systemd import Notifier, notify_address, one_line, watchdog_warning
from tests.support import free_port, ftpbc_env, popen_ftpbc, require_binary

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "ftpbc@.service"
UNIT_CONFIG = ROOT / "deploy" / "systemd" / "ftpbc.yaml"


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, values in order (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def seconds(value: str) -> float:
    """A systemd time span of the forms the unit uses (``60``, ``30s``, ``2min``)."""
    for suffix, factor in (("min", 60.0), ("s", 1.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


# --------------------------------------------------------------------------- the unit file


def verify(unit_dir: Path, text: str, instance: str = "node-1") -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of ``text`` as ``ftpbc@<instance>.service``; its ExecStart
    binary must exist, so the path is pointed at an executable made in ``unit_dir``."""
    analyze = require_binary("systemd-analyze")
    binary = unit_dir / "bin" / "ftpbc"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    (unit_dir / "ftpbc@.service").write_text(text.replace("/usr/local/bin/ftpbc", str(binary)))
    return subprocess.run([analyze, "verify", str(unit_dir / f"ftpbc@{instance}.service")],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    """verify exits 0 even for an unknown key or a bad value (it only warns), so the test asks
    for no output at all, and shows on a broken copy that it would see one."""
    text = UNIT.read_text()
    done = verify(tmp_path / "good", text)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done
    broken = verify(tmp_path / "broken", text.replace("Type=notify", "Type=notfy\nWatchdogSek=30"))
    assert "notfy" in broken.stderr and "WatchdogSek" in broken.stderr, broken
    print(f"systemd-analyze verify: {UNIT.name} clean as ftpbc@node-1.service; a broken copy warned")


def test_the_unit_is_wired_to_what_ftpbc_serve_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Type=notify, the password as a credential only, a stop timeout above every drain_timeout
    and a watchdog between three heartbeats and the lease, for the configuration shipped with it
    (loaded by ftpbc's loader from the credentials directory the unit makes its working one)."""
    text = UNIT.read_text()
    unit = unit_settings(text)
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["LoadCredential"] == ["password:/etc/ftpbc/password"] and unit["WorkingDirectory"] == ["%d"]
    assert "--node-id %i" in unit["ExecStart"][0]
    assert not any(k.startswith(("Environment", "PassEnvironment")) for k in unit), "no secret in the env"
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "NoNewPrivileges": "yes", "CapabilityBoundingSet": "",
                       "SystemCallFilter": "@system-service"}.items():
        assert value in unit[key], (key, unit.get(key))
    assert unit["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]  # AF_UNIX: the notify socket
    assert "User" in unit or unit.get("DynamicUser") == ["yes"]

    # The credentials directory as systemd makes it: the password file, 0400.
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "password").write_text("secret\n")
    (creds / "password").chmod(0o400)
    monkeypatch.chdir(creds)
    config = load_config(UNIT_CONFIG, node_id="node-1")
    assert config.servers["exchange"].password is not None
    assert config.servers["exchange"].password.get_secret_value() == "secret"
    drains = [ep.drain_timeout for ep in config.endpoints.values()]
    stop, watchdog = seconds(unit["TimeoutStopSec"][0]), seconds(unit["WatchdogSec"][0])
    assert stop > max(drains), (stop, drains)
    # Above the lease: a node fenced by a server outage beats again once its lease is over, so
    # the watchdog ends only a node whose loops hang (docs/operating.md).
    assert 3 * config.node.heartbeat_interval <= watchdog
    assert config.node.lease < watchdog <= 2 * config.node.lease
    assert config.node.state_dir.is_absolute() and config.node.journal_dir.is_absolute()
    assert str(config.node.journal_dir).startswith(unit["ReadWritePaths"][0].split()[0])
    print(f"unit: TimeoutStopSec {stop:g} s > drain_timeout {max(drains):g} s; WatchdogSec {watchdog:g} s "
          f"in (lease {config.node.lease:g} s, 2 x lease]; "
          f"{UNIT_CONFIG.name} loads with the password from the credentials directory")


# --------------------------------------------------------------------------- the notify protocol


def test_notify_addresses_paths_and_the_abstract_namespace() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@sd-notify") == b"\0sd-notify"
    for bad in ("relative/path", "@", "vsock:2:1234"):
        with pytest.raises(ValueError, match="NOTIFY_SOCKET"):
            notify_address(bad)
    assert one_line("a\nb\tc") == "a b c" and len(one_line("x" * 5000)) <= 1000
    assert not Notifier({}).send("READY=1")  # no socket: nothing sent, nothing raised
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}).watchdog == 30.0
    other_pid = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
    assert Notifier(other_pid).watchdog is None
    assert watchdog_warning(None, 5.0) is None and watchdog_warning(15.0, 5.0) is None
    assert "WatchdogSec (10 s)" in (watchdog_warning(10.0, 5.0) or "")
    assert not Notifier({"NOTIFY_SOCKET": "@ftpbc-nobody-listens-" + secrets.token_hex(6)}).send("READY=1")


def test_heartbeat_observers_see_beats_and_holds_and_cannot_stop_it(tmp_path: Path) -> None:
    """What the watchdog is tied to: an observer hears None after each beat written and the
    reason while the heartbeat is held; one that raises does not stop the heartbeat."""
    why: list[str | None] = [None]
    heard: queue.Queue[str | None] = queue.Queue()
    beat = Heartbeat(tmp_path, "n1", 0.05, health=lambda: why[0])

    def broken(held: str | None) -> None:
        raise RuntimeError("observer bug")

    beat.observers += [broken, heard.put]
    beat.start()
    try:
        assert heard.get(timeout=10) is None
        why[0] = "poller x made no progress for 9 s"
        while (got := heard.get(timeout=10)) is None:
            pass
        assert got == why[0]
        written = beat.path.stat().st_mtime_ns
        why[0] = None
        while heard.get(timeout=10) is not None:
            pass
        assert beat.path.stat().st_mtime_ns >= written
    finally:
        beat.stop()


class NotifySocket:
    """A datagram socket bound as systemd binds $NOTIFY_SOCKET; collects every message."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(notify_address(address))
        self.sock.settimeout(0.2)
        self.messages: queue.Queue[tuple[float, dict[str, str]]] = queue.Queue()
        self.seen: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.put((time.monotonic(), fields))

    def wait_for(self, what: str, match: Callable[[dict[str, str]], bool], timeout: float,
                 proc: subprocess.Popen[bytes], log: Path) -> dict[str, str]:
        """The first message (after those already consumed) that ``match``es, within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                pytest.fail(f"no {what} within {timeout:g} s (node exit {proc.poll()}); messages: "
                            f"{self.seen[-10:]}\n{log.read_text()[-3000:]}")
            try:
                item = self.messages.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.seen.append(item)
            if match(item[1]):
                return item[1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    sock = NotifySocket("@ftpbc-test-" + secrets.token_hex(8))  # the abstract namespace
    yield sock
    sock.close()


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_serve_notifies_ready_watchdog_status_and_stopping(tmp_path: Path,
                                                           notify_socket: NotifySocket) -> None:
    """The life of a node under Type=notify, from the messages a real ``ftpbc serve`` sends:
    no READY=1 while its server is down (STATUS says why); READY=1 once it serves (/readyz 200,
    a request answered); WATCHDOG=1 per heartbeat; its server lost, the heartbeat stops and so
    does WATCHDOG=1 (STATUS says why); the server back, both resume; SIGTERM: STOPPING=1, exit 0."""
    password = secrets.token_hex(8)
    (tmp_path / "ftp").mkdir()
    server = EmbeddedFTPServer(tmp_path / "ftp", password=password, port=free_port())
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "deploy_echo.py").write_text(
        "def echo(message):\n    return b're:' + message.body\n")
    pw = tmp_path / "password"
    pw.write_text(password)
    pw.chmod(0o600)
    metrics_port = free_port()
    cfg_text = yaml.safe_dump({
        "node": {"state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "journals"),
                 "handler_path": [str(tmp_path / "handlers")], "heartbeat_interval": 0.2, "lease": 8.0,
                 "metrics": {"port": metrics_port}},
        "servers": {"s": {"url": server.url, "password_file": str(pw), "timeout": 2}},
        "endpoints": {"echo": {"server": "s", "repository": "/ex/echo", "handler": "deploy_echo:echo",
                               "poll_interval": 0.05, "timeout": 20, "drain_timeout": 5}}})
    cfg = tmp_path / "ftpbc.yaml"
    cfg.write_text(cfg_text)
    log = tmp_path / "serve.log"
    env = ftpbc_env({"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "3000000"})
    env.pop("WATCHDOG_PID", None)
    proc = popen_ftpbc("serve", "-c", str(cfg), "--node-id", "n1", log=log, env=env)
    client: Client | None = None
    try:
        def wait(what: str, match: Callable[[dict[str, str]], bool], timeout: float = 60) -> dict[str, str]:
            return notify_socket.wait_for(what, match, timeout, proc, log)

        # 1. The server is not up yet: the start-up fails, says why, and READY=1 is not sent.
        down = wait("STATUS=not serving: <why>", lambda m: m.get("STATUS", "").startswith("not serving: ")
                    and "starting:" not in m["STATUS"])
        assert "Connection refused" in down["STATUS"] or "refused" in down["STATUS"].lower(), down
        assert not any("READY" in m for _, m in notify_socket.seen), notify_socket.seen
        assert readyz(metrics_port) == 503

        # 2. The server up: READY=1 once the node serves, and it does.
        server.start()
        ready = wait("READY=1", lambda m: m.get("READY") == "1")
        assert ready["STATUS"].startswith("serving echo as node n1"), ready
        assert readyz(metrics_port) == 200
        client = Client(parse_config(cfg_text, node_id="probe"))
        assert client.request("echo", b"hi", timeout=20) == b"re:hi"
        for _ in range(3):
            wait("WATCHDOG=1", lambda m: m.get("WATCHDOG") == "1", timeout=20)
        client.close()
        client = None

        # 3. The server lost: the loops make no progress for half the lease (2 x the server's
        # timeout is no more, so a failing step gets no longer), the heartbeat stops, and
        # WATCHDOG=1 with it; each held beat says why (the reason's age changes, so STATUS is
        # sent again).  Until the server is back, or the lease runs out (the node is fenced,
        # its poller idles, and it beats again): not before 2/3 of the lease after its last beat.
        server.stop()
        first = wait("STATUS=heartbeat stopped",
                     lambda m: m.get("STATUS", "").startswith("heartbeat stopped:"))
        assert "echo made no progress" in first["STATUS"], first  # its poller or sweeper
        mark = len(notify_socket.seen)
        for _ in range(2):  # the held reason's age, rounded, changes twice: over a second held
            wait("another STATUS=heartbeat stopped",
                 lambda m: m.get("STATUS", "").startswith("heartbeat stopped:") or m.get("WATCHDOG") == "1",
                 timeout=20)
        held = notify_socket.seen[mark:]
        assert not any(m.get("WATCHDOG") for _, m in held), held
        print(f"server lost: heartbeat held, STATUS {first['STATUS']!r} then {held[-1][1]['STATUS']!r} "
              f"{held[-1][0] - notify_socket.seen[mark - 1][0]:.1f} s later, no WATCHDOG=1 between")

        # 4. The server back: the heartbeat and WATCHDOG=1 resume, STATUS says it serves.
        server.start()
        wait("WATCHDOG=1 again", lambda m: m.get("WATCHDOG") == "1", timeout=60)
        wait("STATUS=serving again", lambda m: m.get("STATUS", "").startswith("serving echo"), timeout=20)

        # 5. SIGTERM: STOPPING=1 as the drain begins, then a clean exit.
        proc.send_signal(signal.SIGTERM)
        stopping = wait("STOPPING=1", lambda m: m.get("STOPPING") == "1", timeout=30)
        assert stopping.get("STATUS") == "draining"
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        kinds = sorted({k for _, m in notify_socket.seen for k in m})
        print(f"notify messages seen: {len(notify_socket.seen)}, keys {kinds}; READY=1 only after "
              f"the start-up succeeded; exit 0 after STOPPING=1")
    finally:
        if client is not None:
            client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        server.stop()
        shutil.rmtree(tmp_path / "ftp", ignore_errors=True)
