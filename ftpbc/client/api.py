"""The :class:`Client`: sends, requests and their responses, pull consumers, topics (the package
docstring shows its use; its response pollers are :mod:`ftpbc.client.responses`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Unpack

from prometheus_client import CollectorRegistry

from ftpbc.client.responses import Recent, ResponsePoller, correlation
from ftpbc.config.loader import load_config
from ftpbc.config.models import CLIENT_ID_RE, Config
from ftpbc.errors import (
    FtpbcError,
    JournalError,
    NotFound,
    RemoteHandlerError,
    RequestExpired,
    RequestTimeout,
    TransportError,
    UnknownRequest,
)
from ftpbc.exchange.area import Direction, parse_archive_name
from ftpbc.exchange.browse import Waiting, browse_box
from ftpbc.exchange.consumer import AckMode, Consumer, Delivery, Receiver, as_selector
from ftpbc.exchange.deadletter import DeadLetters
from ftpbc.exchange.layout import AreaLayout, PartnerLayout
from ftpbc.exchange.lifecycle import op_id_for
from ftpbc.exchange.replay import Archived, Plan, Replay, Source
from ftpbc.exchange.replay import Report as ReplayReport
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.sweeper import UNCOLLECTED
from ftpbc.exchange.topics import Registry, Subscription, subscriber_name
from ftpbc.exchange.trace import Query, Trace, Tracer
from ftpbc.exchange.transaction import Transaction
from ftpbc.metrics import NULL_CLIENT_OBSERVER, ClientMetrics, ClientObserver, HttpServer, serve_http
from ftpbc.model.headers import Kind, MessageOptions, PropertyValue
from ftpbc.model.names import NameTooLong
from ftpbc.model.selector import Selector
from ftpbc.tracing import Traced, producing, with_trace_properties
from ftpbc.transport.base import Entry

log = logging.getLogger("ftpbc.client")

#: client identities per node id and host (concurrent ftpbc request/send processes)
CLIENT_SLOTS = 64


class Client:
    """A connection to the exchange areas of a configuration: send, request, collect, browse,
    receive, publish, subscribe.

    Thread-safe: one client serves every thread of a process (a handler that calls other
    endpoints makes one client once, not one per call).  Use it as a context manager, or call
    :meth:`close`.

    Guaranteed: a send returns once its message is whole and visible in its box (staged, then
    renamed into place), or raises; every remote write is preceded by a journal record, so a
    client restarted with the same identity settles what a crashed one left (:attr:`recovered`).
    Not guaranteed: that a request withdrawn on a timeout or an interrupt was not handled (a
    provider may have claimed it already: handlers must be idempotent).

    Errors are :class:`ftpbc.FtpbcError` subclasses: ConfigError for an endpoint, topic or
    transfer the configuration does not have; a TransportError subclass when a server fails
    (OutcomeUnknown: a command went out and its reply never came, so it may have happened);
    the others each method names.  Arguments that can never work raise ValueError or TypeError.
    """

    def __init__(self, config: Config, *, connections: int = 8, metrics: bool = False,
                 metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> None:
        """Open a client with ``config``'s ``node.id`` as its identity (:meth:`from_config`
        picks a free client identity instead): its journal is replayed first (what it did is
        :attr:`recovered`) and its heartbeat starts; connections open when first needed.

        ``connections``: at least this many pooled connections per server (a server's
        ``pool_size`` may allow more).  ``metrics``: count requests, responses, timeouts and
        round trips in :attr:`metrics_registry`; ``metrics_port`` (0: any free port) also
        serves them over HTTP on ``metrics_host`` at :attr:`metrics_url` until :meth:`close`.

        Raises JournalError when another live process holds this identity, or its journal
        cannot be written; a TransportError subclass when recovery cannot reach a server it
        must settle something on; OSError when ``metrics_port`` is in use.
        """
        self.config = config
        """The configuration this client was made with."""
        self.metrics_registry: CollectorRegistry | None = None
        """The client's own Prometheus metrics (None without ``metrics``), never the
        process-wide default registry."""
        self._observer: ClientObserver = NULL_CLIENT_OBSERVER
        self._metrics_http: HttpServer | None = None
        if metrics or metrics_port is not None:
            counted = ClientMetrics(config.node.id)
            self.metrics_registry, self._observer = counted.registry, counted
            if metrics_port is not None:
                # Bound before anything else starts: a port in use fails the constructor cleanly.
                self._metrics_http = serve_http(counted.registry, metrics_host, metrics_port,
                                                name=f"client-metrics-{config.node.id}")
        try:
            self.runtime = Runtime(config, connections=connections)
        except BaseException:
            if self._metrics_http is not None:
                self._metrics_http.close()
            raise
        self.runtime.heartbeat.start()
        # A client restarted with a fixed node id finishes what its predecessor left in the
        # journal (e.g. returns a claimed response to outbox, so collect() can find it).
        self.recovered = self.runtime.recover(orphans=False)
        """What the replay of this identity's journal did when the client opened, one action
        per unfinished operation (empty after a clean close)."""
        self._pollers: dict[str, ResponsePoller] = {}
        #: pull consumers' side of each endpoint (receive, consume)
        self._receivers: dict[str, Receiver] = {}
        self._lock = threading.Lock()
        #: (endpoint, uuid) of the requests submit() sent, for collect() to know them
        self._submitted = Recent()
        #: the subscription registries used, by topic; the non-durable subscriptions made here
        self._registries: dict[str, Registry] = {}
        self._non_durable: list[tuple[str, str]] = []

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port`` of the client's ``/metrics`` (None unless ``metrics_port``)."""
        return self._metrics_http.url if self._metrics_http is not None else None

    @classmethod
    def from_config(cls, path: str | Path, *, node_id: str | None = None, metrics: bool = False,
                    metrics_port: int | None = None) -> Client:
        """A client of the configuration in ``path``.

        Without ``node_id`` the client takes an identity of its own, ``<node.id>.client<N>``
        with the first N not in use by another process on this host: it never collides with
        the serving node of the same configuration, and it is reused run after run, so a
        client's journal is replayed by the next client instead of piling up.
        """
        return cls.with_identity(load_config(path), node_id, metrics=metrics, metrics_port=metrics_port)

    @classmethod
    def with_identity(cls, config: Config, node_id: str | None = None, *, metrics: bool = False,
                      metrics_port: int | None = None) -> Client:
        """A client with ``node_id``, or with a client identity of its own (see from_config)."""
        if node_id:
            return cls(config.with_node_id(node_id), metrics=metrics, metrics_port=metrics_port)
        base = CLIENT_ID_RE.sub("", config.node.id)[:54]
        for slot in range(CLIENT_SLOTS):
            try:
                return cls(config.with_node_id(f"{base}.client{slot}"), metrics=metrics,
                           metrics_port=metrics_port)
            except JournalError as exc:
                if "in use" not in str(exc):
                    raise
        raise JournalError(f"all {CLIENT_SLOTS} client identities {base}.client0-{CLIENT_SLOTS - 1} are "
                           "in use on this host; give this client a --node-id")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API

    def send(self, endpoint: str, body: bytes | str | BinaryIO, **options: Unpack[MessageOptions]) -> str:
        """Send a one-way message; return its remote path once it is visible in the inbox.

        ``options``: ``priority`` (0-9), ``ttl`` (seconds), ``properties``, ``correlation_id``,
        ``type``; priority and ttl default to the endpoint's.  ``endpoint`` may name a transfer:
        the file goes to its ``send_to`` (with its pre/post send commands) and the returned path
        is where it ended up; a transfer's names carry no options.

        A bounded endpoint (``max_messages``, ``max_bytes``) whose inbox is full raises QueueFull
        with nothing sent, or with ``on_overflow: dead_letter`` files the message in ``indead``
        and returns that path (:meth:`request` and :meth:`submit` raise QueueFull once it is
        filed: no reply can come).  See docs/queues.md, Bounded queues.
        """
        if endpoint in self.config.transfers:
            if options:
                raise ValueError(f"{endpoint!r} is a transfer: its file names come from send_to and carry "
                                 f"no {', '.join(options)}")
            lc = self.runtime.transfer(endpoint)
            assert isinstance(lc.layout, PartnerLayout)
            op_id = op_id_for(None, "send")
            return lc.send(lc.layout.plan(op_id, self.runtime.node_id), _bytes(body), op_id=op_id,
                           kind="transfer")
        with producing("send", endpoint, client_id=self.runtime.node_id) as span:
            name, uid = self._new_message(span, endpoint, "oneway", options)
            if span:
                span.message(uid, _size(body), options.get("correlation_id"))
            return self._send(endpoint, name, uid, body, "oneway")

    def submit(self, endpoint: str, body: bytes | str | BinaryIO, **options: Unpack[MessageOptions]) -> str:
        """Send a request without waiting; return its UUID for :meth:`collect` (options as
        :meth:`send`, and ``reply_to``: the endpoint whose outbox gets the response, to
        collect there; docs/queues.md, Reply-to)."""
        with producing("submit", endpoint, client_id=self.runtime.node_id) as span:
            name, uid = self._new_message(span, endpoint, "request", options)
            if span:
                span.message(uid, _size(body), options.get("correlation_id"))
            self._send(endpoint, name, uid, body, "request")
        self._submitted.add((options.get("reply_to") or endpoint, uid))
        self._observer.sent(endpoint)
        return uid

    def transaction(self) -> Transaction:
        """Sends that become visible together: ``with client.transaction() as tx:
        tx.send(...); tx.submit(...)``.  All of them once the block ends, none if it raises; a
        process killed anywhere ends, after recovery of this identity, with all or none
        (docs/queues.md, Transactions)."""
        return Transaction(self.runtime, on_submit=lambda endpoint, uid: self._submitted.add((endpoint, uid)))

    def _new_message(self, span: Traced, endpoint: str, kind: Kind,
                     options: MessageOptions) -> tuple[str, str]:
        """:meth:`Runtime.new_message`, its properties with ``span``'s trace context when
        tracing is on (left out, a part then the whole, when the name has no room for it)."""
        if not span:
            return self.runtime.new_message(endpoint, kind, **options)

        def make(properties: Mapping[str, PropertyValue] | None) -> tuple[str, str]:
            given = options.copy()
            if properties is not None:
                given["properties"] = properties
            return self.runtime.new_message(endpoint, kind, **given)

        return with_trace_properties(span, options.get("properties"), make, NameTooLong)

    def _send(self, endpoint: str, name: str, uid: str, body: bytes | str | BinaryIO, kind: str) -> str:
        lc = self.runtime.lifecycle(endpoint)
        assert isinstance(lc.layout, AreaLayout)
        out = lc.layout.outbound(name, self.runtime.node_id, lc.clock())
        path = lc.send(out, _bytes(body), op_id=op_id_for(uid, "send"), kind=kind)
        log.debug("%s: sent %s %s as %s", endpoint, kind, uid, path,
                  extra={"endpoint": endpoint, "message_id": uid})
        return path

    def dead_letters(self, endpoint: str) -> DeadLetters:
        """The dead letters of ``endpoint``: list (with a selector), body, replay, purge
        (docs/queues.md)."""
        return DeadLetters(self.runtime.lifecycle(endpoint))

    def replay(self, endpoint: str, since: datetime, until: datetime | None = None, *,
               where: str | Selector | None = None, to: str | None = None, replay_id: str | None = None,
               source: Source = "archive", dry_run: bool = False,
               on_plan: Callable[[Plan], None] | None = None,
               each: Callable[[Archived, str], None] | None = None) -> tuple[Plan, ReplayReport | None]:
        """Send again, as new messages, the messages ``endpoint`` archived in ``since <= t <
        until`` (the time its archive name gives), those ``where`` selects, to the inbox of
        ``to`` (default: ``endpoint``'s own); return the plan (count, bytes, oldest, newest) and,
        unless ``dry_run``, what was sent (``on_plan(plan)`` once the archive is listed, before
        anything is sent; ``each(message, outcome)`` after each message).

        Each copy has a new id derived from the replay's id and its original's, and carries
        ``ftpbc_replay_of`` (the original's id) and ``ftpbc_replay_id``.  Guaranteed: the same
        call run again on this host after an interruption sends each original once in all
        (its progress is kept in ``state_dir``).  See docs/replay.md for what is not.
        ``source``: ``error``, ``expired`` or ``dead`` replays copies of the messages filed there
        instead of the archive's (each stays filed).
        ConfigError for an unknown endpoint or a transfer; ValueError for an empty window or
        a bad replay id; QueueFull when the target's inbox is full (the rest is left for a
        rerun).
        """
        sel = as_selector(where)
        origin = self.runtime.lifecycle(endpoint)
        target = origin if to is None or to == endpoint else self.runtime.lifecycle(to)
        job = Replay(origin, target, Path(self.config.node.state_dir), since=since, until=until,
                     selector=sel, replay_id=replay_id, source_dir=source)
        plan = job.plan()
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return plan, None
        return plan, job.run(plan, each=each)

    def trace(self, id: str | None = None, *, correlation_id: str | None = None, where: str | None = None,
              since: datetime | None = None, until: datetime | None = None,
              journals: Sequence[str | Path] = ()) -> Trace:
        """Every place message ``id`` is or was, in time order, across the endpoints, topics,
        subscriptions and routes of this configuration (docs/tracing.md): staged, waiting,
        claimed by which node, served (when, after how long), answered, collected, failed,
        expired or dead-lettered (with the reason beside it), and its replays.  Or every
        message with ``correlation_id``, or that the selector ``where`` selects, seen between
        ``since`` and ``until`` (aware datetimes).  ``journals``: node journal directories whose
        records are read too.  Reads only: nothing is moved.  ValueError for a query that names
        nothing, SelectorError for a bad selector; a server that fails is named in
        :attr:`Trace.problems`, the other places are still read."""
        query = Query(id, correlation_id, where, since, until)
        return Tracer(self.runtime.config, self.runtime.transport,
                      journals=[Path(j) for j in journals]).trace(query)

    def browse(self, endpoint: str, selector: str | Selector | None = None, limit: int | None = None,
               bodies: bool = False) -> list[Waiting]:
        """The messages waiting in ``endpoint``'s inbox, in the order a serving node takes them
        (higher priority first, then the oldest), without claiming, moving or changing any:
        those ``selector`` selects (a JMS selector, docs/queues.md), at most ``limit``, each
        with its body read when ``bodies`` (docs/queues.md, Browsing)."""
        return browse_box(self.runtime.lifecycle(endpoint), as_selector(selector), limit=limit, bodies=bodies)

    def collect(self, endpoint: str, uuid: str, timeout: float | None = None, *,
                request_name: str | None = None) -> bytes:
        """The response to request ``uuid``, waiting up to ``timeout`` (default: the endpoint's).

        Raises RemoteHandlerError if the provider's handler failed, RequestTimeout if nothing
        came in time.  Works from any process, also after the submitting one crashed.  Raises
        UnknownRequest at once, rather than after the timeout, for a request this client already
        collected, and for one it did not submit when neither the request nor its response is in
        the exchange area (never sent, collected by another client, or expired and filed).  The
        latter's message says "already collected (archived as <path> by <node>)" when the
        response is in ``outarchive`` (one more listing, of that directory, in that case only);
        with ``archive: false`` collected responses are deleted and it cannot say so.
        """
        poller = self._poller(endpoint)
        if uuid in poller.delivered:
            raise UnknownRequest(endpoint, uuid, "its response was already collected")
        if (endpoint, uuid) not in self._submitted and not poller.is_waiting(uuid) \
                and not _on_its_way(self.runtime, endpoint, uuid):
            archived = _archived_response(self.runtime, endpoint, uuid)
            if archived is not None:
                path, node = archived
                if node == UNCOLLECTED:
                    raise UnknownRequest(endpoint, uuid, "its response was never collected: a provider "
                                         f"archived it as uncollected ({path})")
                raise UnknownRequest(endpoint, uuid, f"already collected (archived as {path}"
                                     + (f" by {node})" if node else ")"))
            raise UnknownRequest(endpoint, uuid, "not submitted by this client, and neither the request "
                                 "nor a response to it is in the exchange area")
        return self._await(poller, uuid, poller.wait_for(uuid), timeout, request_name)

    def _await(self, poller: ResponsePoller, uuid: str, fut: Future[tuple[bytes, bool]],
               timeout: float | None, request_name: str | None, sent: float | None = None) -> bytes:
        """Wait for ``fut``; ``sent`` (time.monotonic) is when the request went out, if this
        process sent it (the round trip of a collect of another's request is unknown)."""
        endpoint = poller.endpoint
        ep = self.config.endpoint(endpoint)
        limit = ep.timeout if timeout is None else timeout
        request_file = f"{ep.repository}/inbox/{request_name or ep.request_prefix + uuid}"
        observer = self._observer
        with observer.waiting(endpoint):
            try:
                body, is_error = fut.result(timeout=limit)
            except FutureTimeout:
                poller.forget(uuid)
                observer.timed_out(endpoint)
                raise RequestTimeout(endpoint, request_file, limit) from None
            except RequestExpired:
                observer.answered(endpoint, "expired", _since(sent))
                raise
        observer.answered(endpoint, "error" if is_error else "ok", _since(sent))
        if is_error:
            raise RemoteHandlerError(endpoint, request_file, body.decode("utf-8", "replace"))
        return body

    def request(self, endpoint: str, body: bytes | str | BinaryIO, timeout: float | None = None,
                **options: Unpack[MessageOptions]) -> bytes:
        """Send a request and wait for its response (see :meth:`collect` for errors).

        A request that times out, or whose wait is interrupted (KeyboardInterrupt, SystemExit:
        Ctrl-C, SIGTERM in ``ftpbc request``), is withdrawn from the inbox when no provider has
        claimed it yet.  One already claimed is served for nobody: its response is archived as
        uncollected, and its handler may have run (handlers must be idempotent).

        With ``reply_to`` the response is awaited in that endpoint's outbox, and in this one's
        too, where a node that cannot reach ``reply_to`` sends its error reply.
        """
        reply_to = options.get("reply_to")
        with producing("request", endpoint, client_id=self.runtime.node_id) as span:
            name, uid = self._new_message(span, endpoint, "request", options)  # reply_to checked
            if span:
                span.message(uid, _size(body), options.get("correlation_id"))
            poller = self._poller(reply_to or endpoint)
            home = self._poller(endpoint) if reply_to not in (None, endpoint) else None
            # Registered before sending, and this very future awaited: a reply delivered before
            # this thread gets to wait (a busy machine) completes it all the same.
            fut = poller.wait_for(uid)
            if home is not None:
                fut = _first_of(fut, home.wait_for(uid))
            started = time.monotonic()
            try:
                self._send(endpoint, name, uid, body, "request")
            except BaseException as exc:
                poller.forget(uid)
                if home is not None:
                    home.forget(uid)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    # Interrupted between the rename into place and the send's return: the request
                    # may be in the inbox already, and nobody will wait for its answer.
                    self._withdraw(endpoint, name, uid)
                raise
        self._observer.sent(endpoint)
        waiting = time.time_ns() if span else 0
        try:
            answer = self._await(poller, uid, fut, timeout, name, started)
        except (RequestTimeout, KeyboardInterrupt, SystemExit) as exc:
            poller.forget(uid)
            self._withdraw(endpoint, name, uid)
            span.received(reply_to or endpoint, waiting, error=f"{type(exc).__name__}: no reply",
                          client_id=self.runtime.node_id)
            raise
        except FtpbcError as exc:  # an error reply, or one saying the request expired
            span.received(reply_to or endpoint, waiting, message_id=uid, error=str(exc),
                          client_id=self.runtime.node_id)
            raise
        finally:
            if home is not None:
                home.forget(uid)  # the answer came to the other outbox, or none will
        span.received(reply_to or endpoint, waiting, message_id=uid, body_size=len(answer),
                      client_id=self.runtime.node_id)
        return answer

    def _withdraw(self, endpoint: str, name: str, uid: str) -> None:
        """Delete request ``name`` from the inbox unless a provider claimed it (or it never got
        there); best effort: a failure leaves it to be served for nobody."""
        lc = self.runtime.lifecycle(endpoint)
        try:
            lc.transport.delete(lc.layout.box_path(name))
            log.info("%s: request %s withdrawn from the inbox", endpoint, uid)
        except (NotFound, TransportError):
            pass

    def _poller(self, endpoint: str) -> ResponsePoller:
        with self._lock:
            poller = self._pollers.get(endpoint)
            if poller is None:
                ep = self.config.endpoint(endpoint)
                poller = ResponsePoller(endpoint, self.runtime.lifecycle(endpoint, "out"), ep.poll_interval)
                self._pollers[endpoint] = poller
            return poller

    def receive(self, endpoint: str, timeout: float | None = None,
                selector: str | Selector | None = None) -> Delivery | None:
        """Take the next one-way message of ``endpoint`` (that ``selector`` selects), waiting up
        to ``timeout`` seconds (default: the endpoint's); None if none came.

        The message stays claimed by this client until ``delivery.ack()`` (archived, never
        delivered again) or ``delivery.nack(requeue=True)`` (back with its delivery count
        raised); one never settled goes back when the client closes, or after the lease if this
        process dies.  Requests are not received (they are for handlers).  docs/queues.md, Pull
        consumers and acknowledgement."""
        limit = self.config.endpoint(endpoint).timeout if timeout is None else timeout
        return self._receiver(endpoint).receive(limit, as_selector(selector))

    def consume(self, endpoint: str, selector: str | Selector | None = None, ack: AckMode = "auto",
                timeout: float | None = None) -> Consumer:
        """``with client.consume(endpoint) as deliveries: for m in deliveries: ...``: the
        one-way messages of ``endpoint`` one after the other, acknowledged as ``ack`` says
        (``auto``, ``client``, ``dups_ok``: see :class:`ftpbc.Consumer`).
        Leaving the block returns the unacknowledged ones at once.  The loop ends once
        ``timeout`` seconds pass without a message (None: it waits until the client closes)."""
        return Consumer(self._receiver(endpoint), as_selector(selector), ack, timeout)

    # ------------------------------------------------------------------ topics (docs/topics.md)

    def publish(self, topic: str, body: bytes | str | BinaryIO, **options: Unpack[MessageOptions]) -> str:
        """Publish a message to ``topic``; return its UUID once it is in the topic's inbox.

        A serving node then copies it into every subscription that existed when it was sent and
        whose selector selects it.  ``options`` as :meth:`send` (``priority``, ``ttl``,
        ``properties``, ``correlation_id``, ``type``): the copies carry them."""
        self._registry(topic)  # ConfigError for a name that is not a topic
        if "reply_to" in options:
            raise ValueError("reply_to is for requests: a message published to a topic gets no reply")
        with producing("publish", topic, client_id=self.runtime.node_id) as span:
            name, uid = self._new_message(span, topic, "oneway", options)
            if span:
                span.message(uid, _size(body), options.get("correlation_id"))
            self._send(topic, name, uid, body, "oneway")
        return uid

    def subscribe(self, topic: str, name: str | None = None, *, durable: bool = True,
                  selector: str | None = None, ack: AckMode = "auto",
                  timeout: float | None = None) -> Consumer:
        """Subscribe to ``topic`` and return the pull consumer of the subscription's messages (as
        :meth:`consume`: ``with client.subscribe("orders", name="audit") as deliveries: ...``).

        ``durable``: the subscription ``name`` (required) keeps its messages while nobody
        consumes them, until :meth:`unsubscribe`; subscribing again to it resumes it (same
        ``selector``, else ValueError).  Non-durable: ``name`` defaults to a fresh one; the
        subscription is removed with its messages when this client closes, or by a serving
        node's sweeper once this client's heartbeat is older than the lease.  ``selector``
        (a JMS selector) chooses the messages copied to it.  Messages published before the
        subscription was made are not copied to it.
        """
        if name is None:
            if durable:
                raise ValueError("a durable subscription needs a name (to resume it later)")
            name = subscriber_name(self.runtime.node_id)
        self.create_subscription(topic, name, durable=durable, selector=selector)
        return self.consume(f"{topic}/{name}", ack=ack, timeout=timeout)

    def create_subscription(self, topic: str, name: str, *, durable: bool = True,
                            selector: str | None = None) -> tuple[Subscription, bool]:
        """Make subscription ``name`` of ``topic`` without consuming it (``ftpbc topic
        subscribe``); ``(subscription, made now)``.  An existing one is resumed as
        :meth:`subscribe` says.  A non-durable one made here is removed when this client closes."""
        sub, made = self._registry(topic).create(name, durable=durable, selector=selector,
                                                 owner=self.runtime.node_id)
        if made and not durable:
            with self._lock:
                self._non_durable.append((topic, name))
        return sub, made

    def unsubscribe(self, topic: str, name: str) -> int:
        """Remove subscription ``name`` of ``topic`` with every message waiting in it; how many
        files were removed.  UnknownSubscription if there is none."""
        removed = self._registry(topic).remove(name)
        with self._lock:
            if (topic, name) in self._non_durable:
                self._non_durable.remove((topic, name))
        return removed

    def subscriptions(self, topic: str) -> list[Subscription]:
        """Every subscription of ``topic``, by name."""
        return self._registry(topic).subscriptions()

    def backlog(self, topic: str, name: str) -> int:
        """Messages waiting in subscription ``name`` of ``topic``."""
        return self._registry(topic).backlog(name)

    def _end_non_durable(self) -> None:
        """Remove the non-durable subscriptions this client made (at close; a failure is left
        to the sweepers, which remove them once this client's heartbeat is gone)."""
        with self._lock:
            subs, self._non_durable = self._non_durable, []
        for topic, name in subs:
            try:
                self._registry(topic).remove(name)
            except FtpbcError as exc:
                log.warning("%s/%s: non-durable subscription left for the sweepers: %s", topic, name, exc)

    def _registry(self, topic: str) -> Registry:
        with self._lock:
            registry = self._registries.get(topic)
            if registry is None:
                registry = self._registries[topic] = Registry(self.runtime, topic)
            return registry

    def _receiver(self, endpoint: str) -> Receiver:
        with self._lock:
            receiver = self._receivers.get(endpoint)
            if receiver is None:
                receiver = self._receivers[endpoint] = Receiver(self.runtime, endpoint)
            return receiver

    def close(self) -> None:
        """Release everything: the response pollers stop (a :meth:`request` or :meth:`collect`
        still waiting in another thread ends without its response), unacknowledged deliveries
        go back to their boxes, this client's non-durable subscriptions are removed, the
        heartbeat stops and the connections close.  Responses a poller had claimed are
        archived or returned to the outbox; what a failing server leaves is logged and settled
        by the next client with this identity (or, for subscriptions, by the sweepers)."""
        with self._lock:
            pollers = list(self._pollers.values())
            self._pollers.clear()
            receivers = list(self._receivers.values())
            self._receivers.clear()
        for p in pollers:
            p.close()
        for r in receivers:
            r.close()  # unsettled deliveries go back now, while the heartbeat still says we live
        self._end_non_durable()
        self.runtime.heartbeat.stop()
        self.runtime.close()
        if self._metrics_http is not None:
            self._metrics_http.close()
            self._metrics_http = None




def _first_of(*futures: Future[tuple[bytes, bool]]) -> Future[tuple[bytes, bool]]:
    """A future settled as the first of ``futures`` to settle (cancelled when one is: a
    closing poller)."""
    first: Future[tuple[bytes, bool]] = Future()

    def settle(f: Future[tuple[bytes, bool]]) -> None:
        try:
            if f.cancelled():
                first.cancel()
            elif (exc := f.exception()) is not None:
                first.set_exception(exc)
            else:
                first.set_result(f.result())
        except InvalidStateError:
            pass  # another settled it first

    for f in futures:
        f.add_done_callback(settle)
    return first


def _since(started: float | None) -> float | None:
    return None if started is None else time.monotonic() - started




def _size(body: bytes | str | BinaryIO) -> int | None:
    """A body's size in bytes when known without reading it (None for a stream)."""
    if isinstance(body, bytes):
        return len(body)
    return len(body.encode("utf-8")) if isinstance(body, str) else None


def _bytes(body: bytes | str | BinaryIO) -> bytes | BinaryIO:
    return body.encode("utf-8") if isinstance(body, str) else body



#: where a request or its response is while a response may still come, in the order a message
#: moves through them (a response is staged before the request leaves inselect)
_ON_THE_WAY: tuple[tuple[Direction, str], ...] = (
    ("in", "box"), ("in", "select"), ("out", "stage"), ("out", "box"), ("out", "select"))


def _archived_response(runtime: Runtime, endpoint: str, uuid: str) -> tuple[str, str | None] | None:
    """Where the response to request ``uuid`` of ``endpoint`` was archived, and by which node
    (``uncollected``: by a provider's sweep, nobody having collected it); None if it is not in
    ``outarchive`` (not archived, deleted, or the directory is missing).  One streamed listing,
    stopped at the first match."""
    lc = runtime.lifecycle(endpoint, "out")
    layout = lc.layout
    assert isinstance(layout, AreaLayout)
    directory = layout.area.dir("out", "archive")
    found: list[tuple[str, str | None]] = []

    def visit(e: Entry) -> bool:
        if e.is_dir:
            return True
        name, node, _ = parse_archive_name(e.name)
        c = layout.decode_name(name)
        if c is not None and correlation(c) == uuid:
            found.append((f"{directory}/{e.name}", node))
            return False
        return True

    try:
        lc.transport.scan(directory, visit)
    except NotFound:
        return None
    return found[0] if found else None


def _on_its_way(runtime: Runtime, endpoint: str, uuid: str) -> bool:
    """Whether request ``uuid`` of ``endpoint`` waits or is being served, or its response is
    staged, waiting or being collected.  Listed in the order a message moves: one that moves on
    during the listings is found in a later directory.  Twice: a failed delivery moves a
    request back from inselect to inbox, against that order."""
    for _ in range(2):
        for direction, kind in _ON_THE_WAY:
            lc = runtime.lifecycle(endpoint, direction)
            layout = lc.layout
            assert isinstance(layout, AreaLayout)
            try:
                entries = lc.transport.list(layout.area.dir(direction, kind))
            except NotFound:
                continue
            for e in entries:
                if e.is_dir:
                    continue
                # a staged or claimed file is <name>~<node>
                c = layout.decode_name(e.name if kind == "box" else parse_archive_name(e.name)[0])
                if c is not None and (c.uuid if direction == "in" else correlation(c)) == uuid:
                    return True
    return False
