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

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import REPO, NodeProcess, make_cluster
from tests.faults_net import RelayProcess
from tests.hosts import Host, Network, host_node_config, reaches, require_netns, vsftpd_in
from tests.partial_faults import Faults, Step, coordination_dir, route_configs, run_partial_faults
from tests.servers.handle import ServerHandle
from tests.servers.vsftpd import VsftpdProcess, running_vsftpd
from tests.support import require_binary, wait_until

#: node id -> the host it runs on
NODES = {"n0": "h0", "n1": "h1", "n2": "h2"}
LEASE = 6.0
HEARTBEAT = 1.0
#: a partition or pause this long outlasts the lease: the node's claims are taken from it
PAST_LEASE = 10.0
#: per FTP command: a partitioned node's command fails after this, not after the default 30 s
SERVER_TIMEOUT = 5.0
LOCK_EXPIRY = 6.0
BASELINE = 300
FAULT_REQUESTS = 1000
CLIENTS = 8
#: long enough for a request claimed by a node cut off past the lease to be served elsewhere
COLLECT_TIMEOUT = 120.0

#: one fault at a time, each kind at least twice, on every node
SCHEDULE = [
    Step("partition", "n0", PAST_LEASE),
    Step("link-delay", "n1", 8.0),
    Step("pause", "n2", PAST_LEASE),
    Step("server-delay", "server", 8.0),
    Step("server-restart", "server", 0.0),
    Step("kill", "n1", 0.0),
    Step("partition", "n2", PAST_LEASE),
    Step("pause", "n0", PAST_LEASE),
    Step("kill", "n2", PAST_LEASE),  # down past the lease before it restarts
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
def test_no_request_lost_or_answered_twice_under_partial_faults(network: Network, server: ServerHandle,
                                                                server_log: Path,
                                                                tmp_path: Path) -> None:
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
                        getattr(listener, "start", None))
        result = run_partial_faults(cluster, relay, faults, SCHEDULE, beat_time=beat_time, seed=seed,
                                    baseline=BASELINE, fault_requests=FAULT_REQUESTS, clients=CLIENTS,
                                    collect_timeout=COLLECT_TIMEOUT, server_log=server_log / "vsftpd.log")
    report = result.report()
    print(f"partial faults:\n{report}")
    v = result.verdict
    # The nodes served through the relay, the faults were all injected.
    assert [f"{s.kind} {s.target}" for s in SCHEDULE] == [e.label() for e in result.events], report
    assert v.sent >= BASELINE + FAULT_REQUESTS, report
    problems = v.violations()
    assert not problems, "\n".join(problems) + "\n" + report
    assert v.answered_once + len(v.errors_to_caller) + v.indeterminate_absent == v.sent, report
