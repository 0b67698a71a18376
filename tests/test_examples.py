"""The examples work as their comments say: examples/cluster.yaml run as a three-node cluster by
``ftpbc serve``, answering ``ftpbc request`` and a partner written with plain ftplib."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftpbc.config.loader import load_config
from ftpbc.exchange.area import parse_archive_name
from ftpbc.model.message import Message
from ftpbc.node.serve import load_handler
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, popen_ftpbc, run_ftpbc, wait_until

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "examples" / "cluster.yaml"
PRODUCER = REPO / "examples" / "foreign_producer.py"
NODES = ("node-a", "node-b", "node-c")
URL_LINE = re.compile(r"^(\s*url:\s*)ftp://ftpbc@127\.0\.0\.1:2121/\s*$", re.M)


def message(body: bytes) -> Message:
    return Message("ep", "req.x", "x", len(body), io.BytesIO(body))


def test_example_handlers() -> None:
    from examples import handlers

    assert handlers.echo(message(b"\x00abc")) == b"\x00abc"
    assert handlers.upper(message(b"hello")) == "HELLO"
    assert handlers.quote(message(b" eurusd\n")) == "EURUSD 1.0842"
    with pytest.raises(KeyError, match="no price for 'XXX'"):
        handlers.quote(message(b"xxx"))
    with pytest.raises(RuntimeError, match="on purpose"):
        handlers.fail(message(b"x"))


def test_cluster_yaml_is_valid_for_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTPBC_PASSWORD", "any")
    monkeypatch.syspath_prepend(str(REPO))
    configs = [load_config(CLUSTER, node_id=n) for n in NODES]
    assert [c.node.id for c in configs] == list(NODES)
    assert len({c.node.state_dir for c in configs}) == 1  # one shared state_dir
    journals = {Path(c.node.journal_dir) / c.node.id for c in configs}
    assert len(journals) == 3  # a journal per node
    assert URL_LINE.search(CLUSTER.read_text()), "the tests below rewrite this url line"
    for name, ep in configs[0].endpoints.items():
        assert ep.handler is not None
        assert callable(load_handler(ep.handler, key=f"endpoints.{name}.handler", source=str(CLUSTER)))


@dataclass
class Cluster:
    config: Path
    env: dict[str, str]
    base: str
    server: ServerHandle
    workdir: Path


@pytest.fixture
def cluster(tmp_path: Path, pyftpdlib_server: ServerHandle) -> Iterator[Cluster]:
    """examples/cluster.yaml, url pointed at the test server, served by three ``ftpbc serve``."""
    base = pyftpdlib_server.fresh_dir()
    url = pyftpdlib_server.url.rstrip("/") + base
    text = URL_LINE.sub(lambda m: f"{m.group(1)}{url}", CLUSTER.read_text())
    config = tmp_path / "cluster.yaml"
    config.write_text(text, encoding="utf-8")
    env = ftpbc_env({"FTPBC_PASSWORD": str(pyftpdlib_server.password)})
    logs = {n: tmp_path / f"{n}.log" for n in NODES}
    # Run elsewhere than the repository root, its handler_path (.) finds no examples there:
    # --path names the checkout, as a user serving the examples from another directory would.
    procs = {n: popen_ftpbc("serve", "-c", str(config), "--node-id", n, "--path", str(REPO), log=logs[n],
                            env=env, cwd=tmp_path)
             for n in NODES}
    try:
        for n in NODES:
            wait_until(lambda n=n: "serving fail" in logs[n].read_text() or procs[n].poll() is not None,
                       timeout=30, what=f"{n} to start serving")
            assert procs[n].poll() is None, logs[n].read_text()
        yield Cluster(config, env, base, pyftpdlib_server, tmp_path)
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        codes = {n: p.wait(timeout=30) for n, p in procs.items()}
        assert codes == dict.fromkeys(NODES, 0), {n: logs[n].read_text()[-2000:] for n in NODES}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for n in NODES:
        assert str(pyftpdlib_server.password) not in logs[n].read_text()


def producer(cl: Cluster, endpoint: str, body: str) -> subprocess.CompletedProcess[str]:
    port = cl.server.url.rsplit(":", 1)[1].strip("/")
    return subprocess.run(
        [sys.executable, str(PRODUCER), "--port", port, "--repository", f"{cl.base}/exchange/{endpoint}",
         "--timeout", "20", body],
        env=cl.env, capture_output=True, text=True, timeout=60, check=False)


def test_three_nodes_answer_ftpbc_request_and_a_foreign_producer(cluster: Cluster,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # ftpbc request, as the comment at the top of cluster.yaml shows
    got = run_ftpbc("request", "-c", str(cluster.config), "quote", "--data", "eurusd",
                    env=cluster.env, cwd=cluster.workdir)
    assert (got.returncode, got.stdout) == (0, "EURUSD 1.0842"), got.stderr
    failed = run_ftpbc("request", "-c", str(cluster.config), "fail", "--data", "x",
                       env=cluster.env, cwd=cluster.workdir)
    assert failed.returncode == 4
    assert re.search(r"RuntimeError \(ref [0-9a-f]{8}\)", failed.stderr), failed.stderr

    # A partner with nothing but ftplib: req.<uuid> in, resp.<uuid> back, archived under its name.
    answer = producer(cluster, "upper", "hello from afar")
    assert (answer.returncode, answer.stdout) == (0, "HELLO FROM AFAR\n"), answer.stderr
    repo = cluster.server.local(f"{cluster.base}/exchange/upper")
    collected = [parse_archive_name(p.name) for p in (repo / "outarchive").iterdir()]
    assert len(collected) == 1
    resp_name, collector, when = collected[0]
    assert collector == "foreign" and when is not None
    uid = resp_name.removeprefix("resp.")
    served = [parse_archive_name(p.name) for p in (repo / "inarchive").iterdir()]
    assert [(name, node in NODES) for name, node, _ in served] == [(f"req.{uid}", True)]
    assert not list((repo / "instage").iterdir()) and not list((repo / "outselect").iterdir())

    error = producer(cluster, "fail", "x")
    assert error.returncode == 4
    assert re.search(r"error reply: RuntimeError \(ref [0-9a-f]{8}\)", error.stderr), error.stderr

    # Competing nodes share the work: 60 requests, 12 at a time (three times one node's 4 workers,
    # and a node claims only for idle workers), are not all served by one node.
    from ftpbc.client import Client

    monkeypatch.chdir(cluster.workdir)  # the config's state_dir and journal_dir are relative
    monkeypatch.setenv("FTPBC_PASSWORD", str(cluster.server.password))
    with Client.from_config(cluster.config, node_id="many") as client, ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: client.request("upper", f"m{i}", timeout=20), range(60)))
    assert answers == [f"M{i}".encode() for i in range(60)]
    nodes = {node for _, node, _ in (parse_archive_name(p.name) for p in (repo / "inarchive").iterdir())}
    assert len(nodes) >= 2 and nodes <= set(NODES)
