"""The self-contained demonstration behind ``ftpbc demo``.

It runs, in this one process and on loopback only: the embedded FTP server
(:class:`~ftpbc.embedded.EmbeddedFTPServer`) serving a temporary directory, two serving
:class:`~ftpbc.node.serve.Node` objects with distinct node ids (each with its own journal, both
sharing one ``state_dir`` and so one file lock per endpoint), and a :class:`~ftpbc.client.Client`
whose threads send requests and check every answer.  Nothing is mocked: every message is staged,
renamed, claimed, archived and answered through real FTP sessions, exactly as between machines.

Each node answers ``<node-id>:<REQUEST IN UPPER CASE>``, so the client can tell which node served
each request and attribute its round-trip time to that node.

Guaranteed: :func:`run_demo` stops the nodes, the client and the server and (unless ``keep`` is
given) deletes the temporary directory, also when a request fails.  Not guaranteed: the figures
are one run on this machine with both nodes sharing one interpreter (and its GIL); separate
processes or hosts do better.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ftpbc.config.models import Config, EndpointConfig, NodeConfig
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import FtpbcError
from ftpbc.model.message import Message

ENDPOINT = "demo"
NODE_IDS = ("node-a", "node-b")
CLIENT_ID = "demo-client"
#: short polls keep round trips in the tens of milliseconds on an idle endpoint
POLL_INTERVAL = 0.02


@dataclass
class NodeReport:
    node_id: str
    served: int = 0
    failed: int = 0
    lost_races: int = 0
    #: round trips (seconds) of the requests this node answered, as the client measured them
    round_trips: list[float] = field(default_factory=list)


@dataclass
class DemoReport:
    requests: int
    clients: int
    elapsed: float
    nodes: list[NodeReport]
    #: "request <i>: <what went wrong>" for every request that did not get its expected answer
    errors: list[str]
    exchange_dir: Path | None

    @property
    def answered(self) -> int:
        return sum(len(n.round_trips) for n in self.nodes)

    @property
    def ok(self) -> bool:
        return not self.errors and self.answered == self.requests


def build_config(root: Path, server_url: str, password: str, node_id: str) -> Config:
    """The configuration every participant of the demo shares, under ``root``."""
    server = ServerConfig.from_url(server_url, password=password, name="embedded")
    return Config(
        node=NodeConfig(id=node_id, state_dir=root / "state", journal_dir=root / "journals"),
        servers={"embedded": server},
        endpoints={ENDPOINT: EndpointConfig(server="embedded", repository=f"/{ENDPOINT}",
                                            poll_interval=POLL_INTERVAL, workers=4)},
        source="<demo>",
    )


def tagging_handler(node_id: str) -> Callable[[Message], bytes]:
    prefix = f"{node_id}:".encode()

    def handle(message: Message) -> bytes:
        return prefix + message.body.upper()

    return handle


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@contextmanager
def _workspace(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    root = Path(tempfile.mkdtemp(prefix="ftpbc-demo-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_demo(requests: int = 300, clients: int = 4, *, keep: Path | None = None,
             progress: Callable[[int], None] | None = None) -> DemoReport:
    """Serve ``requests`` requests from ``clients`` threads through two nodes; see the module doc.

    ``progress(n)`` is called (from client threads) each time ``n`` more requests finished.
    """
    from ftpbc.client import Client
    from ftpbc.embedded import EmbeddedFTPServer
    from ftpbc.node.serve import Node

    with _workspace(keep) as root:
        (root / "ftp").mkdir(exist_ok=True)
        password = secrets.token_urlsafe(16)
        server = EmbeddedFTPServer(root / "ftp", password=password, user="demo").start()
        nodes: list[Node] = []
        client: Client | None = None
        reports = {nid: NodeReport(nid) for nid in NODE_IDS}
        errors: list[str] = []
        lock = threading.Lock()
        try:
            for nid in NODE_IDS:
                node = Node(build_config(root, server.url, password, nid),
                            handlers={ENDPOINT: tagging_handler(nid)})
                nodes.append(node)
                node.start()
            client = Client(build_config(root, server.url, password, CLIENT_ID),
                            connections=clients + 2)

            def one(i: int) -> None:
                assert client is not None
                body = f"request {i} of the ftpbc demo".encode()
                began = time.monotonic()
                try:
                    answer = client.request(ENDPOINT, body, timeout=30)
                except FtpbcError as exc:
                    with lock:
                        errors.append(f"request {i}: {exc}")
                    return
                finally:
                    if progress is not None:
                        progress(1)
                took = time.monotonic() - began
                nid, _, rest = answer.decode("utf-8", "replace").partition(":")
                with lock:
                    if nid not in reports or rest.encode() != body.upper():
                        errors.append(f"request {i}: unexpected answer {answer[:80]!r}")
                    else:
                        reports[nid].round_trips.append(took)

            started = time.monotonic()
            with ThreadPoolExecutor(clients, thread_name_prefix="demo-client") as pool:
                list(pool.map(one, range(requests)))
            elapsed = time.monotonic() - started
        finally:
            if client is not None:
                client.close()
            for node in nodes:
                node.stop(drain_timeout=5)
            server.stop()
        for node in nodes:
            stats = node.providers[ENDPOINT].stats
            report = reports[node.node_id]
            report.served, report.failed, report.lost_races = stats.served, stats.failed, stats.lost_races
        return DemoReport(requests, clients, elapsed, list(reports.values()), errors,
                          keep if keep is not None else None)


def _row(label: str, served: int, answered: int, round_trips: list[float],
         report: DemoReport) -> tuple[str, ...]:
    share = answered / report.requests * 100 if report.requests else 0.0
    rate = served / max(report.elapsed, 1e-9)
    return (label, str(served), f"{share:.0f}%", f"{rate:.0f}", f"{percentile(round_trips, 50) * 1000:.1f}",
            f"{percentile(round_trips, 95) * 1000:.1f}")


def format_report(report: DemoReport) -> str:
    """The table ``ftpbc demo`` prints: one row per node, then the totals and a summary line.

    ``share`` is the part of all requests a node answered; ``req/s`` is what it served per second
    of the run; p50/p95 are the round trips the client measured for the requests it answered.
    """
    header = ("node", "served", "share", "req/s", "p50 ms", "p95 ms")
    rows = [_row(n.node_id, n.served, len(n.round_trips), n.round_trips, report) for n in report.nodes]
    every = [t for n in report.nodes for t in n.round_trips]
    total = _row("all", sum(n.served for n in report.nodes), report.answered, every, report)
    widths = [max(len(r[i]) for r in (header, *rows, total)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([
        line(header), rule, *(line(r) for r in rows), rule, line(total),
        f"{report.answered}/{report.requests} requests answered correctly by {len(report.nodes)} nodes "
        f"from {report.clients} client threads in {report.elapsed:.2f} s; {len(report.errors)} error(s)",
    ])
