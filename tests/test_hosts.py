"""Nodes on separate (simulated) hosts, sharing nothing but the FTP server.

Each host is a network namespace on one bridge (``tests/hosts.py``) with a host name of its own;
a real vsftpd listens on the server host's address only.  Every node has ``coordination:
server`` and a ``state_dir`` and ``journal_dir`` of its own, as separate machines would: poll
locks, heartbeats, leases and sequences go through the FTP server alone.  The clients run in
the root namespace (pytest), a host of their own, reaching the server across the bridge.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.chaos import REPO, Cluster, make_cluster, run_chaos
from tests.hosts import (
    PREFIX,
    Network,
    cleanup_leftovers,
    host_node_config,
    reaches,
    require_netns,
    vsftpd_on,
)
from tests.servers.handle import ServerHandle
from tests.support import wait_until

NODE_HOSTS = ["h0", "h1", "h2", "h3"]
CHAOS_REQUESTS = 1500


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    require_netns()
    with Network(["server", *NODE_HOSTS]) as net:
        yield net


@pytest.fixture(scope="module")
def server(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """vsftpd on the server host, reachable from every node host (checked, to fail plainly)."""
    server_host = network.hosts["server"]
    with vsftpd_on(server_host, tmp_path_factory.mktemp("hosts-vsftpd")) as handle:
        port = int(handle.url.rsplit(":", 1)[1].rstrip("/"))
        # a bridge just built may take a moment to pass traffic
        address = server_host.address
        wait_until(lambda: all(reaches(network.hosts[name], address, port) for name in NODE_HOSTS),
                   timeout=15, interval=0.5, what=f"every node host to reach the server at {address}:{port}")
        yield handle


def host_cluster(network: Network, server: ServerHandle, workdir: Path,
                 placement: dict[str, str]) -> Cluster:
    """A chaos cluster whose nodes run on the hosts ``placement`` maps their ids to, with the
    coordination in a fresh directory of the server."""
    return make_cluster(workdir, url=server.url, password=server.password, options=server.options,
                        repository=server.fresh_dir(), server_root=server.root,
                        node=host_node_config(server.fresh_dir()),
                        hosts={node_id: network.hosts[h].command([]) for node_id, h in placement.items()})


def coordination_dir(cluster: Cluster) -> str:
    """The coordination_dir the cluster's configs name."""
    return str(yaml.safe_load(cluster.config.read_text())["node"]["coordination_dir"])


def private_dirs_unused_for_coordination(cluster: Cluster) -> list[str]:
    """Host state_dirs that hold anything (with coordination: server, none should)."""
    return [str(h.state_dir) for h in cluster.hosts.values()
            if h.state_dir.exists() and any(h.state_dir.iterdir())]


# ---------------------------------------------------------------------- the harness itself

def test_leftovers_of_a_killed_run_are_removed(network: Network) -> None:
    """A killed pytest skips its teardown: the next run removes its namespaces and bridge."""
    dead = f"{PREFIX}99999999"  # above any pid_max: never a live process
    subprocess.run(["ip", "netns", "add", f"{dead}-server"], check=True)
    subprocess.run(["ip", "link", "add", f"{dead}b", "type", "bridge"], check=True)
    try:
        removed = cleanup_leftovers()
        assert f"{dead}-server" in removed and f"{dead}b" in removed
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert f"{dead}-server" not in names
        # This run's own namespaces are kept: their pid is alive.
        assert all(h.netns in names for h in network.hosts.values())
    finally:
        subprocess.run(["ip", "netns", "del", f"{dead}-server"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"{dead}b"], capture_output=True, check=False)


def test_hosts_have_their_own_names_and_addresses(network: Network) -> None:
    h0 = network.hosts["h0"]
    out = subprocess.run(h0.command([sys.executable, "-c", "import socket; print(socket.gethostname())"]),
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.strip() == "h0"
    addresses = subprocess.run(["ip", "-n", h0.netns, "-4", "-o", "addr", "show"], capture_output=True,
                               text=True, check=True).stdout
    assert f" {h0.address}/24 " in addresses and "127.0.0.1" in addresses


# ---------------------------------------------------------------------- chaos across hosts

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chaos_with_three_nodes_on_three_hosts(network: Network, server: ServerHandle,
                                               tmp_path: Path) -> None:
    """The SIGKILL nemesis (tests/test_chaos.py) on three nodes in three namespaces, sharing
    only the FTP server: nothing lost, nothing answered twice, no recorded handler run again,
    every stage and journal empty.  The server is also restarted and its sessions cut once."""
    # run_chaos names its nodes n0, n1, n2
    cluster = host_cluster(network, server, tmp_path / "w", {f"n{i}": f"h{i}" for i in range(3)})
    result = run_chaos(cluster, requests=CHAOS_REQUESTS, restart_server=server.controls["restart"],
                       drop_connections=server.controls["drop_connections"])
    logs = result.assert_held(cluster, CHAOS_REQUESTS, "chaos across hosts")
    assert f"@{network.hosts['server'].address}:" in logs  # the nodes served across the bridge
    # Each node kept its journal on its own host, and nothing in its state_dir.
    for node_id, host in cluster.hosts.items():
        assert (host.journal_dir / node_id).is_dir(), f"{node_id} journaled elsewhere"
        assert not (cluster.journal_dir / node_id).exists()
    assert private_dirs_unused_for_coordination(cluster) == []


# ---------------------------------------------------------------------- one sequence, four hosts

DRAWS = 500
#: a process on one host: opens the runtime, says "ready", waits for "go" on stdin (so the four
#: hosts draw at once), then prints the values %{hosts} expands to, one draw per expansion
DRAWER = """
import sys
from ftpbc.config.loader import load_config
from ftpbc.exchange.runtime import Runtime
from ftpbc.patterns import ExpandContext, Pattern

config, node_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
runtime = Runtime(load_config(config, node_id=node_id))
try:
    pattern = Pattern.parse("%{hosts}")
    context = ExpandContext(endpoint="echo", store=runtime.sequences)
    runtime.sequences.get("global", None, "hosts")  # logged in before "ready": the draws race
    print("ready", flush=True)
    sys.stdin.readline()
    print(" ".join(pattern.expand(context).name for _ in range(count)), flush=True)
finally:
    runtime.close()
"""


@pytest.mark.timeout(300)
def test_four_hosts_drawing_one_server_sequence_get_each_value_once(
        network: Network, server: ServerHandle, tmp_path: Path) -> None:
    cluster = host_cluster(network, server, tmp_path / "w", {h: h for h in NODE_HOSTS})
    procs: dict[str, subprocess.Popen[bytes]] = {}
    outputs = {h: tmp_path / f"drawer-{h}.out" for h in NODE_HOSTS}
    try:
        for h in NODE_HOSTS:
            with open(outputs[h], "wb") as out, open(tmp_path / f"drawer-{h}.err", "wb") as err:
                procs[h] = subprocess.Popen(
                    [*cluster.prefix_for(h), sys.executable, "-c", DRAWER, str(cluster.config_for(h)), h,
                     str(DRAWS)],
                    cwd=REPO, env=cluster.env(), stdin=subprocess.PIPE, stdout=out, stderr=err)

        def all_ready() -> bool:
            for h, p in procs.items():
                assert p.poll() is None, (tmp_path / f"drawer-{h}.err").read_text()
            return all(o.read_text().startswith("ready\n") for o in outputs.values())

        wait_until(all_ready, timeout=60, interval=0.05, what="the four drawers to start")
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.close()
        for h, p in procs.items():
            assert p.wait(timeout=240) == 0, (tmp_path / f"drawer-{h}.err").read_text()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    drawn = {h: [int(v) for v in o.read_text().splitlines()[1].split()] for h, o in outputs.items()}
    for h, values in drawn.items():
        assert len(values) == DRAWS and values == sorted(values), f"{h}: {values[:10]}..."
    assert sorted(v for values in drawn.values() for v in values) == list(range(DRAWS * len(NODE_HOSTS)))
    # How the draws interleaved (a host's first and last value), for the log.
    print({h: (values[0], values[-1]) for h, values in drawn.items()})
    sequences = server.local(f"{coordination_dir(cluster)}/sequences")
    total = DRAWS * len(NODE_HOSTS)
    assert sorted(p.name for p in sequences.iterdir()) == [f"hosts.{total}", "hosts~created"]
    assert private_dirs_unused_for_coordination(cluster) == []
