"""``ftpbc status`` against a live cluster of real ``ftpbc serve`` processes (a backlog, a node
killed with SIGKILL, what each node serves and served in the last minute), with heartbeats on
the coordination server, and heartbeat files of every format it may meet."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import Serves, is_dead, read_heartbeats
from ftpbc.config.models import Config
from ftpbc.node.serve import Node
from ftpbc.node.status import cluster_status, render
from tests.chaos import ENDPOINT, NodeProcess, load_client_config, make_cluster, run_cli
from tests.servers.handle import ServerHandle
from tests.support import wait_until

QUICK = 6
SLOW = 5
LEASE = 3.0
ECHO_ONLY = {"endpoints": [ENDPOINT], "transfers": []}


def test_status_json_of_three_nodes_one_dead_and_a_backlog(pyftpdlib_server: ServerHandle,
                                                           tmp_path: Path) -> None:
    handle = pyftpdlib_server
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                           repository=handle.fresh_dir(), server_root=handle.root, lease=LEASE, heartbeat=0.5,
                           workers=1, drain_timeout=1.0)
    nodes = {n: NodeProcess(cluster, n) for n in ("a", "b", "c")}
    try:
        for n in nodes.values():
            n.start()
        for n in nodes.values():
            wait_until(n.ready, timeout=60, what=f"node {n.node_id} serving")
        client = Client(load_client_config(cluster, "c0"))
        try:
            for i in range(QUICK):
                client.send(ENDPOINT, f"quick {i}".encode())
            wait_until(lambda: len(cluster.files("inarchive")) == QUICK, timeout=30, what="quick ones served")
            nodes["b"].kill()  # reaped by kill(); its heartbeat file stays, going stale
            wait_until(lambda: is_dead(cluster.state_dir, "b", LEASE), timeout=20, what="b dead")
            # a and c have one worker each: each takes one of these, the others wait in the inbox
            sent_at = time.time()
            for i in range(SLOW):
                client.send(ENDPOINT, f"sleep:60:{i}".encode())
        finally:
            client.close()
        wait_until(lambda: len(cluster.files("inselect")) == 2 and len(cluster.files("inbox")) == SLOW - 2,
                   timeout=30, what="a backlog behind the two busy nodes")
        assert sorted(name.rsplit("~", 1)[1] for name in cluster.files("inselect")) == ["a", "c"]

        done = run_cli(cluster, "status", "--json")
        waited = time.time() - sent_at
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        assert status["coordination"] == f"state_dir {cluster.state_dir}" and status["nodes_error"] is None
        by_id = {n["id"]: n for n in status["nodes"]}
        assert sorted(by_id) == ["a", "b", "c"]  # the client c0 removed its heartbeat on close
        for live in ("a", "c"):
            assert by_id[live]["alive"] is True and by_id[live]["heartbeat_age"] < LEASE
            assert by_id[live]["pid"] == nodes[live].proc.pid  # type: ignore[union-attr]
        assert by_id["b"]["alive"] is False and by_id["b"]["heartbeat_age"] > LEASE
        for n in by_id.values():
            assert n["serves"] == ECHO_ONLY  # the dead node's last heartbeat still says it

        [ep] = status["endpoints"]
        assert ep["name"] == ENDPOINT and ep["error"] is None
        assert ep["depth"]["inbox"] == SLOW - 2
        assert ep["depth"]["inselect"] == 2
        assert ep["depth"]["inarchive"] == QUICK
        assert ep["depth"]["inerror"] == ep["depth"]["indead"] == 0
        # The oldest waiting request: one of the backlog, as old as it can be (FTP gives whole
        # seconds, so up to a second more than the true age).
        assert ep["oldest_name"]["inbox"] in cluster.files("inbox")
        assert 0 <= ep["oldest_age"]["inbox"] <= waited + 1.5
        assert "outbox" not in ep["oldest_age"]  # no response waits for a collector (sends are one-way)

        served = ep["served_last_minute"]
        assert sum(served.values()) == QUICK == ep["served_per_minute"]
        assert set(served) <= {"a", "b", "c"}
        for node_id, n in by_id.items():
            assert n["served_last_minute"] == ({ENDPOINT: served[node_id]} if node_id in served else {})

        text = run_cli(cluster, "status")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert any(line.split()[:2] == ["b", "DEAD"] for line in lines)
        assert sum(line.strip().startswith(f"serves {ENDPOINT};") for line in lines) == 3
        assert f"inbox {SLOW - 2} (oldest" in text.stdout
        assert f"served in the last minute: {QUICK}" in text.stdout
    finally:
        for n in nodes.values():
            n.stop(timeout=30)


def _server_config(handle: ServerHandle, tmp_path: Path, node_id: str, base: str) -> Config:
    return Config.model_validate({
        "node": {"id": node_id, "state_dir": str(tmp_path / node_id / "state"),
                 "journal_dir": str(tmp_path / node_id / "journals"), "coordination": "server",
                 "coordination_dir": f"{base}/.cluster", "heartbeat_interval": 1, "lease": 10},
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {ENDPOINT: {"server": "srv", "repository": f"{base}/echo",
                                 "handler": "examples.handlers:echo", "poll_interval": 0.05}},
    })


@pytest.mark.parametrize("kind", ["local", "pyftpdlib"])
def test_status_reads_heartbeats_on_the_coordination_server(kind: str, request: pytest.FixtureRequest,
                                                            tmp_path: Path) -> None:
    """``coordination: server``: nothing is in state_dir; status lists the heartbeats on the
    server, ages them on the server's clock, and reads those of older ftpbc versions."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    beats = handle.local(f"{base}/.cluster/heartbeats")
    with Node(_server_config(handle, tmp_path, "node-a", base)):
        with Client(_server_config(handle, tmp_path, "client", base)) as client:
            assert client.request(ENDPOINT, b"hi", timeout=30) == b"hi"
        # An older ftpbc's heartbeat (no second line), and a node gone for an hour.
        (beats / "old-node").write_bytes(b"4242 0 0 old-host\n")
        (beats / "gone").write_bytes(f"77 0 0 far\n{Serves(('other',), ('t',)).line()}\n".encode())
        os.utime(beats / "gone", (time.time() - 3600, time.time() - 3600))

        status = cluster_status(_server_config(handle, tmp_path, "watcher", base))
        assert status.coordination.startswith("server ") and status.nodes_error is None
        by_id = {n.id: n for n in status.nodes}
        assert sorted(by_id) == ["gone", "node-a", "old-node"]
        a = by_id["node-a"]
        assert a.alive and a.heartbeat_age < 10 and a.pid == os.getpid()
        assert a.serves == ECHO_ONLY and a.served_last_minute == {ENDPOINT: 1}
        old = by_id["old-node"]
        assert old.alive and (old.pid, old.host, old.serves) == (4242, "old-host", None)
        gone = by_id["gone"]
        assert not gone.alive and gone.heartbeat_age > 3000
        assert gone.serves == {"endpoints": ["other"], "transfers": ["t"]}
        assert status.to_dict()["nodes"][1]["serves"] == ECHO_ONLY
        assert not (tmp_path / "watcher" / "state").exists()  # nothing read from, or put in, state_dir
        text = render(status)
        assert "heartbeats in server " in text and "serves other, transfer t;" in text


def test_state_dir_heartbeats_old_new_and_torn(tmp_path: Path) -> None:
    """A heartbeat without the second line (a client's, or an older ftpbc's) and one whose second
    line is not what this version writes are read, their serves unknown."""
    directory = tmp_path / "heartbeats"
    directory.mkdir()
    (directory / "new").write_text(f"1 2.0 h1\n{Serves(('e1', 'e2'), ()).line()}\n")
    (directory / "old").write_text("3 4.0 h2\n")
    (directory / "odd").write_text('5 6.0 h3\n{"serves": {"endpoints": "e1"}}\n')
    (directory / ".new.tmp").write_text("being written")
    beats = {b.node_id: b for b in read_heartbeats(tmp_path, 60.0)}
    assert sorted(beats) == ["new", "odd", "old"]
    assert beats["new"].serves == Serves(("e1", "e2"), ()) and beats["new"].host == "h1"
    assert (beats["old"].pid, beats["old"].host, beats["old"].serves) == (3, "h2", None)
    assert (beats["odd"].pid, beats["odd"].serves) == (5, None)
    assert all(b.alive for b in beats.values())
