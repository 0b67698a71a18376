"""Prometheus metrics of a serving node (and, later, of a client): names, and the observer a
provider reports its events to.

Every metric lives in a :class:`~prometheus_client.CollectorRegistry` of its own per node (never
the process-wide default), so several nodes in one process (tests, the demo) do not collide.
Labels: ``endpoint`` (an endpoint or transfer name) and ``node`` (the node id).

Two kinds of figures:

* events a provider reports as they happen, through an :class:`EndpointObserver` (messages
  received, bytes, handler and end-to-end latency, what the last listing found, claims
  returned, dead letters): :class:`PrometheusObserver` counts them;
* figures read at scrape time from what the node keeps anyway (``ProviderStats`` counters, the
  in-flight count, the journal, liveness, the heartbeat): see :mod:`ftpbc.node.health`.

This module imports nothing of ftpbc, so any layer may report to an observer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: label names of every per-endpoint metric
LABELS = ("endpoint", "node")

#: seconds: 1 ms to 10 minutes
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0, 600.0)


class EndpointObserver:
    """What a provider reports as it works; this base class ignores everything (no metrics)."""

    def received(self, size: int, mtime: datetime | None) -> None:
        """A claimed message was read: ``size`` bytes, its file last modified at ``mtime``."""

    def handled(self, seconds: float) -> None:
        """The handler returned (or raised) after ``seconds``."""

    def completed(self, mtime: datetime | None, response_bytes: int) -> None:
        """A message is done (committed, its reply out): end-to-end latency from ``mtime``."""

    def listed(self, mtimes: Iterable[datetime | None]) -> None:
        """A listing of the box found these messages waiting (their files' times)."""

    def returned(self, count: int = 1) -> None:
        """Claims handed back to the box (shutdown, unreadable file redelivered)."""

    def dead_lettered(self, count: int = 1) -> None:
        """Messages moved to the dead-letter directory."""


#: the observer of a provider nobody watches
NULL_OBSERVER = EndpointObserver()


class NodeMetrics:
    """The event metrics of one node, in ``registry`` (one registry per node)."""

    def __init__(self, registry: CollectorRegistry, node_id: str) -> None:
        self.registry = registry
        self.node_id = node_id
        r = registry
        self.received = Counter("ftpbc_messages_received", "Messages claimed and read by this node.",
                                LABELS, registry=r)
        self.received_bytes = Counter("ftpbc_received_bytes", "Bytes of messages read by this node.",
                                      LABELS, registry=r)
        self.sent_bytes = Counter("ftpbc_sent_bytes", "Bytes of responses this node delivered.",
                                  LABELS, registry=r)
        self.returned = Counter("ftpbc_messages_returned",
                                "Claims this node handed back to the box (shutdown, redelivery).",
                                LABELS, registry=r)
        self.dead_lettered = Counter("ftpbc_messages_dead_lettered",
                                     "Messages this node moved to the dead-letter directory.", LABELS,
                                     registry=r)
        self.handler_seconds = Histogram("ftpbc_handler_seconds", "Time spent in the handler per message.",
                                         LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.latency_seconds = Histogram(
            "ftpbc_message_latency_seconds",
            "End-to-end latency: from the message file's modification time to its reply being out.",
            LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.inbox_depth = Gauge("ftpbc_inbox_messages", "Messages waiting in the box at the last listing.",
                                 LABELS, registry=r)
        self.inbox_oldest = Gauge("ftpbc_inbox_oldest_message_age_seconds",
                                  "Age of the oldest message waiting at the last listing (0: none).",
                                  LABELS, registry=r)

    def observer(self, endpoint: str) -> PrometheusObserver:
        return PrometheusObserver(self, endpoint)


class PrometheusObserver(EndpointObserver):
    """Counts one endpoint's events in a :class:`NodeMetrics`."""

    def __init__(self, metrics: NodeMetrics, endpoint: str) -> None:
        labels = {"endpoint": endpoint, "node": metrics.node_id}
        self.endpoint = endpoint
        self.metrics = metrics
        self._received = metrics.received.labels(**labels)
        self._received_bytes = metrics.received_bytes.labels(**labels)
        self._sent_bytes = metrics.sent_bytes.labels(**labels)
        self._returned = metrics.returned.labels(**labels)
        self._dead = metrics.dead_lettered.labels(**labels)
        self._handler = metrics.handler_seconds.labels(**labels)
        self._latency = metrics.latency_seconds.labels(**labels)
        self._depth = metrics.inbox_depth.labels(**labels)
        self._oldest = metrics.inbox_oldest.labels(**labels)
        self._lock = threading.Lock()

    def received(self, size: int, mtime: datetime | None) -> None:
        self._received.inc()
        if size > 0:
            self._received_bytes.inc(size)

    def handled(self, seconds: float) -> None:
        self._handler.observe(max(seconds, 0.0))

    def completed(self, mtime: datetime | None, response_bytes: int) -> None:
        if response_bytes > 0:
            self._sent_bytes.inc(response_bytes)
        age = age_seconds(mtime)
        if age is not None:
            self._latency.observe(age)

    def listed(self, mtimes: Iterable[datetime | None]) -> None:
        count = 0
        oldest: datetime | None = None
        for m in mtimes:
            count += 1
            if m is not None and (oldest is None or m < oldest):
                oldest = m
        with self._lock:
            self._depth.set(count)
            self._oldest.set(age_seconds(oldest) or 0.0)

    def returned(self, count: int = 1) -> None:
        self._returned.inc(count)

    def dead_lettered(self, count: int = 1) -> None:
        self._dead.inc(count)


def age_seconds(when: datetime | None, now: float | None = None) -> float | None:
    """Seconds since ``when`` (never negative: server clocks differ a little), None if unknown."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((time.time() if now is None else now) - when.timestamp(), 0.0)
