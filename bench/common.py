"""What both sides of every benchmark share: ftpbc configurations, child processes, counting.

Nothing here is measured itself.  The exchange-area layout of the floor scripts is ftpbc's own
(``inbox``, ``instage``, ``inselect``, ``inarchive``, ``out...``), so both sides touch the same
number of directories and the listings they do cost the same.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for p in (str(REPO), str(REPO / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

from servers import Target, server_config  # noqa: E402

from ftpbc.exchange.area import ExchangeArea  # noqa: E402

# fork: a child starts in milliseconds instead of re-importing ftpbc (about a second on a busy
# 2-core box); every Nodes group is created before the parent starts any thread.
MP = mp.get_context("fork")
REPOSITORY = "/ex"


def area() -> ExchangeArea:
    return ExchangeArea(REPOSITORY)


def rel(path: str) -> str:
    """A remote path of the exchange area relative to the target's base."""
    return path.lstrip("/")


def prepare_area(target: Target) -> None:
    """Create the exchange directories on the server's disk, writable by any server user."""
    for d in area().all_dirs():
        local = Path(target["root"]) / rel(d)
        local.mkdir(parents=True, exist_ok=True)
        local.chmod(0o777)


def fill_inbox(target: Target, count: int, size: int, prefix: str = "msg.",
               suffix: Callable[[], str] = str) -> list[str]:
    """Write ``count`` messages straight into the inbox on the server's disk (untimed set-up);
    ``suffix()`` ends each name (header fields such as ``;p=9``; none by default)."""
    inbox = Path(target["root"]) / rel(area().dir("in", "box"))
    body = os.urandom(size)
    names = []
    for _ in range(count):
        name = f"{prefix}{uuid.uuid4()}{suffix()}"
        (inbox / name).write_bytes(body)
        names.append(name)
    # Older than "now": ftpbc takes the oldest first; give them distinct, past mtimes.
    return names


#: the topic of the fan-out case (its subscriptions: :func:`subscription_names`)
TOPIC = "t"


def subscription_names(count: int) -> list[str]:
    """``s00``, ``s01`` ...: by name in numeric order, as fan-outs copy (the last is copied last)."""
    return [f"s{i:02d}" for i in range(count)]


def topic_dirs(subscriptions: list[str]) -> dict[str, str]:
    """The directories of topic TOPIC (repository REPOSITORY, docs/topics.md) relative to the
    target's base: ``incoming/<kind>`` (box, stage, select, archive), ``box/<SUB>`` and
    ``stage/<SUB>`` (a subscription's inbox; where a fan-out stages its copy)."""
    incoming = ExchangeArea(f"{REPOSITORY}/incoming")
    dirs = {f"incoming/{k}": rel(incoming.dir("in", k)) for k in ("box", "stage", "select", "archive")}
    for sub in subscriptions:
        dirs[f"box/{sub}"] = rel(ExchangeArea(f"{REPOSITORY}/subscriptions/{sub}").dir("in", "box"))
        dirs[f"stage/{sub}"] = rel(f"{REPOSITORY}/fanout/{sub}")
    return dirs


def prepare_topic(target: Target, subscriptions: list[str]) -> None:
    """Create topic TOPIC's directories on the server's disk, every exchange area whole,
    writable by any server user (what a node and ``create_subscription`` make: untimed)."""
    areas = [ExchangeArea(f"{REPOSITORY}/incoming"),
             *(ExchangeArea(f"{REPOSITORY}/subscriptions/{s}") for s in subscriptions)]
    dirs = [d for a in areas for d in a.all_dirs()] + [f"{REPOSITORY}/fanout/{s}" for s in subscriptions]
    for d in dirs:
        local = Path(target["root"]) / rel(d)
        local.mkdir(parents=True, exist_ok=True)
        for parent in [local, *local.parents]:
            if parent == Path(target["root"]):
                break
            parent.chmod(0o777)


def fill_names(target: Target, directory: str, names: list[str], size: int) -> None:
    """Write a file of ``size`` random bytes (one body for all) under each of ``names`` into
    ``directory`` (relative to the target's base) on the server's disk: untimed set-up."""
    where = Path(target["root"]) / directory
    body = os.urandom(size)
    for name in names:
        (where / name).write_bytes(body)


def count_files(target: Target, directory: str) -> int:
    """Files in ``directory`` (relative to the target's base) on the server's disk."""
    with os.scandir(Path(target["root"]) / directory) as it:
        return sum(1 for e in it if e.is_file(follow_symlinks=False))


def fanned_out(target: Target, subscriptions: list[str], count: int, began: float,
               timeout: float = 600.0) -> float:
    """Wait until each subscription's inbox holds ``count`` messages (every message fanned out
    whole); return the seconds since ``began`` (time.perf_counter()).

    Only the last subscription by name is counted while it fills (both sides copy to it last,
    so it is the one that completes last, and one directory read per poll costs the measured
    processes little CPU); then every one is checked."""
    dirs = topic_dirs(subscriptions)
    last = dirs[f"box/{subscriptions[-1]}"]
    wait_for(lambda: count_files(target, last) >= count, timeout, f"{count} messages in {last}",
             interval=0.01)
    wait_for(lambda: min(count_files(target, dirs[f"box/{s}"]) for s in subscriptions) >= count, timeout,
             f"{count} messages in every subscription", interval=0.002)
    return time.perf_counter() - began


#: hard links one source file takes at most (ext4 allows 65,000)
LINKS_PER_SOURCE = 60_000


def fill_linked(target: Target, count: int, size: int, prefix: str = "msg.") -> None:
    """Like :func:`fill_inbox`, fast enough for a million: every name a hard link to one of a
    few source files of ``size`` bytes (written once each, next to the exchange area), made
    with ``os.link`` relative to the inbox's descriptor.  The names are the ones a sender
    gives (``msg.<uuid4>``); files of one source share its mtime, so the oldest-first order
    among them falls back to the names, as for any files listed with the same time."""
    inbox = Path(target["root"]) / rel(area().dir("in", "box"))
    sources = Path(target["root"]) / "fill-sources"
    sources.mkdir(exist_ok=True)
    body = os.urandom(size)
    box = os.open(inbox, os.O_RDONLY | os.O_DIRECTORY)
    try:
        source = ""
        for i in range(count):
            if i % LINKS_PER_SOURCE == 0:
                source = str(sources / f"source-{i // LINKS_PER_SOURCE}")
                Path(source).write_bytes(body)
                os.chmod(source, 0o666)
            os.link(source, f"{prefix}{uuid.uuid4()}", dst_dir_fd=box)
    finally:
        os.close(box)


def config(target: Target, workdir: str, node_id: str, endpoints: dict[str, dict[str, Any]], *,
           durable: bool = True, pool_size: int = 4, coordination: str = "state_dir",
           topics: dict[str, dict[str, Any]] | None = None) -> Any:
    """An in-process ftpbc Config for ``target``; every endpoint lives under REPOSITORY, and so
    does every topic of ``topics`` (name -> its ``topics:`` settings) unless it names another.

    ``coordination: server`` keeps locks, heartbeats and sequences in the default
    ``/.ftpbc-cluster`` under the target's base, a fresh directory per run like the exchange area;
    ``state_dir`` (the default) in ``workdir/state``, which the run's nodes and client share.
    """
    from ftpbc.config.models import Config

    if target["kind"] == "file":
        from ftpbc.config.servers import ServerConfig

        # "durable" off compares like with like against kombu: both survive a killed process,
        # neither fsyncs for power failures.
        srv = ServerConfig.from_url(f"file://{target['root']}", name="srv", pool_size=pool_size,
                                    fsync_files=durable)
    else:
        srv = server_config(target, pool_size=pool_size)
    return Config.model_validate({
        "node": {"id": node_id, "state_dir": f"{workdir}/state", "journal_dir": f"{workdir}/journals",
                 "durable_journal": durable, "coordination": coordination},
        "servers": {"srv": srv},
        "endpoints": {name: {"server": "srv", "repository": ep.pop("repository", REPOSITORY), **ep}
                      for name, ep in ((n, dict(e)) for n, e in endpoints.items())},
        "topics": {name: {"server": "srv", "repository": REPOSITORY, **t}
                   for name, t in (topics or {}).items()},
    })


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def settle_disk() -> None:
    """Write back every dirty page before a timed transfer of a large file (untimed).

    A 256 MiB send leaves 256 MiB of dirty pages on the server's disk, a receive as much in its
    spool; without this the next timed phase paid, or did not, for the previous one's writeback
    depending on the kernel's timing, and single runs of the same side varied 3 to 6 fold.
    """
    os.sync()


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used so far, all its threads together."""
    t = os.times()
    return t.user + t.system


def per_message_ms(stats: list[dict[str, Any]], count: int) -> float | None:
    """Node CPU per handled message (ms): the nodes' ``cpu_s`` summed over ``count`` messages.

    CPU per message is the figure to compare while the machine is shared: a rate moves with
    whatever else runs, the CPU a message costs much less."""
    return 1000 * sum(s["cpu_s"] for s in stats) / count if count else None


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- child processes


class Children:
    """Child processes (forked); every one is ended by :meth:`close` (also on errors)."""

    def __init__(self) -> None:
        self.procs: list[Any] = []

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        proc = MP.Process(target=target, args=args, daemon=True)
        proc.start()
        self.procs.append(proc)
        return proc

    def close(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0.1))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(timeout=0.5 if exc[0] is not None else 20.0)


class NodeLink:
    """What a serving node in a child process shares with the parent that runs it (:class:`Nodes`).

    The node calls :meth:`ready` once set up (it returns when the parent says go), :meth:`handled`
    per message, and :meth:`report` once :attr:`stop` is set.  Made in the parent before it forks.
    """

    def __init__(self) -> None:
        #: messages the group has handled; nodes set up; the parent's start and stop signals
        self.counter, self.set_up = MP.Value("q", 0), MP.Value("q", 0)
        self.go, self.stop = MP.Event(), MP.Event()
        #: one report per node, put by :meth:`report`
        self.reports: Any = MP.Queue()

    def ready(self) -> float:
        """Count this node as set up, wait until told to go; the node's CPU seconds at that moment."""
        with self.set_up.get_lock():
            self.set_up.value += 1
        self.go.wait()
        return cpu_seconds()

    def handled(self) -> None:
        with self.counter.get_lock():
            self.counter.value += 1

    def report(self, cpu_at_go: float, stats: dict[str, Any]) -> None:
        """Send ``stats`` plus this node's peak RSS, CPU seconds since go and the messages every
        node of the group handled (``rss_mib``, ``cpu_s``, ``handled``) to the parent."""
        self.reports.put({**stats, "rss_mib": peak_rss_mib(), "cpu_s": cpu_seconds() - cpu_at_go,
                          "handled": self.counter.value})


class Nodes:
    """``count`` serving nodes in child processes, started together by :meth:`go`.

    ``main(node_id, link)`` is one node (ids ``<prefix>-0``, ``<prefix>-1`` ...): it works as
    :class:`NodeLink` says.  :meth:`finish` stops them all and returns each one's report.
    """

    def __init__(self, count: int, main: Callable[[str, NodeLink], None], prefix: str = "node") -> None:
        self.link = NodeLink()
        self.children = Children()
        self.count = count
        for i in range(count):
            self.children.start(main, f"{prefix}-{i}", self.link)

    def go(self) -> float:
        """Start every node at once, once all are set up; the moment they were told to start."""
        wait_for(lambda: self.link.set_up.value >= self.count, 60, "nodes to be set up")
        self.link.go.set()
        return time.perf_counter()

    def finish(self) -> list[dict[str, Any]]:
        self.link.stop.set()
        stats = [self.link.reports.get(timeout=60) for _ in range(self.count)]
        self.children.close()
        return stats

    @property
    def handled(self) -> int:
        return int(self.link.counter.value)


#: what ftpbc's nodes report of their polls besides (ProviderStats): listings of the box, polls
#: that found the poll lock held, seconds holding it and, of those, listing
LOCK_COUNTERS = ("listings", "lock_busy", "lock_held_s", "listing_s")


def consume_figures(count: int, elapsed: float, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The consume case's figures, the same on both sides: ``count`` messages in ``elapsed``
    seconds by nodes that reported ``stats``."""
    return {"rate": count / elapsed, "consumed": count, "lost_races": sum(s["lost_races"] for s in stats),
            "polls": sum(s["polls"] for s in stats), "node_rss_mib": max(s["rss_mib"] for s in stats),
            "node_cpu_ms_per_msg": per_message_ms(stats, sum(s["handled"] for s in stats)),
            # the nodes' poll-lock counters (ftpbc only; ProviderStats)
            **{k: round(sum(s[k] for s in stats), 3) for k in LOCK_COUNTERS if all(k in s for s in stats)}}


def receive_large(nodes: Nodes, select_empty: Callable[[], None]) -> tuple[float, list[dict[str, Any]]]:
    """The large case's timed receive, the same on both sides: after a writeback, ``nodes`` go;
    returns the seconds until they handled one message and ``select_empty()`` returned (its claim
    is archived), and the nodes' reports."""
    try:
        settle_disk()
        began = nodes.go()
        wait_for(lambda: nodes.handled >= 1, 600, "the large message", interval=0.01)
        select_empty()
        recv_s = time.perf_counter() - began
    finally:
        stats = nodes.finish()
    return recv_s, stats


def large_figures(size: int, send_s: float, recv_s: float, send_rss: float,
                  stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The large case's figures, the same on both sides: one ``size``-byte message sent in
    ``send_s`` (the sender's peak RSS ``send_rss``) and received in ``recv_s`` by a node that
    reported ``stats``."""
    mb = size / 1e6
    return {"send_mb_s": mb / send_s, "recv_mb_s": mb / recv_s, "send_rss_mib": send_rss,
            "recv_rss_mib": stats[0]["rss_mib"]}


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- command counting


class CountingProxy:
    """A loopback TCP proxy for an FTP control connection that counts the commands sent through it.

    Data connections are not proxied: PASV/EPSV replies name the real server's address and port
    (EPSV names the port only, and the server is on the same loopback address), so the client
    opens them directly.  Counting lines client -> server counts FTP commands exactly.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.commands: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        pending = b""
        try:
            while data := src.recv(65536):
                if count:
                    pending += data
                    *lines, pending = pending.split(b"\r\n")
                    now = time.monotonic()
                    with self._lock:
                        self.commands.extend((now, ln.split(b" ", 1)[0].decode("ascii", "replace").upper())
                                             for ln in lines)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def since(self, start: float) -> list[str]:
        with self._lock:
            return [c for t, c in self.commands if t >= start]

    def close(self) -> None:
        self._closed = True
        self.listener.close()


def consumed(handled: Callable[[], int], began: float, p: dict[str, Any],
             select_empty: Callable[[], None]) -> tuple[int, float]:
    """Wait for a consume run to end; return (messages handled, seconds since ``began``).

    A run ends after ``p["measure"]`` messages, or after ``p["max_seconds"]`` if given (the
    same window on both sides, so the rates compare: a bare lister of a 10,000-entry SFTP inbox
    does under 50 messages/s, and 1,000 of them would cost a minute per run).  When the whole
    backlog is measured, the run ends only once the last claim is archived (``select_empty``).
    """
    limit = p.get("max_seconds") or 600.0
    deadline = began + limit
    while handled() < p["measure"] and time.perf_counter() < deadline:
        time.sleep(0.002)
    count = min(handled(), p["measure"])
    elapsed = time.perf_counter() - began
    if count < p["measure"] and not p.get("max_seconds"):
        raise TimeoutError(f"timed out after {limit:g} s waiting for messages to be handled")
    if count >= p["backlog"]:
        select_empty()
        elapsed = time.perf_counter() - began
    return count, elapsed


#: the last measured window of this process (time.monotonic(), which is the system's
#: CLOCK_MONOTONIC: comparable across processes), reported by bench/side.py as ``window``
WINDOW: list[float] = []


def measure(threads: list[threading.Thread], measuring: threading.Event, done: list[int],
            stop_at: list[float], p: dict[str, Any]) -> float:
    """Run ``threads`` through a warm-up, then a measured window; return the window's seconds.

    The same window for ftpbc and its floor, so their figures compare: counting starts when
    ``measuring`` is set, ends after ``p["requests"]`` completions or ``p["seconds"]``; then
    ``stop_at[0] = 0`` tells the loops to stop and the threads are joined.
    """
    for t in threads:
        t.start()
    time.sleep(p.get("warmup", 0.5))  # a warm-up period, not a synchronisation
    measuring.set()
    began = time.perf_counter()
    WINDOW[:] = [time.monotonic()]
    if "requests" in p:
        wait_for(lambda: done[0] >= p["requests"], 600, "requests", interval=0.01)
    else:
        time.sleep(p["seconds"])
    elapsed = time.perf_counter() - began
    WINDOW.append(time.monotonic())
    stop_at[0] = 0
    for t in threads:
        t.join()
    return elapsed
