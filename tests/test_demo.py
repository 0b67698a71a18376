"""``ftpbc demo``: on a fresh machine it serves every request through two nodes, and cleans up."""

from __future__ import annotations

import re
import socket
import tempfile
import time
from pathlib import Path

import pytest

from ftpbc.demo import NODE_IDS, percentile, run_demo
from ftpbc.exchange.area import parse_archive_name
from tests.support import ftpbc_env, run_ftpbc

ROW = re.compile(r"^(node-[ab]|all)\s+(\d+)\s+(\d+)%\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", re.M)


def test_demo_command_answers_every_request_from_both_nodes(tmp_path: Path) -> None:
    began = time.monotonic()
    result = run_ftpbc("demo", "--requests", "80", "--clients", "4", "--no-progress",
                       env=ftpbc_env({"TMPDIR": str(tmp_path)}), cwd=tmp_path, timeout=120)
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {m.group(1): m.groups()[1:] for m in ROW.finditer(result.stdout)}
    assert set(rows) == {"node-a", "node-b", "all"}, result.stdout
    served = {n: int(rows[n][0]) for n in ("node-a", "node-b")}
    # Both nodes compete for the same inbox: each must have won some of the work.
    assert served["node-a"] > 0 and served["node-b"] > 0, result.stdout
    assert sum(served.values()) == int(rows["all"][0]) == 80
    p50, p95 = float(rows["all"][3]), float(rows["all"][4])
    assert 0 < p50 <= p95
    assert "80/80 requests answered correctly by 2 nodes from 4 client threads" in result.stdout
    assert took < 60
    # nothing left behind: the temporary directory went with the run
    assert not list(tmp_path.glob("ftpbc-demo-*"))


def test_demo_keep_leaves_an_exchange_area_that_shows_who_served_what(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    report = run_demo(requests=24, clients=3, keep=keep)
    assert report.ok, report.errors
    repo = keep / "ftp" / "demo"
    served = [parse_archive_name(p.name) for p in (repo / "inarchive").iterdir()]
    collected = [parse_archive_name(p.name) for p in (repo / "outarchive").iterdir()]
    assert len(served) == len(collected) == 24
    by_node = {nid: sum(1 for _, node, _ in served if node == nid) for nid in NODE_IDS}
    assert by_node == {n.node_id: n.served for n in report.nodes}
    assert {node for _, node, _ in collected} == {"demo-client"}
    for d in ("inbox", "inselect", "instage", "outbox", "outselect", "outstage", "inerror"):
        assert not list((repo / d).iterdir()), d
    assert (keep / "journals" / "node-a").is_dir() and (keep / "journals" / "node-b").is_dir()


def test_demo_stops_its_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After run_demo returns, the FTP port it used refuses connections and its temp dir is gone."""
    from ftpbc import embedded

    started: list[embedded.EmbeddedFTPServer] = []
    real_start = embedded.EmbeddedFTPServer.start

    def spy(self: embedded.EmbeddedFTPServer) -> embedded.EmbeddedFTPServer:
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(embedded.EmbeddedFTPServer, "start", spy)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run_demo(requests=5, clients=1).ok
    assert len(started) == 1
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", started[0].port), timeout=2):
        pass
    assert not list(tmp_path.iterdir())


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([], 50) == 0.0
