"""The ftpbc side of every benchmark: the public API (Client, Node) with its defaults, timed.

Each function takes the run's ``spec`` (target, workdir, parameters) and returns a dict of
figures.  Serving nodes run in processes of their own (forked), as ``ftpbc serve`` would;
clients run in the calling process.  The floor side (bench/floor/sides.py) mirrors every
function here with bare ftplib/paramiko and the same concurrency.
"""

from __future__ import annotations

import functools
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    LOCK_COUNTERS,
    TOPIC,
    NodeLink,
    Nodes,
    config,
    consume_figures,
    consumed,
    fanned_out,
    fill_inbox,
    fill_linked,
    fill_names,
    large_figures,
    measure,
    peak_rss_mib,
    per_message_ms,
    percentile,
    prepare_area,
    prepare_topic,
    receive_large,
    settle_disk,
    subscription_names,
    topic_dirs,
    wait_for,
)

EP = "b"


def _endpoint(spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    p = spec["params"]
    return {EP: {"poll_interval": p.get("poll_interval", 0.05), "workers": p.get("workers", 5),
                 "lock": p.get("lock", "file"), **extra}}


# --------------------------------------------------------------------------- serving nodes


def _node_main(spec: dict[str, Any], endpoints: dict[str, Any], mode: str, topics: dict[str, Any] | None,
               node_id: str, link: NodeLink) -> None:
    """One serving node: start on go, count handled messages, report stats on stop; it also fans
    out ``topics`` (name -> ``topics:`` settings)."""
    import logging

    from ftpbc.node.serve import Node

    logging.basicConfig(level=logging.ERROR)

    def handle(message: Any) -> bytes | None:
        body = message.body if mode == "echo" else None
        link.handled()
        return body

    cfg = config(spec["target"], spec["workdir"], node_id, endpoints,
                 durable=spec["params"].get("durable", True),
                 coordination=spec["params"].get("coordination", "state_dir"), topics=topics)
    node = Node(cfg, handlers={name: handle for name in endpoints})
    cpu_at_go = link.ready()
    node.start()
    link.stop.wait()
    # read before stop, which closes the journals (a journal opened again counts from 0)
    fsyncs = sum(node.runtime.journal.endpoint(name).fsyncs for name in endpoints)
    node.stop(drain_timeout=5)
    link.report(cpu_at_go, {"lost_races": sum(p.stats.lost_races for p in node.providers.values()),
                            "polls": sum(p.stats.polls for p in node.providers.values()),
                            **{k: round(sum(getattr(p.stats, k) for p in node.providers.values()), 3)
                               for k in LOCK_COUNTERS},
                            "copies": sum(getattr(p, "copies", 0) for p in node.providers.values()),
                            # the journal's group commit at work: fsyncs of this node's journals
                            "journal_fsyncs": fsyncs})


def _nodes(spec: dict[str, Any], count: int, endpoints: dict[str, Any], mode: str,
           topics: dict[str, Any] | None = None) -> Nodes:
    """``count`` serving nodes of ``endpoints`` (and ``topics``), handlers per ``mode``: ``echo``
    answers a request with its body, ``noop`` with nothing."""
    return Nodes(count, functools.partial(_node_main, spec, endpoints, mode, topics))


def _wait_empty(spec: dict[str, Any], kind: str, timeout: float = 60) -> None:
    """Wait until the select directory is empty: the last claim has been archived."""
    from common import area, rel

    d = Path(spec["target"]["root"]) / rel(area().dir("in", kind))
    wait_for(lambda: not any(d.iterdir()), timeout, f"{d} to empty")


# --------------------------------------------------------------------------- cases


def send(spec: dict[str, Any]) -> dict[str, Any]:
    """One thread sending ``count`` one-way messages of ``size`` bytes."""
    from ftpbc.client import Client

    p = spec["params"]
    body = os.urandom(p["size"])
    with Client(config(spec["target"], spec["workdir"], "sender", _endpoint(spec),
                       durable=p.get("durable", True))) as client:
        for _ in range(p.get("warmup", 20)):
            client.send(EP, body)
        began = time.perf_counter()
        for _ in range(p["count"]):
            client.send(EP, body)
        elapsed = time.perf_counter() - began
    return {"rate": p["count"] / elapsed}


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """``nodes`` nodes consuming ``measure`` of ``backlog`` one-way messages already waiting."""
    p = spec["params"]
    prepare_area(spec["target"])
    if p.get("fill") == "links":  # a million files: hard links, made in a minute or two
        fill_linked(spec["target"], p["backlog"], p["size"])
    else:
        fill_inbox(spec["target"], p["backlog"], p["size"], suffix=_priorities(p))
    nodes = _nodes(spec, p.get("nodes", 1), _endpoint(spec), "noop")
    try:
        began = nodes.go()
        count, elapsed = consumed(lambda: nodes.handled, began, p, lambda: _wait_empty(spec, "select"))
    finally:
        stats = nodes.finish()
    return consume_figures(count, elapsed, stats)


def _priorities(p: dict[str, Any]) -> Callable[[], str]:
    """Name endings of a backlog: ``priorities: mixed`` a random priority 0-9 each (the
    default, 4, written as no field at all, as a sender writes it), else none."""
    if p.get("priorities") != "mixed":
        return str
    rng = random.Random(7)  # the same mix every run

    def suffix() -> str:
        priority = rng.randint(0, 9)
        return "" if priority == 4 else f";p={priority}"
    return suffix


def browse(spec: dict[str, Any]) -> dict[str, Any]:
    """One Client.browse of a backlog of ``backlog`` waiting messages (``mode: browse``), or the
    bare listing of the same inbox through ftpbc's transport (``mode: list``, the peer: what a
    browse adds is decoding, ordering and filtering the names).  ``seconds`` is the first call of
    a fresh client (names not decoded yet); ``warm_s`` the median of the ``rounds`` after it."""
    from ftpbc.client import Client

    p = spec["params"]
    prepare_area(spec["target"])
    fill_inbox(spec["target"], p["backlog"], p["size"], suffix=_priorities(p))
    timings, found = [], 0
    with Client(config(spec["target"], spec["workdir"], "browser", _endpoint(spec))) as client:
        lc = client.runtime.lifecycle(EP)
        for _ in range(1 + p.get("rounds", 3)):
            began = time.perf_counter()
            found = len(client.browse(EP) if p["mode"] == "browse" else lc.transport.list(lc.layout.box))
            timings.append(time.perf_counter() - began)
    if found != p["backlog"]:
        raise RuntimeError(f"{p['mode']} found {found} of {p['backlog']} messages")
    return {"seconds": timings[0], "warm_s": statistics.median(timings[1:]), "found": found}


def reqresp(spec: dict[str, Any]) -> dict[str, Any]:
    """``clients`` threads making requests to ``nodes`` echo nodes for ``seconds``; or latencies.

    ``coordination`` (``state_dir`` by default, or ``server``) applies to the nodes and the client.
    """
    from ftpbc.client import Client

    p = spec["params"]
    prepare_area(spec["target"])
    eps = _endpoint(spec)
    nodes = _nodes(spec, p["nodes"], eps, "echo")
    body = os.urandom(p.get("size", 1024))
    latencies: list[float] = []
    done = [0]
    lock = threading.Lock()
    try:
        nodes.go()
        cfg = config(spec["target"], spec["workdir"], "client", eps,
                     coordination=p.get("coordination", "state_dir"))
        # As many server sessions as the floor's client: one per client thread plus its
        # response lister's.
        with Client(cfg, connections=p["clients"] + 1) as client:
            client.request(EP, body, timeout=30)  # connections, directories, a node is up
            stop_at = [float("inf")]
            measuring = threading.Event()

            def loop() -> None:
                while time.perf_counter() < stop_at[0]:
                    t0 = time.perf_counter()
                    reply = client.request(EP, body, timeout=60)
                    assert reply == body
                    if measuring.is_set():
                        with lock:
                            latencies.append(time.perf_counter() - t0)
                            done[0] += 1

            threads = [threading.Thread(target=loop) for _ in range(p["clients"])]
            elapsed = measure(threads, measuring, done, stop_at, p)
            # Recorded so bench.json shows which coordination a run really had.
            where = client.runtime.coordination.where
    finally:
        stats = nodes.finish()
    ms = [x * 1000 for x in latencies]
    return {"rate": done[0] / elapsed, "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "requests": done[0], "coordination": where,
            "node_cpu_ms_per_msg": per_message_ms(stats, sum(s["handled"] for s in stats)),
            # every node counts the messages of the whole group in "handled"
            "journal_fsyncs_per_msg": (sum(s["journal_fsyncs"] for s in stats) / stats[0]["handled"]
                                       if stats and stats[0]["handled"] else None)}


def idle(spec: dict[str, Any]) -> dict[str, Any]:
    """Commands per second one idle node with ``endpoints`` endpoints sends to the server."""
    from common import CountingProxy

    from ftpbc.node.serve import Node

    p = spec["params"]
    target = dict(spec["target"])
    proxy = CountingProxy(target["host"], target["port"]) if target["kind"] != "sshd" else None
    if proxy is not None:
        target["port"] = proxy.port
    eps = {f"e{i}": {"poll_interval": p["poll_interval"], "repository": f"/ex{i}"}
           for i in range(p["endpoints"])}
    node = Node(config(target, spec["workdir"], "idle", eps), handlers={n: lambda m: None for n in eps})
    listings: list[float] = []
    transport = node.runtime.transport("srv")
    real_list = transport.list

    def counting_list(path: str, **kw: Any) -> Any:
        listings.append(time.monotonic())
        return real_list(path, **kw)

    transport.list = counting_list  # type: ignore[method-assign]
    node.start()
    try:
        time.sleep(p.get("settle", 1.5))
        began = time.monotonic()
        time.sleep(p["seconds"])
        ended = time.monotonic()
    finally:
        node.stop(drain_timeout=1)
        if proxy is not None:
            proxy.close()
    window = ended - began
    out = {"listings_per_s": sum(began <= t < ended for t in listings) / window}
    if proxy is not None:
        cmds = [c for t, c in proxy.commands if began <= t < ended]
        out["commands_per_s"] = len(cmds) / window
        out["command_kinds"] = sorted(set(cmds))
    return out


def large(spec: dict[str, Any]) -> dict[str, Any]:
    """Send one ``size``-byte message from a file, then receive it on a node (spooled to disk)."""
    from ftpbc.client import Client

    p = spec["params"]
    prepare_area(spec["target"])
    source = p["source"]
    with Client(config(spec["target"], spec["workdir"], "sender", _endpoint(spec))) as client:
        client.send(EP, b"warm")  # connection and directories
        for f in (Path(spec["target"]["root"]) / "ex" / "inbox").iterdir():
            f.unlink()
        settle_disk()
        began = time.perf_counter()
        with open(source, "rb") as fh:
            client.send(EP, fh)
        send_s = time.perf_counter() - began
    send_rss = peak_rss_mib()
    nodes = _nodes(spec, 1, _endpoint(spec), "noop")
    recv_s, stats = receive_large(nodes, lambda: _wait_empty(spec, "select"))
    return large_figures(p["size"], send_s, recv_s, send_rss, stats)


def fanout(spec: dict[str, Any]) -> dict[str, Any]:
    """One node fanning out ``backlog`` messages of ``size`` bytes, published before it starts,
    to ``subscriptions`` durable subscriptions without selectors, ``workers`` at a time:
    messages whose every copy is in its subscription's inbox per second, from the node's start."""
    from ftpbc.client import Client

    p = spec["params"]
    target = spec["target"]
    subs = subscription_names(p["subscriptions"])
    topics = {TOPIC: {"poll_interval": p.get("poll_interval", 0.05), "workers": p.get("workers", 5)}}
    prepare_topic(target, subs)
    with Client(config(target, spec["workdir"], "publisher", {}, topics=topics)) as client:
        for sub in subs:
            client.create_subscription(TOPIC, sub)
        # Published as Client.publish names them (a sent time each, after every subscription
        # was made), written on the server's disk: a backlog made in a moment, untimed.
        names = [client.runtime.new_message(TOPIC, "oneway")[0] for _ in range(p["backlog"])]
    fill_names(target, topic_dirs(subs)["incoming/box"], names, p["size"])
    nodes = _nodes(spec, 1, {}, "noop", topics=topics)
    try:
        began = nodes.go()
        elapsed = fanned_out(target, subs, p["backlog"], began)
    finally:
        stats = nodes.finish()
    return {"rate": p["backlog"] / elapsed, "fanned_out": p["backlog"], "copies": stats[0]["copies"],
            "polls": stats[0]["polls"], "node_rss_mib": stats[0]["rss_mib"],
            "node_cpu_ms_per_msg": per_message_ms(stats, p["backlog"])}


def local_oneway(spec: dict[str, Any]) -> dict[str, Any]:
    """file:// one-way: ``count`` sends from one thread, then one node consumes them all."""
    from ftpbc.client import Client

    p = spec["params"]
    body = os.urandom(p["size"])
    eps = _endpoint(spec)
    with Client(config(spec["target"], spec["workdir"], "sender", eps, durable=p["durable"])) as client:
        client.send(EP, body)
        began = time.perf_counter()
        for _ in range(p["count"]):
            client.send(EP, body)
        send_s = time.perf_counter() - began
    nodes = _nodes(spec, 1, eps, "noop")
    try:
        began = nodes.go()
        wait_for(lambda: nodes.handled >= p["count"] + 1, 600, "messages", interval=0.002)
        _wait_empty(spec, "select")
        recv_s = time.perf_counter() - began
    finally:
        nodes.finish()
    return {"send_rate": p["count"] / send_s, "consume_rate": (p["count"] + 1) / recv_s}


CASES = {"send": send, "consume": consume, "browse": browse, "reqresp": reqresp, "idle": idle, "large": large,
         "local_oneway": local_oneway, "fanout": fanout}
