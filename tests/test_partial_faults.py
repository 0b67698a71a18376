"""Partial faults across hosts: partitions, pauses, slow and lossy links, server restarts, kills.

Three ``ftpbc serve`` nodes on three hosts (network namespaces, ``tests/hosts.py``) with
``coordination: server``, a 6 s lease and a 1 s heartbeat; vsftpd on a host of its own; eight
clients in the root namespace.  Every FTP connection, the nodes' and the clients', passes
through a relay with one route per host (``tests/faults_net.py``), which can delay, stall and
reset it.  A nemesis injects one fault at a time, waiting after each until every node beats
again; then the checker (``tests/partial_faults.py``) classifies every request and every
handler run.  docs/faults.md describes what is injected and what must hold.

The run prints the counts (sent, answered once, errors to the caller, re-runs by cause) and the
throughput under faults beside a fault-free baseline of the same cluster.
"""

from __future__ import annotations

import ftplib
import io
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos import REPO, NodeProcess, make_cluster
from tests.faults_net import LinkFault, RelayProcess
from tests.hosts import Host, Network, host_node_config, reaches, require_netns, vsftpd_in
from tests.partial_faults import (
    FaultEvent,
    Faults,
    Run,
    Step,
    coordination_dir,
    find_reruns,
    read_runs,
    rerun_after_staged,
    route_configs,
    run_partial_faults,
    server_history,
)
from tests.servers.handle import ServerHandle
from tests.servers.vsftpd import VsftpdProcess, running_vsftpd
from tests.support import require_binary, wait_until

#: node id -> the host it runs on
NODES = {"n0": "h0", "n1": "h1", "n2": "h2"}
LEASE = 6.0
HEARTBEAT = 1.0
#: a partition or pause this long outlasts the lease: the node's claims are taken from it
PAST_LEASE = 10.0
#: per FTP command: a partitioned node's command fails after this, not after the default 30 s;
#: the largest the lease covers (lease >= 3 x heartbeat + timeout: ftpbc check's rule)
SERVER_TIMEOUT = 3.0
LOCK_EXPIRY = 6.0
BASELINE = 300
FAULT_REQUESTS = 1000
CLIENTS = 8
#: long enough for a request claimed by a node cut off past the lease to be served elsewhere
COLLECT_TIMEOUT = 120.0

#: one fault at a time, each kind at least twice, on every node; an ``-after-upload`` fault
#: strikes right after the server has the node's whole response, before the node commits it
SCHEDULE = [
    Step("partition", "n0", PAST_LEASE),
    Step("link-delay", "n1", 8.0),
    Step("pause", "n2", PAST_LEASE),
    Step("server-delay", "server", 8.0),
    Step("server-restart", "server", 0.0),
    Step("kill", "n1", 0.0),
    Step("partition-after-upload", "n2", PAST_LEASE),
    Step("pause-after-upload", "n0", PAST_LEASE),
    Step("kill-after-upload", "n1", PAST_LEASE),  # down past the lease before it restarts
    Step("link-delay", "n0", 8.0),
    Step("server-restart", "server", PAST_LEASE),  # an outage past the lease
    Step("kill", "n0", 0.0),
]


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    require_netns()
    with Network(["server", *NODES.values()]) as net:
        yield net


def logging_vsftpd_in(host: Host) -> type[VsftpdProcess]:
    """The namespaced vsftpd of tests/hosts.py, logging every upload, rename and delete."""

    class LoggingVsftpd(vsftpd_in(host)):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            self.config.write_text(self.config.read_text().replace("xferlog_enable=NO", "xferlog_enable=YES"))
            super().start()

    return LoggingVsftpd


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults-vsftpd")


@pytest.fixture(scope="module")
def server(network: Network, server_log: Path) -> Iterator[ServerHandle]:
    server_host = network.hosts["server"]
    binary = require_binary("vsftpd", "/usr/sbin/vsftpd")
    for tool in ("useradd", "userdel", "chpasswd"):
        require_binary(tool, f"/usr/sbin/{tool}")
    with running_vsftpd(binary, server_log, label="faults", process_class=logging_vsftpd_in(server_host),
                        address=server_host.address) as v:
        handle = v.handle("vsftpd", host=server_host.address)
        port = int(handle.url.rsplit(":", 1)[1].rstrip("/"))
        # a bridge just built may take a moment to pass traffic
        wait_until(lambda: all(reaches(network.hosts[h], server_host.address, port) for h in NODES.values()),
                   timeout=15, interval=0.5, what="every node host to reach the server")
        yield handle


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_request_lost_or_answered_twice_under_partial_faults(
        network: Network, server: ServerHandle, server_log: Path, tmp_path: Path,
        report_figures: Callable[[str], None]) -> None:
    seed = int(os.environ.get("PARTIAL_FAULTS_SEED") or random.randrange(1 << 30))
    server_host = network.hosts["server"]
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    cluster = make_cluster(tmp_path / "w", url=server.url, password=server.password, options=server.options,
                           repository=server.fresh_dir(), server_root=server.root, lease=LEASE,
                           heartbeat=HEARTBEAT, node=host_node_config(server.fresh_dir()),
                           hosts={n: network.hosts[h].command([]) for n, h in NODES.items()})
    heartbeats = server.local(coordination_dir(cluster)) / "heartbeats"

    def beat_time(node_id: str) -> float | None:
        try:
            return (heartbeats / node_id).stat().st_mtime
        except FileNotFoundError:
            return None

    listener = getattr(server.controls["restart"], "__self__", None)
    with RelayProcess(network.gateway, (server_host.address, port), [*NODES, "clients"], seed=seed,
                      log=tmp_path / "relay.log", cwd=REPO) as relay:
        route_configs(cluster, relay, server_timeout=SERVER_TIMEOUT, lock_expiry=LOCK_EXPIRY)
        nodes = {n: NodeProcess(cluster, n) for n in NODES}
        faults = Faults(nodes, {n: network.hosts[h].netns for n, h in NODES.items()}, relay,
                        server.controls["restart"], getattr(listener, "stop", None),
                        getattr(listener, "start", None), server_log=server_log / "vsftpd.log",
                        repository=cluster.repository)
        result = run_partial_faults(cluster, relay, faults, SCHEDULE, beat_time=beat_time, seed=seed,
                                    baseline=BASELINE, fault_requests=FAULT_REQUESTS, clients=CLIENTS,
                                    collect_timeout=COLLECT_TIMEOUT, server_log=server_log / "vsftpd.log")
    report = result.report()
    report_figures(f"partial faults (seed {seed}):\n{report}")
    v = result.verdict
    # The nodes served through the relay, the faults were all injected.
    assert [f"{s.kind} {s.target}" for s in SCHEDULE] == [e.label() for e in result.events], report
    assert all(e.note.startswith("aimed:") for e in result.events if e.kind.endswith("-after-upload")), report
    assert v.sent >= BASELINE + FAULT_REQUESTS, report
    problems = v.violations()
    assert not problems, "\n".join(problems) + "\n" + report
    assert v.answered_once + len(v.errors_to_caller) + v.indeterminate_absent == v.sent, report


# ---------------------------------------------------------------------- the harness itself


def _ftp_through(relay: RelayProcess, handle: ServerHandle) -> ftplib.FTP:
    ftp = ftplib.FTP()
    ftp.connect("127.0.0.1", relay.ports["r"], timeout=10)
    ftp.login(handle.url.split("://", 1)[1].split("@", 1)[0], handle.password or "")
    return ftp


def test_the_relay_forwards_commands_and_both_passive_modes_and_injects_its_faults(
        pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    handle = pyftpdlib_server
    host, port = handle.url.split("@", 1)[1].rstrip("/").rsplit(":", 1)
    base = handle.fresh_dir()
    with RelayProcess("127.0.0.1", (host, int(port)), ["r"], seed=1, log=tmp_path / "relay.log",
                      cwd=REPO) as relay:
        ftp = _ftp_through(relay, handle)
        body = os.urandom(200_000)
        ftp.storbinary(f"STOR {base}/pasv", io.BytesIO(body))  # ftplib uses PASV on IPv4
        assert handle.local(f"{base}/pasv").read_bytes() == body
        # EPSV, as ftpbc uses it (ftplib asks it for IPv6, and connects to the control peer).
        ftp.af = socket.AF_INET6
        got = io.BytesIO()
        ftp.retrbinary(f"RETR {base}/pasv", got.write)
        assert got.getvalue() == body
        stats = relay.stats()["r"]
        # Both transfers went through the relay (unrewritten, they would have gone around it).
        assert stats["data_connections"] == 2 and stats["bytes"] >= 2 * len(body)

        relay.set_fault("r", LinkFault(delay=0.1))
        began = time.monotonic()
        ftp.voidcmd("NOOP")
        assert time.monotonic() - began >= 0.2  # the command and its reply each waited 0.1 s
        # A held reply: only the transfer's completion waits, the commands around it do not.
        relay.set_fault("r", LinkFault(held_replies=("226 ",), hold=0.2))
        held_before = relay.stats()["r"]["delayed_s"]
        ftp.voidcmd("NOOP")
        assert relay.stats()["r"]["delayed_s"] == held_before
        began = time.monotonic()
        ftp.storbinary(f"STOR {base}/held", io.BytesIO(b"x"))
        assert time.monotonic() - began >= 0.2
        assert relay.stats()["r"]["delayed_s"] == pytest.approx(held_before + 0.2)
        relay.set_fault("r", LinkFault(reset_p=1.0))
        with pytest.raises((OSError, EOFError, ftplib.Error)):
            ftp.voidcmd("NOOP")
        assert relay.stats()["r"]["resets"] >= 1
        relay.set_fault("r", None)
        _ftp_through(relay, handle).quit()  # healed: new sessions pass again


def _vsftpd_line(op: str, what: str) -> str:
    return f'Fri Nov 27 22:28:39 2026 [pid 1] [u] OK {op}: Client "10.0.0.1", "{what}"'


def test_the_server_history_finds_a_request_taken_from_a_node_after_its_result_was_uploaded(
        tmp_path: Path) -> None:
    r, u, v, w = ("/t-x", "11111111-2222-3333-4444-555555555555", "66666666-2222-3333-4444-555555555555",
                  "77777777-2222-3333-4444-555555555555")
    log = tmp_path / "vsftpd.log"
    log.write_text("\n".join([
        # u: claimed by n1, its response uploaded whole, then returned to the inbox: a violation
        _vsftpd_line("RENAME", f"{r}/inbox/req.{u} {r}/inselect/req.{u}~n1"),
        _vsftpd_line("UPLOAD", f"{r}/outstage/resp.{u}~n1=23") + ", 23 bytes, 1.00Kbyte/sec",
        _vsftpd_line("RENAME", f"{r}/inselect/req.{u}~n1 {r}/inbox/req.{u};n=1"),
        _vsftpd_line("RENAME", f"{r}/inbox/req.{u};n=1 {r}/inselect/req.{u};n=1~n2"),
        _vsftpd_line("RENAME", f"{r}/inselect/req.{u};n=1~n2 {r}/inarchive/req.{u};n=1~n2~20261127T222840Z"),
        _vsftpd_line("RENAME", f"{r}/outstage/resp.{u}~n2=23 {r}/outbox/resp.{u}"),
        # v: returned before anything was uploaded (a cut-off node), then served, but put out twice
        _vsftpd_line("RENAME", f"{r}/inbox/req.{v} {r}/inselect/req.{v}~n1"),
        _vsftpd_line("RENAME", f"{r}/inselect/req.{v}~n1 {r}/inbox/req.{v}"),
        _vsftpd_line("UPLOAD", f"{r}/outstage/resp.{v}~n1") + ", 23 bytes, 1.00Kbyte/sec",
        _vsftpd_line("RENAME", f"{r}/outstage/resp.{v}~n1 {r}/outbox/resp.{v}"),
        _vsftpd_line("RENAME", f"{r}/outstage/resp.{v}~n2 {r}/outbox/resp.{v}"),
        # w: n1's staged response deleted while its upload ran, then the claim returned: no result
        # was on the server (vsftpd logs the upload complete into the deleted file)
        _vsftpd_line("RENAME", f"{r}/inbox/req.{w} {r}/inselect/req.{w}~n1"),
        _vsftpd_line("DELETE", f"{r}/outstage/resp.{w}~n1=23"),
        _vsftpd_line("UPLOAD", f"{r}/outstage/resp.{w}~n1=23") + ", 23 bytes, 1.00Kbyte/sec",
        _vsftpd_line("RENAME", f"{r}/inselect/req.{w}~n1 {r}/inbox/req.{w};n=1"),
    ]) + "\n")
    history = server_history(log, r)
    assert [(uid, holder) for uid, holder, _ in history.returned_after_staged] == [(u, "n1")]
    assert history.returned == {u: 1, v: 1, w: 1}
    assert [line.split(":")[0] for line in history.deleted_mid_upload] == [w]
    assert history.exposed == {u: 1, v: 2}
    # Taken back after the upload is no fault by itself (the next node may deliver that reply);
    # a handler started again after the holder began staging is.
    staged_run = Run("n1", 100.0, returned=100.1, recorded=100.2, staging=100.3, staged=110.0)
    assert rerun_after_staged(history, {u: [staged_run]}) == []
    [problem] = rerun_after_staged(history, {u: [staged_run, Run("n2", 108.0)]})
    assert problem.startswith(f"{u}: claimed by n1") and "started again on n2 at 108.000" in problem


def test_a_rerun_is_attributed_to_a_fault_on_the_earlier_node_or_to_none(tmp_path: Path) -> None:
    u = "11111111-2222-3333-4444-555555555555"
    logs = [tmp_path / "handler-n0.log", tmp_path / "handler-n1.log"]
    logs[0].write_text(f"start {u} n0 100.0 x\nreturn {u} n0 100.5\nrecorded {u} n0 100.6\n"
                       f"staging {u} n0 100.7\n")
    logs[1].write_text(f"start {u} n1 110.0 x\nreturn {u} n1 110.1\nstaged {u} n1 110.3\n")
    runs = read_runs(logs)
    assert [r.node for r in runs[u]] == ["n0", "n1"]
    assert runs[u][0].recorded == 100.6 and runs[u][0].staged is None and runs[u][1].staged == 110.3
    returns = {(u, "n0"): [108.0]}
    partition = FaultEvent("partition", "n0", 100.65, healed=110.65, recovered=111.0)
    [rerun] = find_reruns(runs, returns, [partition, FaultEvent("pause", "n1", 90.0, 99.0, 99.5)])
    assert rerun.cut == 108.0 and rerun.causes == ["partition n0"]
    # A fault on another node, or one over before the run began, explains nothing.
    elsewhere = FaultEvent("partition", "n1", 100.65, healed=110.65, recovered=111.0)
    earlier = FaultEvent("pause", "n0", 80.0, healed=90.0, recovered=91.0)
    [rerun] = find_reruns(runs, returns, [elsewhere, earlier])
    assert rerun.causes == []
