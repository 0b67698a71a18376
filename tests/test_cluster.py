"""The cluster test: three ``ftpbc serve`` processes compete for one endpoint.

An in-process Client makes every request from 8 threads, each body unique.  The handler
(``examples.handlers:tagged``) answers with JSON naming the serving node and echoing the body, so
the test can tell that each caller got the response to *its* request, exactly once, and how the
work was shared.  It runs with both poll-lock modes on pyftpdlib, vsftpd and OpenSSH's SFTP,
and with ``lock: file`` on ProFTPD (plain and explicit FTPS) and pure-ftpd (plain and TLS).

Each case prints its throughput and per-node shares (``pytest -s`` shows them).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from ftpbc.client import Client
from ftpbc.journal import Journal
from tests.cluster import ServeCluster, in_process_config, write_config
from tests.servers.handle import ServerHandle

NODES = ["node-a", "node-b", "node-c"]
CLIENT = "client"
THREADS = 8
MIN_SHARE = 0.15

#: The issue's 3,000 requests (500 over SFTP) in both lock modes.
CASES = [
    pytest.param("pyftpdlib", "file", 3000, id="pyftpdlib-lock_file"),
    pytest.param("pyftpdlib", "none", 3000, id="pyftpdlib-lock_none"),
    pytest.param("vsftpd", "file", 3000, id="vsftpd-lock_file"),
    pytest.param("vsftpd", "none", 3000, id="vsftpd-lock_none"),
    pytest.param("sshd", "file", 500, id="sshd-lock_file"),
    pytest.param("sshd", "none", 500, id="sshd-lock_none"),
    # The servers otherwise only in the conformance suite.  1,000 requests and lock: file only,
    # to keep each case near 10 s on a 2-core machine (the lock modes are proven above; what
    # these cases add is each server's own behaviour under three competing nodes).
    pytest.param("proftpd", "file", 1000, id="proftpd-lock_file"),
    pytest.param("proftpd_ftps", "file", 1000, id="proftpd_ftps-lock_file"),
    pytest.param("pureftpd", "file", 1000, id="pureftpd-lock_file"),
    pytest.param("pureftpd_tls", "file", 1000, id="pureftpd_tls-lock_file"),
]


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _names(handle: ServerHandle, repository: str, directory: str) -> list[str]:
    path = handle.local(f"{repository}/{directory}")
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "lock", "count"), CASES)
def test_three_nodes_answer_every_request_exactly_once(kind: str, lock: str, count: int,
                                                        request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    repository = f"{handle.fresh_dir()}/work"
    endpoints: dict[str, dict[str, Any]] = {"work": {
        "repository": repository, "handler": "examples.handlers:tagged", "lock": lock,
        "poll_interval": 0.03, "workers": 4, "timeout": 120, "drain_timeout": 10}}
    config = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints)

    run = uuid.uuid4().hex[:8]
    answers: dict[int, str] = {}

    with ServeCluster(config, tmp_path) as cluster:
        cluster.start(NODES)
        with Client(in_process_config(handle, tmp_path, CLIENT, endpoints), connections=THREADS) as client:

            def one(i: int) -> tuple[int, str]:
                body = f"{run} request {i} " + "x" * (i % 97)
                reply = json.loads(client.request("work", body))
                assert reply["body"] == body, f"request {i} got the response to {reply['body']!r}"
                assert reply["sha256"] == hashlib.sha256(body.encode()).hexdigest()
                return i, str(reply["node"])

            processes = [psutil.Process(), *(psutil.Process(n.proc.pid) for n in cluster.nodes)]
            cpu_before = sum(_cpu(p) for p in processes)
            started = time.monotonic()
            with ThreadPoolExecutor(THREADS) as pool:
                for i, node in pool.map(one, range(count)):
                    assert i not in answers, f"request {i} answered twice"
                    answers[i] = node
            elapsed = time.monotonic() - started
            cpu = sum(_cpu(p) for p in processes) - cpu_before
        codes = cluster.stop()
        logs = cluster.logs()

    assert codes == dict.fromkeys(NODES, 0), f"exit statuses {codes}\n{logs}"
    assert sorted(answers) == list(range(count))
    shares = Counter(answers.values())
    print(f"\n{kind} lock={lock}: {count} requests in {elapsed:.2f} s = {count / elapsed:.0f}/s; "
          f"shares {dict((n, round(shares[n] / count, 3)) for n in NODES)}; "
          f"CPU {cpu / count * 1000:.1f} ms/request in the test process and the nodes")
    for node in NODES:
        assert shares[node] >= MIN_SHARE * count, f"{node} served {shares[node]} of {count}: {dict(shares)}"

    # The server's own record agrees: each request archived once, by the node that answered it,
    # and each response collected once; nothing left in a box or a select directory.
    for directory in ("inbox", "inselect", "instage", "outstage", "outselect", "outbox"):
        assert _names(handle, repository, directory) == [], f"{directory} not empty\n{logs}"
    served = Counter(name.split("~")[1] for name in _names(handle, repository, "inarchive"))
    assert served == shares, f"archive says {dict(served)}, responses say {dict(shares)}"
    assert len(_names(handle, repository, "outarchive")) == count
    assert _names(handle, repository, "inerror") == []
    for node in [*NODES, CLIENT]:
        journal = Journal(tmp_path / "journals", node)
        try:
            assert journal.all_pending() == {}, f"journal of {node} not empty"
        finally:
            journal.close()
