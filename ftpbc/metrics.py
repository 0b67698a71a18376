"""Prometheus metrics of a serving node and of a client: names, the observers that report events
to them, and the small HTTP server that exposes a registry.

Every metric lives in a :class:`~prometheus_client.CollectorRegistry` of its own per node (never
the process-wide default), so several nodes in one process (tests, the demo) do not collide.
Labels: ``endpoint`` (an endpoint or transfer name) and ``node`` (the node id).

Two kinds of figures:

* events a provider reports as they happen, through an :class:`EndpointObserver` (messages
  received, bytes, handler and end-to-end latency, what the last listing found, claims
  returned, dead letters): :class:`PrometheusObserver` counts them;
* figures read at scrape time from what the node keeps anyway (``ProviderStats`` counters, the
  in-flight count, the journal, liveness, the heartbeat): see :mod:`ftpbc.node.health`.

A client (``Client(..., metrics=True)``) counts what it asks and gets in a
:class:`ClientMetrics` (``ftpbc_client_...``), a registry of its own too.  :func:`serve_http`
serves any registry on ``/metrics`` (with ``/healthz`` and ``/readyz``, and whatever further
read-only :class:`Page` its caller injects, such as the node's status page): the node's health
server and a client's ``metrics_port`` share it, since the client may not import the node.

This module imports nothing of ftpbc, so any layer may report to an observer.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = logging.getLogger("ftpbc.metrics")

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

    def completed(self, sent: datetime | None, response_bytes: int) -> None:
        """A message is done (committed, its reply out): end-to-end latency from ``sent`` (the
        send stamp its name carries, else its file's modification time)."""

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
            "End-to-end latency: from the message's send stamp (else its file's modification time) to "
            "its reply being out.",
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

    def completed(self, sent: datetime | None, response_bytes: int) -> None:
        if response_bytes > 0:
            self._sent_bytes.inc(response_bytes)
        age = age_seconds(sent)
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


# ---------------------------------------------------------------------------- a client's metrics


class ClientObserver:
    """What a client reports as it works; this base class ignores everything (no metrics)."""

    def sent(self, endpoint: str) -> None:
        """A request went out (``request`` or ``submit``)."""

    def answered(self, endpoint: str, outcome: str, seconds: float | None) -> None:
        """A response reached its caller: ``outcome`` ``ok``, ``error`` (the handler failed) or
        ``expired`` (the request expired unserved); ``seconds`` since it was sent, if known."""

    def timed_out(self, endpoint: str) -> None:
        """A caller gave up waiting (RequestTimeout)."""

    @contextmanager
    def waiting(self, endpoint: str) -> Iterator[None]:
        """Around a caller's wait for its response."""
        yield


#: the observer of a client nobody watches
NULL_CLIENT_OBSERVER = ClientObserver()


class ClientMetrics(ClientObserver):
    """A client's metrics, in a registry of its own (a client beside a node in one process, or
    two clients, must not collide).  Labels: ``endpoint`` and ``node`` (the client's identity)."""

    def __init__(self, node_id: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.node_id = node_id
        r = self.registry
        self._sent = Counter("ftpbc_client_requests_sent", "Requests this client sent.", LABELS, registry=r)
        self._received = Counter("ftpbc_client_responses_received",
                                 "Responses handed to a waiting caller (answers, error and expiry replies).",
                                 LABELS, registry=r)
        self._errors = Counter("ftpbc_client_error_responses",
                               "Error replies: the provider's handler failed (RemoteHandlerError).",
                               LABELS, registry=r)
        self._expired = Counter("ftpbc_client_requests_expired",
                                "Requests that expired before any provider served them (RequestExpired).",
                                LABELS, registry=r)
        self._timeouts = Counter("ftpbc_client_requests_timed_out",
                                 "Waits for a response that gave up (RequestTimeout).", LABELS, registry=r)
        self._seconds = Histogram("ftpbc_client_request_seconds",
                                  "Round trip of request(): from sending to the response in hand.",
                                  LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self._in_flight = Gauge("ftpbc_client_requests_in_flight",
                                "Callers waiting for a response now (request and collect).", LABELS,
                                registry=r)

    def _labels(self, endpoint: str) -> dict[str, str]:
        return {"endpoint": endpoint, "node": self.node_id}

    def sent(self, endpoint: str) -> None:
        self._sent.labels(**self._labels(endpoint)).inc()

    def answered(self, endpoint: str, outcome: str, seconds: float | None) -> None:
        labels = self._labels(endpoint)
        self._received.labels(**labels).inc()
        if outcome == "error":
            self._errors.labels(**labels).inc()
        elif outcome == "expired":
            self._expired.labels(**labels).inc()
        if seconds is not None:
            self._seconds.labels(**labels).observe(max(seconds, 0.0))

    def timed_out(self, endpoint: str) -> None:
        self._timeouts.labels(**self._labels(endpoint)).inc()

    @contextmanager
    def waiting(self, endpoint: str) -> Iterator[None]:
        gauge = self._in_flight.labels(**self._labels(endpoint))
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()


# ---------------------------------------------------------------------------- HTTP

#: seconds a connection has to send its whole request, and for each read and write after
HTTP_TIMEOUT = 5.0
#: connections served at once, each on a thread of its own
HTTP_MAX_CONNECTIONS = 64
#: seconds a new connection waits for a slot freed by closing the oldest one still reading
_SLOT_WAIT = 1.0


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that holds at most ``max_connections`` threads and gives each
    connection ``timeout`` seconds to send its request.

    Guaranteed: at most ``max_connections`` handler threads at any time; a connection that has
    not sent its whole request ``timeout`` seconds after it was accepted (silent, or trickling a
    byte at a time) is closed within a poll interval after that; each read and write times out
    after ``timeout`` seconds without progress.  When every slot is taken, a new connection
    closes the connection that has been waiting longest for its request to arrive, so clients
    that send their request at once are served while idle connections pile up; if every slot
    is busy answering, the new one gets a 503 and is closed.  Not guaranteed: any share of the
    slots to one client, or service under a flood faster than connections can be accepted.
    """

    daemon_threads = True
    # a backlog to absorb a burst of connections while the accept loop closes idle ones
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int = HTTP_MAX_CONNECTIONS, timeout: float = HTTP_TIMEOUT) -> None:
        self.max_connections = max_connections
        self.request_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        #: open connections -> time.monotonic() each was accepted, None once its request arrived
        self._open: dict[socket.socket, float | None] = {}
        #: connections refused for want of a slot (for tests and logs)
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._close_oldest_reading()
            if not self._slots.acquire(timeout=_SLOT_WAIT):
                self._refuse(request)
                return
        with self._lock:
            self._open[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._finished(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._finished(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver's default prints a traceback to stderr.  A client that hangs up or stalls
        # mid-request (a scraper's timeout, a probe that only connects) is normal here and worth
        # a debug line; anything else is a fault of ours and goes to the log with its traceback.
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.debug("HTTP client %s went away: %s", client_address, error)
        else:
            log.warning("HTTP request from %s failed", client_address, exc_info=True)

    def request_arrived(self, request: Any) -> None:
        """The handler read the request on ``request``: it no longer counts as waiting."""
        with self._lock:
            if request in self._open:
                self._open[request] = None

    def service_actions(self) -> None:
        # Called by serve_forever at least every poll interval: the deadline of connections
        # that trickle their request, which the per-read timeout alone does not end.
        deadline = time.monotonic() - self.request_timeout
        with self._lock:
            late = [conn for conn, accepted in self._open.items()
                    if accepted is not None and accepted < deadline]
            for conn in late:
                self._open[conn] = None  # hung up once
        for conn in late:
            _hang_up(conn)

    def server_close(self) -> None:
        super().server_close()
        # Handler threads are daemons, not joined: hanging up ends the ones still reading now.
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            _hang_up(conn)

    def _finished(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)
        self._slots.release()

    def _close_oldest_reading(self) -> None:
        with self._lock:
            reading = [(accepted, n, conn) for n, (conn, accepted) in enumerate(self._open.items())
                       if accepted is not None]
            oldest = min(reading)[2] if reading else None
            if oldest is not None:
                self._open[oldest] = None  # hung up once; its thread frees the slot as it ends
        if oldest is not None:
            _hang_up(oldest)

    def _refuse(self, request: Any) -> None:
        self.refused += 1
        try:
            # Non-blocking: the accept loop never waits on a client.
            request.setblocking(False)
            request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
        except OSError:
            pass
        self.shutdown_request(request)


def _hang_up(conn: socket.socket) -> None:
    """Wake the thread reading ``conn``: the read returns end-of-file and the handler ends."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


@dataclass(frozen=True)
class Page:
    """One reply of a page injected into :func:`serve_http`: status, body, content type and any
    further headers (a content security policy, say)."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


#: the methods the server answers; every other one gets 405 (nothing it serves changes state)
ALLOWED_METHODS = "GET, HEAD"


@dataclass
class HttpServer:
    """A running ``/metrics`` ``/healthz`` ``/readyz`` server: :meth:`close` stops it."""

    registry: CollectorRegistry
    server: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_http(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0, *,
               not_ready: Callable[[], list[str]] | None = None,
               before_scrape: Callable[[], None] | None = None, name: str = "metrics",
               pages: Mapping[str, Callable[[], Page]] | None = None,
               max_connections: int = HTTP_MAX_CONNECTIONS, timeout: float = HTTP_TIMEOUT) -> HttpServer:
    """Serve ``registry`` on ``host:port`` (0: any free port) from a daemon thread.

    ``/metrics``: the registry (``before_scrape`` called first); ``/healthz``: 200 while the
    process answers; ``/readyz``: 503 naming what ``not_ready`` returns, 200 when it returns
    nothing (or there is no such check).  OSError when the port cannot be bound.  Slow or idle
    clients hold no more than ``max_connections`` threads, each for at most ``timeout``
    seconds before their request arrives (:class:`BoundedHTTPServer`)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "ftpbc"
        #: the request is a HEAD: headers only
        _head = False

        def parse_request(self) -> bool:
            parsed = super().parse_request()  # the request line was read; this reads the headers
            server: BaseServer = self.server
            if isinstance(server, BoundedHTTPServer):
                server.request_arrived(self.request)
            return parsed

        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def _refuse_method(self) -> None:
            self._reply(405, b"method not allowed: this server only reads (GET, HEAD)\n",
                        headers=(("Allow", ALLOWED_METHODS),))

        def __getattr__(self, name: str) -> Any:
            # handle_one_request looks up do_<METHOD>: every method but GET and HEAD, known or
            # not (POST, DELETE, PROPFIND...), gets 405 rather than the default 501.
            if name.startswith("do_"):
                return self._refuse_method
            raise AttributeError(name)

        def _answer(self, head: bool) -> None:
            self._head = head
            path = self.path.split("?", 1)[0]
            page = pages.get(path) if pages is not None else None
            if page is not None:
                try:
                    reply = page()
                except Exception as exc:  # one failing page never takes the server down
                    log.warning("page %s failed: %s: %s", path, type(exc).__name__, exc)
                    self._reply(500, f"{path} failed: {type(exc).__name__}\n".encode())
                    return
                self._reply(reply.status, reply.body, reply.content_type, reply.headers)
            elif path == "/metrics":
                if before_scrape is not None:
                    before_scrape()
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                why = not_ready() if not_ready is not None else []
                body = ("ready\n" if not why else "not ready: " + "; ".join(why) + "\n").encode()
                self._reply(503 if why else 200, body)
            else:
                known = ", ".join(["/metrics", "/healthz", "/readyz", *sorted(pages or {})])
                self._reply(404, f"not found: try {known}\n".encode())

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                   headers: tuple[tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            if not self._head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    # Each read and write of a connection (StreamRequestHandler puts it on the socket); set
    # here, as a class body cannot read this function's parameter of the same name.
    Handler.timeout = timeout
    server = BoundedHTTPServer((host, port), Handler, max_connections=max_connections, timeout=timeout)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name,
                              daemon=True)
    thread.start()
    return HttpServer(registry, server, thread)
