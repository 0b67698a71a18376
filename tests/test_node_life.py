"""A node never dies silently, stops when told, keeps its identity, and rides out what real
servers do: supervised loops, shutdown that hands work back, a stable identity, start-up that
waits for its server, and servers that limit sessions."""

from __future__ import annotations

import errno
import ftplib
import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import is_dead
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.errors import ConfigError
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.chaos import (
    SLEEP_CAP_ENV,
    Cluster,
    NodeProcess,
    load_client_config,
    make_cluster,
    read_invocations,
)
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
FTPBC = [sys.executable, "-c", "from ftpbc.cli import main; main()"]
#: ftpbc started with SIGINT ignored, as a non-interactive shell starts its background jobs
FTPBC_INT_IGNORED = [sys.executable, "-c",
                     "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                     "os.execv(sys.executable, [sys.executable, '-c', 'from ftpbc.cli import main; main()', "
                     "*sys.argv[1:]])"]
#: how long one ftpbc command may take, start-up included: seconds idle, but tens of seconds on
#: a 2-core machine loaded to 12 (each command imports ftpbc afresh); it only catches hangs
COMMAND_DEADLINE = 120


def _stuck(proc: subprocess.Popen[bytes]) -> str:
    """What a command that did not end was doing: its signal masks and, where py-spy is
    installed, its threads' stacks (then it is killed)."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        sigs = " ".join(line for line in status.splitlines()
                        if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        sigs = "no /proc status"
    try:
        stack = subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                               timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        stack = f"no stack: {exc}"
    proc.kill()
    proc.wait(timeout=10)
    return f"pid {proc.pid} did not end: {sigs}\n{stack}"


def _run_command(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run(argv, capture_output=True)`` within COMMAND_DEADLINE; on a hang the
    failure says what the command was doing."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=COMMAND_DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(_stuck(proc))
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _echo(message: Message) -> bytes:
    return b"re:" + message.body


def _node_config(handle: ServerHandle, tmp_path: Path, node_id: str, **node: Any) -> Any:
    """A node or client of endpoint ``ep`` in this test's own area (one per tmp_path)."""
    marker = tmp_path / "area"
    if not marker.exists():
        marker.write_text(handle.fresh_dir())
    base = marker.read_text()
    cfg = in_process_config(handle, tmp_path, node_id, {"ep": {"repository": f"{base}/ep",
                                                              "poll_interval": 0.02, "timeout": 20}})
    return cfg.model_copy(update={"node": cfg.node.model_copy(update=node)})


@pytest.fixture
def started(things: list[Any]) -> list[Any]:
    """Nodes and clients to stop at the end of a test, whatever happened (conftest's ``things``)."""
    return things


# --------------------------------------------------------------------------- supervision


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ESTALE, errno.EMFILE])
def test_poll_lock_errors_are_ridden_out_and_the_node_keeps_serving(
        pyftpdlib_server: ServerHandle, tmp_path: Path, started: list[Any], code: int,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A flock that fails (an NFS mount without locks, a stale handle, no descriptors left) for
    a while: the poller logs it once, backs off, and serves again once the lock works; its
    heartbeat stays fresh meanwhile (the outage is shorter than half the lease)."""
    failures = {"left": 5}
    real = PollLock.attempt

    def flaky(self: PollLock, wait: float = 0.0) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OSError(code, os.strerror(code))
        return real(self, wait)

    monkeypatch.setattr(PollLock, "attempt", flaky)
    caplog.set_level(logging.WARNING)
    cfg = _node_config(pyftpdlib_server, tmp_path, "prov", heartbeat_interval=0.2, lease=10.0)
    node = Node(cfg, handlers={"ep": _echo})
    started.append(node)
    node.start()
    client = Client(_node_config(pyftpdlib_server, tmp_path, "cli"))
    started.append(client)
    assert client.request("ep", b"after the outage") == b"re:after the outage"
    assert failures["left"] == 0
    lines = [r for r in caplog.records if os.strerror(code) in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # logged once, repeats counted
    assert not is_dead(Path(cfg.node.state_dir), "prov", cfg.node.lease)


def test_a_poller_that_cannot_work_stops_the_heartbeat_and_another_node_takes_over(
        pyftpdlib_server: ServerHandle, tmp_path: Path, started: list[Any],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A poll lock that keeps failing: the node says its heartbeat stopped, other nodes see it
    dead after the lease and serve its endpoint; never a live heartbeat over a dead poller."""
    def broken(wait: float = 0.0) -> Any:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    caplog.set_level(logging.WARNING)
    cfg = _node_config(pyftpdlib_server, tmp_path, "stuck", heartbeat_interval=0.1, lease=1.0)
    stuck = Node(cfg, handlers={"ep": _echo})
    started.append(stuck)
    stuck.start()
    monkeypatch.setattr(stuck.providers["ep"].poll_lock, "attempt", broken)  # this node's lock only
    state = Path(cfg.node.state_dir)
    wait_until(lambda: is_dead(state, "stuck", cfg.node.lease), timeout=20, what="the heartbeat to stop")
    assert any("heartbeat stopped" in r.getMessage() and "poller ep" in r.getMessage()
               for r in caplog.records)
    other = Node(_node_config(pyftpdlib_server, tmp_path, "other", heartbeat_interval=0.1, lease=1.0),
                 handlers={"ep": _echo})
    started.append(other)
    other.start()
    client = Client(_node_config(pyftpdlib_server, tmp_path, "cli", heartbeat_interval=0.1, lease=1.0))
    started.append(client)
    assert client.request("ep", b"served elsewhere") == b"re:served elsewhere"
    assert stuck.providers["ep"].stats.served == 0


def test_a_journal_that_cannot_be_written_hands_the_claim_back(
        pyftpdlib_server: ServerHandle, tmp_path: Path, started: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk under the journal (JournalError when the result is recorded): the request goes
    back to the inbox instead of sitting in inselect for good, and is served once the journal
    works again; the handler's first result was never delivered."""
    from ftpbc.errors import JournalError
    from ftpbc.exchange.lifecycle import Lifecycle

    failures = {"left": 1}
    real = Lifecycle.write_served

    def full_disk(self: Lifecycle, claimed: Any, result: Any, **kw: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise JournalError("journal: No space left on device")
        return real(self, claimed, result, **kw)

    monkeypatch.setattr(Lifecycle, "write_served", full_disk)
    cfg = _node_config(pyftpdlib_server, tmp_path, "prov", heartbeat_interval=0.2, lease=10.0)
    cfg = cfg.model_copy(update={"endpoints": {"ep": cfg.endpoints["ep"].model_copy(
        update={"redelivery_delay": 0.0})}})
    calls: list[bytes] = []
    node = Node(cfg, handlers={"ep": lambda m: (calls.append(m.body), b"ok")[1]})
    started.append(node)
    node.start()
    client = Client(_node_config(pyftpdlib_server, tmp_path, "cli"))
    started.append(client)
    assert client.request("ep", b"x") == b"ok"
    assert calls == [b"x", b"x"]  # run again: its first result was never recorded, so never sent


# A heartbeat that cannot be written (state_dir made immutable under a running node): the node
# fences itself and claims nothing until it can again (tests/test_lease.py).


# --------------------------------------------------------------------------- shutdown


@pytest.fixture
def slow_cluster(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Cluster:
    return make_cluster(tmp_path / "w", url=pyftpdlib_server.url, password=pyftpdlib_server.password,
                        options=pyftpdlib_server.options, repository=pyftpdlib_server.fresh_dir(),
                        server_root=pyftpdlib_server.root, lease=60.0, heartbeat=1.0, workers=2,
                        drain_timeout=2.0)


def test_sigterm_hands_unfinished_work_back_at_once_and_exits(slow_cluster: Cluster) -> None:
    """Handlers of 20 s, drain_timeout 2: SIGTERM ends the process well before the handlers
    would, another node answers both requests without waiting for the 60 s lease, and a
    handler whose result was recorded is never run again."""
    cluster = slow_cluster
    with Client(load_client_config(cluster, "checker"), connections=2) as checker:
        slow, live = NodeProcess(cluster, "slow"), NodeProcess(cluster, "live")
        try:
            uids = [checker.submit("echo", b"sleep:20:a"), checker.submit("echo", b"sleep:20:b")]
            slow.start()
            wait_until(lambda: all(read_invocations(cluster.handler_logs()).starts[u] == 1 for u in uids),
                       timeout=30, what="both handlers to start on the slow node")
            assert slow.proc is not None
            slow.proc.send_signal(signal.SIGTERM)
            # 20 s handlers: an exit well before them means the node did not wait for them
            assert slow.proc.wait(timeout=12) == 0, slow.log.read_text()[-3000:]
            log = slow.log.read_text()
            assert "draining 2 in-flight message(s)" in log and "returned 2 unfinished claim(s)" in log
            assert "node slow stopped" in log
            live.start(**{SLEEP_CAP_ENV: "0"})
            # answered long before the 60 s lease could have returned the claims
            for uid, body in zip(uids, (b"a", b"b"), strict=True):
                assert checker.collect("echo", uid, timeout=30) == b"re:sleep:20:" + body
        finally:
            slow.kill()
            assert live.stop() == 0
    inv = read_invocations(cluster.handler_logs())
    assert all(inv.recorded[u] == 1 for u in uids)  # only the live node's results were recorded
    assert cluster.leftovers() == {}


def test_a_second_signal_exits_at_once(slow_cluster: Cluster) -> None:
    cluster = slow_cluster
    with Client(load_client_config(cluster, "checker"), connections=2) as checker:
        node = NodeProcess(cluster, "n1")
        try:
            uid = checker.submit("echo", b"sleep:20:x")
            node.start()
            wait_until(lambda: read_invocations(cluster.handler_logs()).starts[uid] == 1, timeout=30,
                       what="the handler to start")
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: "draining 1" in node.log.read_text(), timeout=10, what="the drain")
            node.proc.send_signal(signal.SIGTERM)
            assert node.proc.wait(timeout=5) == 130
            assert "second signal" in node.log.read_text()
        finally:
            node.kill()


# --------------------------------------------------------------------------- identity


def test_a_node_restarted_without_node_id_replays_its_journal(pyftpdlib_server: ServerHandle,
                                                               tmp_path: Path) -> None:
    """No node id anywhere: the default (the host name) is the same after a restart, so the
    restarted node finishes what its predecessor recorded instead of leaving it."""
    cluster = make_cluster(tmp_path / "w", url=pyftpdlib_server.url, password=pyftpdlib_server.password,
                           options=pyftpdlib_server.options, repository=pyftpdlib_server.fresh_dir(),
                           server_root=pyftpdlib_server.root)
    with Client(load_client_config(cluster, "checker"), connections=2) as checker:
        uid = checker.submit("echo", b"once")
        env = cluster.env(crash_at="serve.after-result")
        crashed = subprocess.run([*FTPBC, "serve", "-c", str(cluster.config)], cwd=REPO, env=env,
                                 capture_output=True, timeout=COMMAND_DEADLINE)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
        log = cluster.workdir / "restart.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([*FTPBC, "serve", "-c", str(cluster.config)], cwd=REPO,
                                    env=cluster.env(), stdout=out, stderr=out)
        try:
            assert checker.collect("echo", uid, timeout=30) == b"re:once"
            wait_until(lambda: "finished: recorded result delivered" in log.read_text(), timeout=10,
                       what="the restarted node to say it replayed its journal")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


def test_a_node_id_live_on_another_host_is_refused(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    cfg = _node_config(pyftpdlib_server, tmp_path, "twin")
    beats = Path(cfg.node.state_dir) / "heartbeats"
    beats.mkdir(parents=True)
    (beats / "twin").write_text(f"4242 {time.time():.3f} another-host\n")
    node = Node(cfg, handlers={"ep": _echo})
    with pytest.raises(ConfigError, match=r"node id 'twin' is live on host another-host"):
        node.start()
    node.runtime.close()


def test_cli_clients_have_their_own_identity_reused_across_runs(pyftpdlib_server: ServerHandle,
                                                                 tmp_path: Path) -> None:
    """With the configuration's node id in use by a serving node, ``ftpbc request`` still works
    (it is <id>.client0, not the node), and two runs leave one client journal, not two."""
    cluster = make_cluster(tmp_path / "w", url=pyftpdlib_server.url, password=pyftpdlib_server.password,
                           options=pyftpdlib_server.options, repository=pyftpdlib_server.fresh_dir(),
                           server_root=pyftpdlib_server.root)
    doc = yaml.safe_load(cluster.config.read_text())
    doc["node"]["id"] = "node-a"
    cluster.config.write_text(yaml.safe_dump(doc))
    node = NodeProcess(cluster, "node-a")
    node.start()
    try:
        wait_until(node.ready, timeout=30, what="the node to serve")
        for body in ("one", "two"):
            r = subprocess.run([*FTPBC, "request", "-c", str(cluster.config), "echo", "--data", body],
                               cwd=REPO, env=cluster.env(), capture_output=True, timeout=COMMAND_DEADLINE)
            assert r.returncode == 0, r.stderr.decode()
            assert r.stdout == b"re:" + body.encode()
    finally:
        assert node.stop() == 0
    assert sorted(p.name for p in cluster.journal_dir.iterdir()) == ["node-a", "node-a.client0"]


# --------------------------------------------------------------------------- start-up


def test_serve_waits_for_an_unreachable_server_and_serves_once_it_is_up(tmp_path: Path) -> None:
    """``ftpbc serve`` against a port where nothing listens yet keeps trying (one log line per
    kind of failure) and serves as soon as the server starts; one-shot commands fail fast."""
    port = free_port()
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "pw").write_text("secret\n")
    (tmp_path / "pw").chmod(0o600)
    cfg = tmp_path / "ftpbc.yaml"
    cfg.write_text(yaml.safe_dump({
        "node": {"id": "n1", "state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "j")},
        "servers": {"s": {"url": f"ftp://u@127.0.0.1:{port}", "password_file": str(tmp_path / "pw"),
                          "timeout": 2}},
        "endpoints": {"echo": {"server": "s", "repository": "/q", "handler": "tests.chaos:handler",
                               "poll_interval": 0.05}}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    quick = subprocess.run([*FTPBC, "send", "-c", str(cfg), "echo", "--data", "x"], cwd=REPO, env=env,
                           capture_output=True, timeout=COMMAND_DEADLINE)
    assert quick.returncode == 2 and quick.stderr.count(b"\n") == 1, quick.stderr
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([*FTPBC, "serve", "-c", str(cfg)], cwd=REPO, env=env, stdout=out, stderr=out)
    ftpd: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: "start-up: failed" in log.read_text(), timeout=30, what="the first failure")
        assert serve.poll() is None, log.read_text()
        ftpd = subprocess.Popen([*FTPBC, "ftpd", "--root", str(root), "--port", str(port), "--user",
                                 "u:secret"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_until(lambda: " serving echo " in log.read_text(), timeout=60, what="the node to serve")
        r = subprocess.run([*FTPBC, "request", "-c", str(cfg), "echo", "--data", "up"], cwd=REPO, env=env,
                           capture_output=True, timeout=COMMAND_DEADLINE)
        assert r.stdout == b"re:up", r.stderr.decode()
        assert log.read_text().count("start-up: failed") == 1  # one line per kind of failure
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0, log.read_text()[-2000:]
        if ftpd is not None:
            ftpd.terminate()
            ftpd.wait(timeout=10)


# --------------------------------------------------------------------------- interrupted requests


def test_an_interrupted_request_is_withdrawn(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) or SIGTERM on ``ftpbc request`` with no provider: the request leaves the
    inbox before the command exits, as a timeout's does.  Also when the command was started with
    SIGINT ignored (a background job of a script: Python then installs no handler of its own)."""
    cluster = make_cluster(tmp_path / "w", url=pyftpdlib_server.url, password=pyftpdlib_server.password,
                           options=pyftpdlib_server.options, repository=pyftpdlib_server.fresh_dir(),
                           server_root=pyftpdlib_server.root)
    for sig, start in ((signal.SIGINT, FTPBC), (signal.SIGTERM, FTPBC), (signal.SIGINT, FTPBC_INT_IGNORED)):
        proc = subprocess.Popen([*start, "request", "-c", str(cluster.config), "echo", "--data", "q",
                                 "--timeout", "600"], cwd=REPO, env=cluster.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            wait_until(lambda: len(cluster.files("inbox")) == 1, timeout=COMMAND_DEADLINE, what="the request")
            proc.send_signal(sig)
            try:
                _, err = proc.communicate(timeout=COMMAND_DEADLINE)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{sig!r}: " + _stuck(proc))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert proc.returncode == 130, err.decode()
        assert b"withdrawn" in err
        assert cluster.files("inbox") == []


@pytest.mark.parametrize("point", ["send.after-put", "send.after-expose"])
@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_request_interrupted_while_it_is_sent_is_withdrawn(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                             point: str, sig: str) -> None:
    """The interrupt arrives inside the send itself (after the staged upload, after the rename
    into place, before the send returns): the command still exits 130 with no request left in
    the inbox, and a recovery afterwards leaves nothing staged or pending."""
    cluster = make_cluster(tmp_path / "w", url=pyftpdlib_server.url, password=pyftpdlib_server.password,
                           options=pyftpdlib_server.options, repository=pyftpdlib_server.fresh_dir(),
                           server_root=pyftpdlib_server.root)
    env = cluster.env(FTPBC_CRASH_AT=point, FTPBC_CRASH_SIGNAL=sig)
    done = _run_command([*FTPBC, "request", "-c", str(cluster.config), "echo", "--data", "q",
                         "--timeout", "600"], env)
    assert done.returncode == 130, done.stderr.decode()
    assert b"withdrawn" in done.stderr
    assert cluster.files("inbox") == []
    recovered = subprocess.run([*FTPBC, "recover", "-c", str(cluster.config)], cwd=REPO, env=cluster.env(),
                               capture_output=True, timeout=COMMAND_DEADLINE)
    assert recovered.returncode == 0, recovered.stderr.decode()
    assert cluster.leftovers() == {}
    assert cluster.pending() == {}


# --------------------------------------------------------------------------- servers that limit


@pytest.mark.parametrize("kind", ["proftpd_limited", "pureftpd_limited"])
def test_a_server_that_limits_sessions_answers_every_request(request: pytest.FixtureRequest, kind: str,
                                                             tmp_path: Path, started: list[Any],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """ProFTPD with MaxClientsPerHost 6 and five passive ports, pure-ftpd with -C 6: a node and a
    client of eight threads (more sessions than the server allows, together) answer 300 of 300
    requests; the pools shrink to what the server allows, and no limit is called a password."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    caplog.set_level(logging.WARNING)
    # Three of the six sessions held elsewhere on this host: node and client must make do with
    # three between them, whatever the timing.
    held = [ftplib.FTP() for _ in range(3)]
    for ftp in held:
        ftp.connect(handle.config().host, handle.config().port, timeout=10)
        ftp.login(handle.config().user or "", handle.password or "")
    started.extend(_Closing(ftp) for ftp in held)
    cfg = _node_config(handle, tmp_path, "prov")
    node = Node(cfg, handlers={"ep": _echo})
    started.append(node)
    node.start()
    client = Client(_node_config(handle, tmp_path, "cli"))
    started.append(client)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: client.request("ep", f"m{i}", timeout=60), range(300)))
    assert answers == [f"re:m{i}".encode() for i in range(300)]
    assert any("pool shrunk" in r.getMessage() for r in caplog.records)
    assert not any("AuthenticationFailed" in r.getMessage() or "login refused" in r.getMessage()
                   for r in caplog.records)


class _Closing:
    """A plain FTP session the ``started`` fixture closes."""

    def __init__(self, ftp: ftplib.FTP) -> None:
        self.ftp = ftp

    def close(self) -> None:
        self.ftp.close()
