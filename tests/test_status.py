"""``ftpbc status`` against a live cluster of real ``ftpbc serve`` processes: a backlog, a node
killed with SIGKILL, and the last minute's throughput from the archive stamps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import is_dead
from tests.chaos import ENDPOINT, NodeProcess, load_client_config, make_cluster, run_cli
from tests.servers.handle import ServerHandle
from tests.support import wait_until

QUICK = 6
SLOW = 4


def test_status_json_shows_nodes_depths_and_throughput(pyftpdlib_server: ServerHandle,
                                                       tmp_path: Path) -> None:
    handle = pyftpdlib_server
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                           repository=handle.fresh_dir(), server_root=handle.root, lease=3.0, heartbeat=0.5,
                           workers=1, drain_timeout=1.0)
    nodes = [NodeProcess(cluster, "a"), NodeProcess(cluster, "b")]
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            wait_until(n.ready, timeout=30, what=f"node {n.node_id} serving")
        client = Client(load_client_config(cluster, "c0"))
        try:
            for i in range(QUICK):
                client.send(ENDPOINT, f"quick {i}".encode())
            wait_until(lambda: len(cluster.files("inarchive")) == QUICK, timeout=30, what="quick ones served")
            nodes[1].kill()
            wait_until(lambda: is_dead(cluster.state_dir, "b", 3.0), timeout=20, what="b dead")
            # a has one worker: it takes one of these and the others wait in the inbox
            for i in range(SLOW):
                client.send(ENDPOINT, f"sleep:60:{i}".encode())
        finally:
            client.close()
        wait_until(lambda: len(cluster.files("inselect")) == 1 and len(cluster.files("inbox")) == SLOW - 1,
                   timeout=30, what="a backlog behind the busy node")

        done = run_cli(cluster, "status", "--json")
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        nodes_by_id = {n["id"]: n for n in status["nodes"]}
        assert nodes_by_id["a"]["alive"] is True
        assert nodes_by_id["a"]["heartbeat_age"] < 3.0
        assert nodes_by_id["b"]["alive"] is False
        assert nodes_by_id["b"]["heartbeat_age"] > 3.0
        assert "c0" not in nodes_by_id  # a client that closed removed its heartbeat
        [ep] = status["endpoints"]
        assert ep["name"] == ENDPOINT and ep["error"] is None
        assert ep["depth"]["inbox"] == SLOW - 1
        assert ep["depth"]["inselect"] == 1
        assert ep["depth"]["inarchive"] == QUICK
        assert ep["depth"]["inerror"] == 0
        assert ep["oldest_age"]["inbox"] >= 0
        assert sum(ep["served_last_minute"].values()) == QUICK == ep["served_per_minute"]
        assert set(ep["served_last_minute"]) <= {"a", "b"}

        text = run_cli(cluster, "status")
        assert text.returncode == 0, text.stderr
        assert "DEAD" in text.stdout and f"inbox {SLOW - 1} (oldest" in text.stdout
        assert f"served in the last minute: {QUICK}" in text.stdout
    finally:
        for n in nodes:
            n.stop(timeout=30)
