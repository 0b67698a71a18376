"""The floor side of every benchmark: bare ftplib/paramiko doing the protocol's minimal operations.

Mirrors bench/ftpbc_sides.py function by function, with the same concurrency: a serving
"node" is a child process with one listing thread (lists, claims by rename as many files as it
has idle workers) and ``workers`` threads each on its own connection (read, then archive; for a
request: put the response in outstage, archive the request, expose the response).  A client is
``clients`` threads each on its own connection plus one response-listing thread.  What the floor
leaves out is exactly what ftpbc adds: journal, poll lock, patterns, heartbeats, retries, pools.
The floor polls in a tight loop (no sleep after an empty listing); it claims lock-free and counts
the claim races it loses.
"""

from __future__ import annotations

import functools
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import (
    NodeLink,
    Nodes,
    consume_figures,
    consumed,
    fanned_out,
    fill_inbox,
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
from floor.lean import connect

IN = {k: f"ex/in{k}" for k in ("box", "stage", "select", "archive")}
OUT = {k: f"ex/out{k}" for k in ("box", "stage", "select", "archive")}


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")


# --------------------------------------------------------------------------- a bare serving node


def _serve(spec: dict[str, Any], node_id: str, link: NodeLink, box: str, select: str,
           handle: Callable[[Any, str, str], None]) -> None:
    """A bare serving node: one listing thread claims (renames ``box/<name>`` to
    ``select/<name>~<node>``) as many files as it has idle workers, ``workers`` threads each on
    its own connection run ``handle(conn, name, selected)`` on each claim; at stop it reports
    its stats."""
    target, workers = spec["target"], spec["params"].get("workers", 5)
    cpu_at_go = link.ready()
    # Connected after the start signal, as ftpbc's pool connects on first use: both sides'
    # timings include their logins.
    lister = connect(target)
    conns = [connect(target) for _ in range(workers)]
    claimed: queue.Queue[str | None] = queue.Queue()
    slots = threading.Semaphore(workers)
    lost, polls = [0], [0]

    def work(conn: Any) -> None:
        while (name := claimed.get()) is not None:
            handle(conn, name, f"{select}/{name}~{node_id}")
            link.handled()
            slots.release()

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in conns]
    for t in threads:
        t.start()
    while not link.stop.is_set():
        if not slots.acquire(timeout=0.1):
            continue
        free = 1
        while free < workers and slots.acquire(blocking=False):
            free += 1
        polls[0] += 1
        taken = 0
        for name in lister.names(box):
            if taken >= free:
                break
            if lister.rename(f"{box}/{name}", f"{select}/{name}~{node_id}"):
                claimed.put(name)
                taken += 1
            else:
                lost[0] += 1
        for _ in range(free - taken):
            slots.release()
    for _ in threads:
        claimed.put(None)
    for t in threads:
        t.join(10)
    for c in [lister, *conns]:
        c.close()
    link.report(cpu_at_go, {"lost_races": lost[0], "polls": polls[0]})


def _node_main(spec: dict[str, Any], mode: str, node_id: str, link: NodeLink) -> None:
    """A bare serving node of an endpoint: each claim read (spooled to a file for ``large``),
    then archived; for ``echo``, a request's response staged in outstage, the request
    archived, the response exposed."""

    def handle(conn: Any, name: str, selected: str) -> None:
        if mode == "large":
            with tempfile.TemporaryFile() as spool:
                conn.get_stream(selected, spool)
        else:
            body = conn.get(selected)
        archived = f"{IN['archive']}/{name}~{node_id}~{_stamp()}"
        if mode == "echo" and name.startswith("req."):
            resp = "resp." + name[4:]
            staged = f"{OUT['stage']}/{resp}~{node_id}"
            conn.put(staged, body)
            conn.rename(selected, archived)
            conn.rename(staged, f"{OUT['box']}/{resp}")
        else:
            conn.rename(selected, archived)

    _serve(spec, node_id, link, IN["box"], IN["select"], handle)


def _fanout_main(spec: dict[str, Any], node_id: str, link: NodeLink) -> None:
    """A bare fan-out node: each claimed message read once, staged in every subscription's
    stage directory, the claim archived, then each copy renamed into its subscription's inbox
    (ftpbc's order, without its journal and records)."""
    subs = subscription_names(spec["params"]["subscriptions"])
    d = topic_dirs(subs)

    def handle(conn: Any, name: str, selected: str) -> None:
        body = conn.get(selected)
        for sub in subs:
            conn.put(f"{d[f'stage/{sub}']}/{name}~{node_id}", body)
        conn.rename(selected, f"{d['incoming/archive']}/{name}~{node_id}~{_stamp()}")
        for sub in subs:
            conn.rename(f"{d[f'stage/{sub}']}/{name}~{node_id}", f"{d[f'box/{sub}']}/{name}")

    _serve(spec, node_id, link, d["incoming/box"], d["incoming/select"], handle)


def _nodes(spec: dict[str, Any], count: int, mode: str) -> Nodes:
    """``count`` bare nodes: fan-out nodes for ``mode`` ``fanout``, else endpoint nodes
    (:func:`_node_main`'s modes)."""
    if mode == "fanout":
        return Nodes(count, functools.partial(_fanout_main, spec), prefix="floor")
    return Nodes(count, functools.partial(_node_main, spec, mode), prefix="floor")


def _wait_select_empty(spec: dict[str, Any]) -> None:
    d = Path(spec["target"]["root"]) / IN["select"]
    wait_for(lambda: not any(d.iterdir()), 60, f"{d} to empty")


# --------------------------------------------------------------------------- cases


def send(spec: dict[str, Any]) -> dict[str, Any]:
    p = spec["params"]
    prepare_area(spec["target"])
    body = os.urandom(p["size"])
    conn = connect(spec["target"])

    def one() -> None:
        name = f"msg.{uuid.uuid4()}"
        staged = f"{IN['stage']}/{name}~floor"
        conn.put(staged, body)
        conn.rename(staged, f"{IN['box']}/{name}")

    for _ in range(p.get("warmup", 20)):
        one()
    began = time.perf_counter()
    for _ in range(p["count"]):
        one()
    elapsed = time.perf_counter() - began
    conn.close()
    return {"rate": p["count"] / elapsed}


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    p = spec["params"]
    prepare_area(spec["target"])
    fill_inbox(spec["target"], p["backlog"], p["size"])
    nodes = _nodes(spec, p.get("nodes", 1), "noop")
    try:
        began = nodes.go()
        count, elapsed = consumed(lambda: nodes.handled, began, p, lambda: _wait_select_empty(spec))
    finally:
        stats = nodes.finish()
    return consume_figures(count, elapsed, stats)


class _Responses:
    """The client's one response-listing thread: tight polling while requests are outstanding."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.conn = connect(target)
        self.waiters: dict[str, threading.Event] = {}
        self.cv = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def expect(self, uid: str) -> threading.Event:
        ev = threading.Event()
        with self.cv:
            self.waiters[uid] = ev
            self.cv.notify()
        return ev

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.waiters and not self.closed:
                    self.cv.wait()
                if self.closed:
                    return
                wanted = set(self.waiters)
            for name in self.conn.names(OUT["box"]):
                uid = name[5:]
                if uid not in wanted:
                    continue
                selected = f"{OUT['select']}/{name}~client"
                if not self.conn.rename(f"{OUT['box']}/{name}", selected):
                    continue
                self.conn.get(selected)
                self.conn.rename(selected, f"{OUT['archive']}/{name}~client~{_stamp()}")
                with self.cv:
                    self.waiters.pop(uid).set()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join(10)
        self.conn.close()


def reqresp(spec: dict[str, Any]) -> dict[str, Any]:
    p = spec["params"]
    prepare_area(spec["target"])
    nodes = _nodes(spec, p["nodes"], "echo")
    body = os.urandom(p.get("size", 1024))
    latencies: list[float] = []
    done = [0]
    lock = threading.Lock()
    conns = [connect(spec["target"]) for _ in range(p["clients"])]
    responses = _Responses(spec["target"])
    stop_at = [float("inf")]
    measuring = threading.Event()

    def request(conn: Any) -> None:
        uid = str(uuid.uuid4())
        name = f"req.{uid}"
        waiter = responses.expect(uid)
        conn.put(f"{IN['stage']}/{name}~client", body)
        conn.rename(f"{IN['stage']}/{name}~client", f"{IN['box']}/{name}")
        if not waiter.wait(60):
            raise TimeoutError(f"no response to {name}")

    def loop(conn: Any) -> None:
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            request(conn)
            if measuring.is_set():
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    done[0] += 1

    try:
        nodes.go()
        request(conns[0])
        threads = [threading.Thread(target=loop, args=(c,)) for c in conns]
        elapsed = measure(threads, measuring, done, stop_at, p)
    finally:
        responses.close()
        for c in conns:
            c.close()
        stats = nodes.finish()
    ms = [x * 1000 for x in latencies]
    return {"rate": done[0] / elapsed, "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "requests": done[0], "lost_races": sum(s["lost_races"] for s in stats),
            "node_cpu_ms_per_msg": per_message_ms(stats, sum(s["handled"] for s in stats))}


def idle(spec: dict[str, Any]) -> dict[str, Any]:
    """The target of the idle case: one listing per endpoint per poll_interval, nothing else."""
    from common import CountingProxy

    p = spec["params"]
    target = dict(spec["target"])
    for i in range(p["endpoints"]):
        d = Path(target["root"]) / f"ex{i}" / "inbox"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)
    proxy = CountingProxy(target["host"], target["port"]) if target["kind"] != "sshd" else None
    if proxy is not None:
        target["port"] = proxy.port
    conn = connect(target)
    listings: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for i in range(p["endpoints"]):
                listings.append(time.monotonic())
                conn.names(f"ex{i}/inbox")
            stop.wait(p["poll_interval"])

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(p.get("settle", 1.5))
    began = time.monotonic()
    time.sleep(p["seconds"])
    ended = time.monotonic()
    stop.set()
    thread.join(10)
    conn.close()
    window = ended - began
    out: dict[str, Any] = {"listings_per_s": sum(began <= t < ended for t in listings) / window}
    if proxy is not None:
        cmds = [c for t, c in proxy.commands if began <= t < ended]
        out["commands_per_s"] = len(cmds) / window
        out["command_kinds"] = sorted(set(cmds))
        proxy.close()
    return out


def large(spec: dict[str, Any]) -> dict[str, Any]:
    p = spec["params"]
    prepare_area(spec["target"])
    conn = connect(spec["target"])
    name = f"msg.{uuid.uuid4()}"
    settle_disk()
    began = time.perf_counter()
    with open(p["source"], "rb") as fh:
        conn.put_stream(f"{IN['stage']}/{name}~floor", fh)
    conn.rename(f"{IN['stage']}/{name}~floor", f"{IN['box']}/{name}")
    send_s = time.perf_counter() - began
    conn.close()
    send_rss = peak_rss_mib()
    recv_s, stats = receive_large(_nodes(spec, 1, "large"), lambda: _wait_select_empty(spec))
    return large_figures(p["size"], send_s, recv_s, send_rss, stats)


def fanout(spec: dict[str, Any]) -> dict[str, Any]:
    """The fan-out case's floor: the same backlog, names ``msg.<uuid4>``, one bare node."""
    p = spec["params"]
    target = spec["target"]
    subs = subscription_names(p["subscriptions"])
    prepare_topic(target, subs)
    fill_names(target, topic_dirs(subs)["incoming/box"], [f"msg.{uuid.uuid4()}" for _ in range(p["backlog"])],
               p["size"])
    nodes = _nodes(spec, 1, "fanout")
    try:
        began = nodes.go()
        elapsed = fanned_out(target, subs, p["backlog"], began)
    finally:
        stats = nodes.finish()
    return {"rate": p["backlog"] / elapsed, "fanned_out": p["backlog"], "polls": stats[0]["polls"],
            "node_rss_mib": stats[0]["rss_mib"], "node_cpu_ms_per_msg": per_message_ms(stats, p["backlog"])}


CASES = {"send": send, "consume": consume, "reqresp": reqresp, "idle": idle, "large": large,
         "fanout": fanout}
