"""The metrics HTTP server against slow clients (docs/security.md): connections that send nothing
or trickle their request hold a bounded number of threads for a bounded time, and ``/healthz``
and ``/metrics`` keep answering meanwhile.  Every socket a test opens it closes."""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from ftpbc.metrics import HTTP_MAX_CONNECTIONS, HttpServer, serve_http
from tests.support import wait_until


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    Counter("ftpbc_test_things", "Things.", registry=registry).inc()
    return registry


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Client sockets a test opened (append them): closed when it ends, also when it fails."""
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def connect(http: HttpServer, opened: list[socket.socket]) -> socket.socket:
    s = socket.create_connection((http.host, http.port), timeout=10)
    opened.append(s)
    return s


def get(http: HttpServer, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(http.url + path, timeout=10) as reply:
        return reply.status, reply.read()


def hung_up(s: socket.socket) -> bool:
    """Whether the server ended the connection (a reset if it had not read all that was sent)."""
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True


def handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def test_hundreds_of_silent_and_trickling_clients_leave_healthz_and_metrics_answering(
        registry: CollectorRegistry, sockets: list[socket.socket]) -> None:
    http = serve_http(registry, name="metrics-slow-clients")
    try:
        before = handler_threads()
        for n in range(300):
            s = connect(http, sockets)
            if n % 3 == 0:  # the start of a request, never finished
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            elif n % 3 == 1:
                s.sendall(b"G")
            if n % 50 == 49:
                # The accept loop takes connections in order: this one is served after the
                # slow ones before it were each given a thread or hung up.
                assert get(http, "/healthz") == (200, b"ok\n")
                assert handler_threads() - before <= HTTP_MAX_CONNECTIONS
        status, body = get(http, "/metrics")
        assert status == 200 and b"ftpbc_test_things_total 1.0" in body
        assert get(http, "/healthz") == (200, b"ok\n")
        assert handler_threads() - before <= HTTP_MAX_CONNECTIONS
        # The first connections, the longest waiting, were hung up to make room.
        readable, _, _ = select.select(sockets[:10], [], [], 10)
        assert set(readable) == set(sockets[:10])
        assert all(hung_up(s) for s in sockets[:10])
    finally:
        http.close()


def test_a_trickling_client_is_hung_up_at_the_request_deadline(registry: CollectorRegistry,
                                                               sockets: list[socket.socket]) -> None:
    timeout = 0.5
    http = serve_http(registry, name="metrics-trickle", timeout=timeout)
    try:
        s = connect(http, sockets)
        started = time.monotonic()
        request = b"GET /healthz HTTP/1.0\r\n" + b"X-Padding: " + b"y" * 10_000
        hung_up_after = None
        # One byte per 0.1 s: each read succeeds long before the per-read timeout, so only the
        # deadline for the whole request can end it.
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except OSError:  # reset by the server's hang-up
                hung_up_after = time.monotonic() - started
                break
            readable, _, _ = select.select([s], [], [], 0.1)
            if readable:
                assert hung_up(s)  # no reply, the end of the connection
                hung_up_after = time.monotonic() - started
                break
            if time.monotonic() - started > 30:
                break
        assert hung_up_after is not None, "the trickling client was never hung up"
        assert timeout <= hung_up_after < timeout + 10, hung_up_after
        assert get(http, "/healthz") == (200, b"ok\n")
    finally:
        http.close()


def test_when_every_slot_is_answering_a_new_connection_gets_503(sockets: list[socket.socket]) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def blocked() -> list[str]:  # /readyz's check, held until the test releases it
        entered.release()
        release.wait(10)
        return []

    http = serve_http(CollectorRegistry(), name="metrics-busy", max_connections=2, not_ready=blocked)
    try:
        for _ in range(2):
            connect(http, sockets).sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
        for _ in range(2):
            assert entered.acquire(timeout=10)
        refused = connect(http, sockets)
        refused.settimeout(10)
        assert refused.recv(1024).startswith(b"HTTP/1.0 503 ")
        release.set()
        for s in sockets[:2]:
            s.settimeout(10)
            assert s.recv(1024).startswith(b"HTTP/1.0 200 ")
        assert get(http, "/healthz") == (200, b"ok\n")
    finally:
        release.set()
        http.close()


def test_a_client_that_resets_mid_request_costs_a_debug_line_not_a_traceback(
        registry: CollectorRegistry, sockets: list[socket.socket], capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A scraper that gives up (its timeout) resets the connection while the server reads the
    request: the server logs it at debug, prints nothing to stderr and goes on answering."""
    http = serve_http(registry, name="metrics-reset")
    try:
        before = handler_threads()
        caplog.set_level(logging.DEBUG, logger="ftpbc.metrics")
        s = connect(http, sockets)
        # The request line without the blank line that ends the headers: the handler is still
        # reading when the reset arrives, so its read fails, whatever the threads' timing.
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        wait_until(lambda: handler_threads() > before, what="the handler thread to start")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.close()
        wait_until(lambda: any("went away" in r.getMessage() for r in caplog.records),
                   what="the reset to be logged")
        wait_until(lambda: handler_threads() == before, what="the handler thread to end")
        assert get(http, "/healthz") == (200, b"ok\n")
        assert "Traceback" not in capfd.readouterr().err
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        http.close()
