"""Multi-hop under the chaos nemesis: a handler of ``front`` requests ``back`` (served by other
nodes) and answers with its reply, through real ``ftpbc serve`` processes.

Two nodes serve ``front`` with ``multihop_handlers:front`` (found through ``node.handler_path``,
see tests/multihop_handlers.py), two others serve ``back``; the nemesis SIGKILLs a random one of
the four every 0.3 to 1 s and restarts it at once.  Four clients submit to ``front`` and
collect.  Must hold: every request answered, exactly once, with ``front:back:<body>``; nothing
left in front's stage, box or select directories nor in back's inbound ones, every journal
empty.  What a kill may leave: a front handler killed after its request to back went out runs
again on redelivery (handlers must be idempotent), so back's answer to the first attempt is
never collected; such responses wait in back's outbox (archived as uncollected after
``uncollected_after``), at most one per kill.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from tests.chaos import (
    PASSWORD_ENV,
    REPO,
    Cluster,
    Nemesis,
    NodeHost,
    NodeProcess,
    load_client_config,
    run_cli,
)
from tests.multihop_handlers import CONFIG_ENV
from tests.servers.handle import ServerHandle
from tests.support import wait_until

REQUESTS = 200
CLIENTS = 4
FRONT_NODES = ["f0", "f1"]
BACK_NODES = ["b0", "b1"]


def write_configs(workdir: Path, handle: ServerHandle, base: str) -> Cluster:
    """``workdir/ftpbc.yaml`` serves front (the clients' and front nodes' configuration);
    ``workdir/back/ftpbc.yaml`` serves back.  Both share state_dir and journal_dir: one host."""
    server: dict[str, Any] = {"url": handle.url, **{k: str(v) if isinstance(v, Path) else v
                                                     for k, v in handle.options.items()}}
    if handle.password is not None:
        server["password_env"] = PASSWORD_ENV
    # A request killed with its handler many times is held at most 2 s after a node first lists
    # it: a node restarted every few seconds still gets to serve it (docs/guarantees.md).
    common = {"poll_interval": 0.05, "workers": 4, "timeout": 120, "drain_timeout": 10,
              "max_redelivery_delay": 2.0}

    def write(path: Path, serves: str) -> None:
        doc = {
            "node": {"state_dir": str(workdir / "state"), "journal_dir": str(workdir / "journals"),
                     "heartbeat_interval": 1.0, "lease": 20.0, "handler_path": [str(REPO / "tests")]},
            "servers": {"s": server},
            "endpoints": {
                # front's handler may be killed a few times per request (back slow to answer while
                # its nodes restart): it must not run out of deliveries
                "front": {"server": "s", "repository": f"{base}/front", "max_deliveries": 50, **common,
                          **({"handler": "multihop_handlers:front"} if serves == "front" else {})},
                "back": {"server": "s", "repository": f"{base}/back", **common,
                         **({"handler": "multihop_handlers:back"} if serves == "back" else {})},
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    write(workdir / "ftpbc.yaml", "front")
    back_host = NodeHost(workdir / "back", [])  # this host, another configuration
    write(back_host.config, "back")
    return Cluster(workdir, handle.url, handle.password, handle.options, base, handle.root,
                   {n: back_host for n in BACK_NODES})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_multihop_under_the_nemesis(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    handle = pyftpdlib_server
    cluster = write_configs(tmp_path / "w", handle, handle.fresh_dir())
    nodes = [NodeProcess(cluster, n) for n in FRONT_NODES + BACK_NODES]
    for node in nodes:
        node.extra_env = {CONFIG_ENV: str(cluster.config)}
        node.start()
    sent: dict[str, bytes] = {}
    answers: dict[str, list[bytes]] = defaultdict(list)
    errors: list[BaseException] = []
    lock = threading.Lock()
    counter = iter(range(REQUESTS))
    done = [0]

    def run_client(k: int) -> None:
        try:
            with Client(load_client_config(cluster, f"c{k}"), connections=2) as client:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    nemesis.await_due(i / REQUESTS)
                    body = f"{i}:{random.getrandbits(32):08x}".encode()
                    uid = client.submit("front", body)
                    with lock:
                        sent[uid] = body
                    answer = client.collect("front", uid, timeout=150)
                    with lock:
                        answers[uid].append(answer)
                        done[0] += 1
        except BaseException as exc:  # reported below, never swallowed
            errors.append(exc)

    # Each restarted node serves again before the next gap begins: paced by the machine, the
    # nemesis is as harsh on a loaded one as on an idle one, instead of killing nodes that never
    # got to serve (every request then waits, and the clients time out).
    nemesis = Nemesis(nodes, lambda: done[0] / REQUESTS, {}, min_gap=0.3, max_gap=1.0, min_kills=3,
                      wait_ready=30)
    threads = [threading.Thread(target=run_client, args=(k,), name=f"client-{k}") for k in range(CLIENTS)]
    try:
        nemesis.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
    finally:
        nemesis.halt()
        for node in nodes:
            if not node.alive:
                node.start()  # a node killed last recovers its journal before it stops
        # A node restarted a moment ago has no SIGTERM handler yet: stop it once it serves.
        wait_until(lambda: all(node.ready() for node in nodes), timeout=60, what="every node to serve")
        codes = {node.node_id: node.stop() for node in nodes}
    assert not any(t.is_alive() for t in threads), "a client is still waiting"
    assert errors == [], errors
    assert nemesis.error is None, nemesis.error
    assert nemesis.log.kills >= 3, nemesis.log
    assert all(code == 0 for code in codes.values()), codes
    for node_id in [*FRONT_NODES, *BACK_NODES, *(f"{n}-hop" for n in FRONT_NODES),
                    *(f"c{k}" for k in range(CLIENTS))]:
        r = run_cli(cluster, "recover", node_id=node_id)
        assert r.returncode == 0, r.stderr

    lost = [u for u in sent if not answers.get(u)]
    twice = [u for u, got in answers.items() if len(got) > 1]
    wrong = [u for u, got in answers.items() if got and got[0] != b"front:back:" + sent[u]]
    responses = [n for n in cluster.files("front/outarchive") if n.startswith("resp.")]
    per_request = {u: sum(1 for n in responses if n.startswith(f"resp.{u}")) for u in sent}
    assert len(sent) == REQUESTS
    assert lost == [], f"lost: {lost[:5]}"
    assert twice == [] and all(n == 1 for n in per_request.values()), f"answered twice: {twice[:5]}"
    assert wrong == [], {u: answers[u] for u in wrong[:5]}
    assert cluster.files("front/inerror") == []
    for d in ("inbox", "instage", "inselect", "outstage", "outbox", "outselect"):
        assert cluster.files(f"front/{d}") == [], d
    for d in ("inbox", "instage", "inselect", "outstage", "outselect"):
        assert cluster.files(f"back/{d}") == [], d
    uncollected = cluster.files("back/outbox")
    print(f"multihop: {REQUESTS} requests, {nemesis.log.kills} kills, {len(uncollected)} back response(s) "
          "left uncollected by killed front handlers")
    assert len(uncollected) <= nemesis.log.kills, uncollected
    assert cluster.pending() == {}
    assert cluster.nonempty_journal_files() == []
