"""On-demand delivery workers, one per live destination of a route (docs/routing.md).

A destination (an endpoint, a topic, a directory on a configured server) gets a worker the first
time a message goes there: its own transport (``capacity`` connections, credentials from the
configured server) and ``capacity`` delivery threads.  A destination with nothing in flight for
``max_idle`` seconds is retired: its threads end and its connections are closed; the next
message for it starts a new worker.  At most ``max_destinations`` live at once: a message for one
more retires the least recently used idle one at once; when every one is busy, it counts a
failed delivery attempt (DestinationsFull) and tries again after the retry policy's wait.

Every delivery attempt is made under one retry policy (:func:`retry_policy`): ``max_retry``
retries of a transport error, waiting ``retry_delay`` doubling (capped at 30 s) between them.

A destination endpoint with a bounded inbox (``max_messages``, ``max_bytes``: docs/queues.md)
is counted before each attempt, as a sender counts it (:class:`~ftpbc.exchange.capacity.Capacity`:
one listing, plus what this destination's threads admitted and have not exposed yet); a full
one fails the attempt (InboxFull), which is retried like any other.

Thread-safe.  Guaranteed: a worker is never retired while a message is in flight to it (taking
a worker and counting the message happen under one lock).  Not guaranteed: connection counts;
a server may close idle connections earlier on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_attempt, wait_exponential

from ftpbc.config.servers import ServerConfig
from ftpbc.errors import QueueFull, TransportError
from ftpbc.exchange.capacity import Capacity
from ftpbc.transport import Transport, open_transport

log = logging.getLogger("ftpbc.route")

T = TypeVar("T")
#: the longest wait between two delivery attempts
MAX_RETRY_WAIT = 30.0


class DestinationsFull(TransportError):
    """``max_destinations`` workers are live and busy: no worker for one more yet."""


class InboxFull(TransportError):
    """A destination endpoint's bounded inbox has no room for the message: ``full`` says what
    the count found.  A failed attempt like any other (nothing was staged)."""

    def __init__(self, full: QueueFull) -> None:
        self.full = full
        super().__init__(f"queue full: endpoint {full.endpoint!r} holds {full.messages} message(s) of "
                         f"{full.waiting_bytes} bytes, {full.limit} is {full.bound}")


def retry_policy(max_retry: int, delay: float, stop: threading.Event) -> Retrying:
    """THE retry policy of deliveries: ``max_retry`` retries of a TransportError (the last one
    is raised), waiting ``delay`` doubling up to MAX_RETRY_WAIT; a stopping node stops waiting."""
    return Retrying(stop=stop_after_attempt(max_retry + 1),
                    wait=wait_exponential(multiplier=delay, max=MAX_RETRY_WAIT) if delay > 0 else _no_wait,
                    retry=retry_if_exception_type(TransportError), reraise=True,
                    sleep=lambda seconds: _wait(stop, seconds),
                    before_sleep=before_sleep_log(log, logging.INFO))


def _wait(stop: threading.Event, seconds: float) -> None:
    stop.wait(seconds)


def _no_wait(_: Any) -> float:
    return 0.0


@dataclass
class Destination:
    """One live destination: its transport, threads and figures."""

    key: str
    server: ServerConfig
    capacity: int
    max_idle: float
    #: set up once per worker (directories made), with its transport
    prepare: Callable[[Transport], None]
    #: the count of a bounded destination inbox, made with the worker's transport (None: unbounded)
    bound: Callable[[Transport], Capacity] | None = None
    delivered: int = 0
    failed: int = 0
    in_flight: int = 0
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        cfg = self.server
        if cfg.pool_size != self.capacity:
            cfg = cfg.model_copy(update={"pool_size": self.capacity})
        self.transport = open_transport(cfg)
        self.room = self.bound(self.transport) if self.bound is not None else None
        self.executor = ThreadPoolExecutor(self.capacity, thread_name_prefix=f"route-{self.key[:24]}")
        self._prepared = False
        self._lock = threading.Lock()

    def admit(self, name: str, size: int, held: ExitStack) -> None:
        """Count the bounded inbox for message ``name`` of ``size`` bytes (nothing to count when
        unbounded): InboxFull when it has no room, whatever the endpoint's ``on_overflow`` (the
        route decides what an overflow becomes).  Once admitted, the message counts as on its
        way here until ``held`` closes (after it is exposed, or given up)."""
        if self.room is None:
            return
        with ExitStack() as attempt:
            try:
                full = attempt.enter_context(self.room.admit(name, size))
            except QueueFull as exc:  # on_overflow: reject
                raise InboxFull(exc) from None
            if full is not None:  # on_overflow: dead_letter
                raise InboxFull(full)
            held.push(attempt.pop_all())

    def run(self, job: Callable[[Transport], T]) -> T:
        """Run ``job`` with this destination's transport on one of its threads; wait for it."""
        return self.executor.submit(self._job, job).result()

    def _job(self, job: Callable[[Transport], T]) -> T:
        with self._lock:
            prepared = self._prepared
        if not prepared:
            self.prepare(self.transport)
            with self._lock:
                self._prepared = True
        return job(self.transport)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.transport.close()

    def info(self, now: float) -> dict[str, object]:
        """What ``ftpbc status`` shows of it."""
        return {"destination": self.key, "server": self.server.name, "capacity": self.capacity,
                "in_flight": self.in_flight, "delivered": self.delivered, "failed": self.failed,
                "idle_seconds": round(0.0 if self.in_flight else now - self.last_used, 1),
                "max_idle": self.max_idle}


class Destinations:
    """The live destinations of one route."""

    def __init__(self, route: str, max_destinations: int) -> None:
        self.route = route
        self.max_destinations = max_destinations
        self._live: dict[str, Destination] = {}
        self._lock = threading.Lock()
        #: workers retired for idleness so far
        self.retired = 0

    def acquire(self, key: str, make: Callable[[], Destination]) -> Destination:
        """The worker of ``key`` (started if needed), with one more message counted in flight;
        :meth:`release` it.  DestinationsFull when none can be started now."""
        evicted = None
        with self._lock:
            dest = self._live.get(key)
            if dest is None:
                if len(self._live) >= self.max_destinations:
                    idle = [d for d in self._live.values() if d.in_flight == 0]
                    if not idle:
                        raise DestinationsFull(f"route {self.route}: {self.max_destinations} destinations "
                                               "are live and busy (max_destinations)")
                    evicted = min(idle, key=lambda d: d.last_used)  # the least recently used
                    del self._live[evicted.key]
                dest = self._live[key] = make()
                log.info("route %s: destination %s started (capacity %d)", self.route, key, dest.capacity)
            dest.in_flight += 1
        if evicted is not None:
            evicted.close()
            self.retired += 1
            log.info("route %s: destination %s retired to make room (max_destinations %d)", self.route,
                     evicted.key, self.max_destinations)
        return dest

    def release(self, dest: Destination, *, delivered: bool) -> None:
        with self._lock:
            dest.in_flight -= 1
            dest.last_used = time.monotonic()
            if delivered:
                dest.delivered += 1
            else:
                dest.failed += 1

    def retire_idle(self, now: float | None = None) -> list[str]:
        """Retire the destinations idle for longer than their ``max_idle``; their keys."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [d for d in self._live.values() if d.in_flight == 0 and now - d.last_used >= d.max_idle]
            for d in idle:
                del self._live[d.key]
        for d in idle:
            d.close()
            log.info("route %s: destination %s idle for %.0f s: connections closed, worker retired",
                     self.route, d.key, now - d.last_used)
        self.retired += len(idle)
        return [d.key for d in idle]

    def snapshot(self) -> list[dict[str, object]]:
        now = time.monotonic()
        with self._lock:
            return [d.info(now) for d in sorted(self._live.values(), key=lambda d: d.key)]

    def close(self) -> None:
        with self._lock:
            live = list(self._live.values())
            self._live.clear()
        for d in live:
            d.close()
