"""A node's HTTP endpoints for operators: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``,
and the status page ``/`` (with ``/status.json``: :mod:`ftpbc.node.status_page`).

:func:`serve_metrics` starts a small HTTP server (:func:`ftpbc.metrics.serve_http`, which a
client's metrics share) on a thread of its own for one
:class:`~ftpbc.node.serve.Node` and returns a handle to stop it.  Nothing here changes what the
node does: the figures are read from what it keeps anyway (its providers' counters, in-flight
counts, journals, the liveness of its loops, its heartbeat file) when Prometheus scrapes, and
each provider gets an observer (:mod:`ftpbc.metrics`) for the events that are only seen as they
happen.  Every node has a :class:`~prometheus_client.CollectorRegistry` of its own.

``/healthz``  200 while the process answers at all.
``/readyz``   200 once the node serves and every background loop made progress within its own
              interval (pollers: a few poll intervals; the sweeper: its round); 503 with the
              stuck loops named otherwise, or ``not serving: <why>`` while its start-up is
              still failing (a refused login, a server down...).  Loops that fail or hang (a
              poll lock that raises, a server that hangs) show here long before the heartbeat
              stops (half the lease).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ftpbc.cluster.liveness import Liveness
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError
from ftpbc.journal import journal_problems
from ftpbc.metrics import HttpServer, NodeMetrics, Page, PrometheusObserver, serve_http
from ftpbc.node.poller import Poller
from ftpbc.node.provider import Provider
from ftpbc.node.status_page import StatusCache, cached_cluster_status, status_pages

log = logging.getLogger("ftpbc.health")

#: a poller is stuck after this many poll intervals without progress (and never under MIN_POLLER)
POLLER_INTERVALS = 3.0
#: seconds: a busy poller reports progress every 0.5 s while it waits for a free worker
MIN_POLLER = 2.0


class Watched(Protocol):
    """What the metrics read of a node (:class:`~ftpbc.node.serve.Node` has it)."""

    config: Config
    providers: dict[str, Poller]

    @property
    def node_id(self) -> str: ...

    @property
    def runtime(self) -> _RuntimeLike: ...


class _RuntimeLike(Protocol):
    @property
    def liveness(self) -> Liveness: ...

    @property
    def heartbeat(self) -> object: ...


# ---------------------------------------------------------------------------- readiness


def loop_interval(node: Watched, loop: str) -> float:
    """How long loop ``loop`` may go without progress before the node is not ready."""
    config = node.config
    kind, _, name = loop.partition(" ")
    if kind == "poller":
        provider = node.providers.get(name)
        interval = provider.config.poll_interval if provider is not None else 1.0
        return max(POLLER_INTERVALS * interval, MIN_POLLER)
    if kind == "sweeper":
        return 2 * config.node.lease / 3 + MIN_POLLER  # a sweep round is lease / 3
    return config.node.lease / 2  # what the heartbeat itself tolerates


def loop_ages(liveness: Liveness) -> list[tuple[str, float]]:
    """Every watched loop with the seconds since its last progress."""
    return liveness.stuck(-1.0)


def not_ready(node: Watched) -> list[str]:
    """Why the node is not ready; empty when it is."""
    # A Node says why its start-up has not succeeded yet (the last failure, or that it has not
    # tried yet); other watched objects may not, and are judged by their providers alone.
    why = getattr(node, "not_serving", None)
    if isinstance(why, str):
        return [f"not serving: {why}"]
    served = (getattr(node, "handlers", None) or getattr(node, "transfer_handlers", None)
              or getattr(node, "topics", None))
    if served and not node.providers:
        return ["starting: recovery or the servers are not done yet"]
    stuck = [f"{loop} made no progress for {age:.1f} s (allowed {loop_interval(node, loop):g} s)"
             for loop, age in loop_ages(node.runtime.liveness) if age > loop_interval(node, loop)]
    # Damaged journal records the node went without: it serves everything else, but stays not
    # ready, so that someone looks, until their side file is removed (journals/README.md).
    return stuck + journal_problems(Path(node.config.node.journal_dir), node.node_id)


# ---------------------------------------------------------------------------- the collector


def heartbeat_age(heartbeat: object) -> float | None:
    """Seconds since this node's heartbeat file was written; None if it has none (yet)."""
    path = getattr(heartbeat, "path", None)
    if not isinstance(path, Path):
        return None
    try:
        return max(time.time() - path.stat().st_mtime, 0.0)
    except OSError:
        return None


class NodeCollector(Collector):
    """Figures read from a node at scrape time (counters it keeps, gauges of its state)."""

    def __init__(self, node: Watched) -> None:
        self.node = node

    def describe(self) -> list[object]:
        return []  # collected afresh each time: providers come and go with start and stop

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        node = self.node
        nid = node.node_id
        labels = ["endpoint", "node"]
        counters = {
            "served": CounterMetricFamily("ftpbc_messages_served", "Messages served and answered.",
                                          labels=labels),
            "failed": CounterMetricFamily("ftpbc_messages_failed",
                                          "Messages whose handler raised (error reply sent).", labels=labels),
            "expired": CounterMetricFamily("ftpbc_messages_expired",
                                           "Messages found past their expiration and filed.", labels=labels),
            "lost_claims": CounterMetricFamily("ftpbc_claims_lost",
                                               "Claims this node lost after taking them (returned by "
                                               "another node that thought it dead).", labels=labels),
            "lost_races": CounterMetricFamily("ftpbc_claim_races_lost",
                                              "Claims another node won first (normal with competing nodes).",
                                              labels=labels),
            "polls": CounterMetricFamily("ftpbc_polls", "Polls of the box (claims made, or tried).",
                                         labels=labels),
            "listings": CounterMetricFamily("ftpbc_listings", "Listings of the box (whole, or a part of "
                                            "a large one).", labels=labels),
            "lock_busy": CounterMetricFamily("ftpbc_poll_lock_busy", "Polls that found the poll lock held "
                                             "by another poller and skipped their turn.", labels=labels),
        }
        in_flight = GaugeMetricFamily("ftpbc_in_flight_messages", "Messages claimed and not finished.",
                                      labels=labels)
        poll_age = GaugeMetricFamily("ftpbc_last_poll_age_seconds",
                                     "Seconds since the last poll that did not fail.", labels=labels)
        pending = GaugeMetricFamily("ftpbc_journal_pending_operations",
                                    "Operations begun in this node's journal and not ended.", labels=labels)
        now = time.monotonic()
        for name, poller in list(node.providers.items()):
            values = [name, nid]
            stats = poller.stats
            with stats.lock:
                figures = {"served": stats.served, "failed": stats.failed, "lost_claims": stats.lost_claims,
                           "lost_races": stats.lost_races, "polls": stats.polls,
                           "listings": stats.listings, "lock_busy": stats.lock_busy}
            figures["expired"] = int(getattr(poller, "expired", 0))
            for key, family in counters.items():
                family.add_metric(values, figures[key])
            in_flight.add_metric(values, poller.in_flight)
            if stats.last_poll:
                poll_age.add_metric(values, max(now - stats.last_poll, 0.0))
            if isinstance(poller, Provider):
                try:
                    pending.add_metric(values, len(poller.lifecycle.journal.pending()))
                except Exception as exc:  # a scrape never fails over one figure
                    log.debug("journal of %s: %s", name, exc)
        yield from counters.values()
        yield from (in_flight, poll_age, pending)
        node_labels = ["node"]
        heartbeat = GaugeMetricFamily("ftpbc_heartbeat_age_seconds",
                                      "Seconds since this node's heartbeat was written.", labels=node_labels)
        age = heartbeat_age(node.runtime.heartbeat)
        heartbeat.add_metric([nid], math.nan if age is None else age)
        yield heartbeat
        loops = GaugeMetricFamily("ftpbc_loop_idle_seconds",
                                  "Seconds since each background loop last made progress.",
                                  labels=["loop", "node"])
        for loop, idle in loop_ages(node.runtime.liveness):
            loops.add_metric([loop, nid], idle)
        yield loops
        ready = GaugeMetricFamily("ftpbc_ready", "1 when /readyz answers 200.", labels=node_labels)
        ready.add_metric([nid], 0.0 if not_ready(node) else 1.0)
        yield ready


# ---------------------------------------------------------------------------- the server


@dataclass
class MetricsServer:
    """A running ``/metrics`` ``/healthz`` ``/readyz`` server: :meth:`close` stops it."""

    node: Watched
    registry: CollectorRegistry
    metrics: NodeMetrics
    http: HttpServer
    #: the status page's cluster figures (listed at most once per its max_age)
    status: StatusCache

    @property
    def host(self) -> str:
        return self.http.host

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        return self.http.url

    def attach(self) -> None:
        """Give every provider of the node an observer (providers are built when it starts)."""
        attach_observers(self.node, self.metrics)

    def close(self) -> None:
        self.http.close()


def attach_observers(node: Watched, metrics: NodeMetrics) -> None:
    """Give every provider of ``node`` an observer counting in ``metrics`` (once each)."""
    for name, poller in list(node.providers.items()):
        current = poller.observer
        if not (isinstance(current, PrometheusObserver) and current.endpoint == name
                and current.metrics is metrics):
            poller.observer = metrics.observer(name)


def serve_metrics(node: Watched, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``node``'s metrics and health over HTTP on ``host:port`` (0: any free port).

    Call it after ``node.start()`` so that every provider reports its events from then on
    (each scrape also attaches providers built later)."""
    registry = CollectorRegistry(auto_describe=False)
    metrics = NodeMetrics(registry, node.node_id)
    registry.register(NodeCollector(node))
    attach_observers(node, metrics)
    cache = cached_cluster_status(node.config)

    def scrape() -> None:
        attach_observers(node, metrics)

    pages = status_pages(node.node_id, registry, lambda: not_ready(node), cache)
    # The page reads the registry as a scrape does: providers built since are attached first.
    pages = {path: _after(scrape, page) for path, page in pages.items()}
    try:
        http = serve_http(registry, host, port, not_ready=lambda: not_ready(node), before_scrape=scrape,
                          name=f"metrics-{node.node_id}", pages=pages)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
                          key="node.metrics", file=node.config.source) from None
    handle = MetricsServer(node, registry, metrics, http, cache)
    log.info("metrics on http://%s:%d/metrics (health: /healthz, /readyz; status page: /)", handle.host,
             handle.port)
    return handle


def _after(first: Callable[[], None], page: Callable[[], Page]) -> Callable[[], Page]:
    def run() -> Page:
        first()
        return page()
    return run


def serve_configured_metrics(node: Watched, port: int | None = None) -> MetricsServer | None:
    """:func:`serve_metrics` on ``port`` (``--metrics-port``) or the configuration's
    ``node.metrics``; None when neither asks for it."""
    configured = node.config.node.metrics
    if port is None:
        if configured is None:
            return None
        port = configured.port
    return serve_metrics(node, configured.host if configured is not None else "127.0.0.1", port)
