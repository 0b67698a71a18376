"""What a client or a serving node holds open: transports, the journal, sequences, heartbeat,
and one :class:`Lifecycle` per endpoint direction and per transfer."""

from __future__ import annotations

import functools
import logging
import threading
import uuid as uuidlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Unpack

from ftpbc.cluster.factory import open_coordination
from ftpbc.cluster.lease import Lease, safety_margin
from ftpbc.cluster.liveness import Liveness
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError
from ftpbc.exchange.layout import KEY_PREFIX, AreaLayout, Direction, PartnerLayout
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.exchange.policy import QueuePolicy
from ftpbc.exchange.recovery import Action, RecoveryLock, recover_node
from ftpbc.journal import Journal
from ftpbc.model.headers import Headers, Kind, MessageOptions
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.transport import Transport, open_transport

log = logging.getLogger("ftpbc.recovery")


class Runtime:
    """Shared by every endpoint of one process with one node identity.  Thread-safe."""

    def __init__(self, config: Config, *, connections: int = 4) -> None:
        self.config = config
        self.node_id = config.node.id
        self.journal = Journal(Path(config.node.journal_dir), self.node_id,
                               durable=config.node.durable_journal)
        try:
            #: poll locks, heartbeats, leases and sequences: in state_dir or on a server
            #: (node.coordination)
            self.coordination = open_coordination(config, open_transport)
        except BaseException:
            self.journal.close()  # its lock would keep this node id in use until the process ends
            raise
        self.sequences = self.coordination.sequences
        node = config.node
        # A server's file times are whole seconds: a beat may look up to one older than it is.
        clock_error = 1.0 if node.coordination == "server" else 0.0
        #: this node's own lease: its pollers claim, and its workers start handlers, only while
        #: it is valid (open until the heartbeat starts: a process that never beats is not fenced)
        self.lease = Lease(node.lease, safety_margin(node.lease, node.heartbeat_interval,
                                                     clock_error=clock_error), node_id=node.id)
        #: the background loops of this process; the heartbeat stops when one is stuck
        self.liveness = Liveness(lease=self.lease)
        #: how long a loop in the middle of a step may go without progress before it counts as
        #: stuck: over a slow link one step may take a reconnect and a command, each up to the
        #: server's timeout, and a slow node must keep beating (a stuck one still stops)
        self.step_within = max(node.lease / 2, 2 * max((s.timeout for s in config.servers.values()),
                                                       default=0.0))
        self.heartbeat = self.coordination.heartbeat(
            node.heartbeat_interval, health=self.liveness.health(node.lease / 2, self.step_within))
        self.heartbeat.lease = self.lease
        self._connections = connections
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._lifecycles: dict[tuple[str, str], Lifecycle] = {}
        #: one lock per lifecycle being made: its first caller makes and prepares it, the others wait
        self._making: dict[tuple[str, str], threading.Lock] = {}
        self._recovered = False

    def transport(self, server: str) -> Transport:
        with self._lock:
            if server not in self._transports:
                cfg = self.config.servers[server]
                if cfg.pool_size < self._connections:
                    cfg = cfg.model_copy(update={"pool_size": self._connections})
                self._transports[server] = open_transport(cfg)
            return self._transports[server]

    def lifecycle(self, endpoint: str, direction: Direction = "in") -> Lifecycle:
        """The lifecycle of one direction of an endpoint's exchange area (prepared).

        Made and prepared once per process: concurrent first callers wait for the one making
        it.  ConfigError for a name :meth:`Config.endpoint` does not resolve (never cached).
        """
        # The cache first: a fan-out asks for its lifecycles dozens of times a message, and
        # resolving a TOPIC/SUB name's configuration costs more than the lookup.  No lock: one
        # dict read is atomic, and entries are only ever added (or all dropped by close).
        lc = self._lifecycles.get((endpoint, direction))
        if lc is not None:
            return lc

        def make() -> Lifecycle:
            ep = self.config.endpoint(endpoint)
            made = Lifecycle(AreaLayout(endpoint, ep, direction, peers=self.config.endpoints),
                             self.transport(ep.server),
                             self.journal.endpoint(endpoint), self.node_id,
                             max_deliveries=ep.max_deliveries, redelivery_delay=ep.redelivery_delay,
                             max_redelivery_delay=ep.max_redelivery_delay,
                             policy=QueuePolicy.of(ep, direction))
            made.prepare()
            return made

        return self._made((endpoint, direction), make)

    def _made(self, key: tuple[str, str], make: Callable[[], Lifecycle]) -> Lifecycle:
        """The cached lifecycle of ``key``, made by ``make`` if there is none yet.

        One caller makes it (its ``prepare`` creates the area's directories: one set of MKDs,
        not one per worker starting at once); the others of the same key wait for it, those of
        other keys do not.  If ``make`` raises, nothing is cached and the next caller tries again.
        """
        with self._lock:
            lc = self._lifecycles.get(key)
            if lc is not None:
                return lc
            making = self._making.setdefault(key, threading.Lock())
        with making:
            with self._lock:
                lc = self._lifecycles.get(key)
            if lc is None:
                lc = make()
                with self._lock:
                    self._lifecycles[key] = lc
                    self._making.pop(key, None)
        return lc

    def endpoint_lifecycles(self, endpoint: str) -> tuple[Lifecycle, Lifecycle]:
        return self.lifecycle(endpoint, "in"), self.lifecycle(endpoint, "out")

    def transfer(self, name: str) -> Lifecycle:
        """The lifecycle of transfer ``name``; ConfigError if there is none."""
        config = self.config
        if name not in config.transfers:
            known = ", ".join(sorted(config.transfers)) or "none"
            raise ConfigError(f"unknown transfer {name!r} (defined: {known})", file=config.source)
        key = (name, "transfer")
        lc = self._lifecycles.get(key)
        if lc is not None:
            return lc

        def make() -> Lifecycle:
            tc = config.transfers[name]
            layout = PartnerLayout(name, tc, self.sequences)
            made = Lifecycle(layout, self.transport(tc.server), self.journal.endpoint(layout.key),
                             self.node_id, max_deliveries=tc.max_deliveries,
                             redelivery_delay=tc.redelivery_delay,
                             max_redelivery_delay=tc.max_redelivery_delay)
            made.prepare()
            return made

        return self._made(key, make)

    def new_message(self, endpoint: str, kind: Kind, **options: Unpack[MessageOptions]) -> tuple[str, str]:
        """A fresh ``(file name, uuid)`` for a request or one-way message of ``endpoint``.

        ``options`` are ``ttl`` (seconds until the message expires; default the endpoint's),
        ``properties``, and the headers a sender may set (the header table's ``send`` column):
        ``priority`` defaults to the endpoint's; a value the table refuses (a ``type``
        starting ``ftpbc.``, ftpbc's own replies use those) is a ValueError; ``reply_to``
        (requests only) names the endpoint whose outbox gets the response: one of this
        configuration's, on the same server (else ValueError, before anything is sent).
        """
        ep = self.config.endpoint(endpoint)
        table = Headers.table
        given: dict[str, Any] = dict(options)
        ttl = given.pop("ttl", None)
        properties = given.pop("properties", None)
        values: dict[str, Any] = {}
        for spec in table.sendable:
            value = given.pop(spec.name, None)
            if value is None:
                continue
            why = spec.refuse(value) if spec.refuse is not None else None
            if why is not None:
                raise ValueError(why)
            values[spec.name] = value
        if given:
            raise TypeError(f"unknown message option(s) {', '.join(sorted(given))}: expected ttl, "
                            f"properties, {', '.join(s.name for s in table.sendable)}")
        reply_to = values.get("reply_to")
        if reply_to is not None:
            self._check_reply_to(endpoint, kind, reply_to)
        values.setdefault("priority", ep.priority)
        ttl = ep.ttl if ttl is None else ttl
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if ttl is not None:
            values["expiration"] = datetime.now(UTC) + timedelta(seconds=ttl)
        # A message published to a topic carries when it was sent: a subscription created
        # after that does not get it (docs/topics.md)
        if endpoint in self.config.topics:
            values["timestamp"] = datetime.now(UTC)
        # A reply to the endpoint itself is the default; dropboxmq names mark a request by it
        if reply_to == endpoint:
            del values["reply_to"]
        if kind == "request" and ep.naming != "ftpbc" and "reply_to" not in values:
            values["reply_to"] = endpoint
        layout = self.lifecycle(endpoint).layout
        assert isinstance(layout, AreaLayout)
        prefix = ep.request_prefix if kind == "request" else ep.oneway_prefix
        if ep.message_name == "%u":
            # The default pattern: nothing to expand but the UUID (the general path builds a
            # context and walks the tokens, a sizeable part of a message's bookkeeping on the send
            # path).
            uid = str(uuidlib.uuid4())
            base = prefix + uid
        else:
            expansion = Pattern.parse(ep.message_name).expand(
                ExpandContext(endpoint=endpoint, store=self.sequences, tz=ep.timezone))
            assert expansion.uuid is not None  # message_name is validated to contain %u
            base, uid = prefix + expansion.name, expansion.uuid
        if ep.naming == "ftpbc" and not properties and all(
                table.by_name[name].default == value for name, value in values.items()):
            name = base  # all defaults: the plain name
        else:
            headers = Headers(id=uid, kind=kind, **values)
            name = layout.name_for(headers, dict(properties or {}), base)
        layout.check_sendable(name, base)
        return name, uid

    def _check_reply_to(self, endpoint: str, kind: Kind, reply_to: str) -> None:
        """Refuse at send a reply_to no node could deliver to (the node's own check is
        :meth:`AreaLayout.reply_refusal`, for configurations that differ)."""
        if kind != "request":
            raise ValueError(f"reply_to is for requests: a one-way message to {endpoint!r} gets no reply")
        peer = self.config.endpoints.get(reply_to)
        if peer is None:
            raise ValueError(f"reply_to {reply_to!r} is not an endpoint of this configuration")
        server = self.config.endpoint(endpoint).server
        if peer.server != server:
            raise ValueError(f"reply_to {reply_to!r} is on server {peer.server!r}, {endpoint!r} on "
                             f"{server!r}: a reply goes to an endpoint on the request's server")

    def _inbound(self, endpoint: str) -> Lifecycle | None:
        return self.lifecycle(endpoint) if self.config.knows_endpoint(endpoint) else None

    def recover(self, *, orphans: bool = True) -> list[Action]:
        """Replay this node's journal; endpoints and transfers no longer configured are
        reported, not touched.

        With ``orphans``, every configured endpoint's and transfer's select and stage
        directories are then searched for files of this node that no journal record accounts
        for (see :func:`~ftpbc.exchange.recovery.recover_node`).  Only the first opener of
        this node's journal in the process recovers: a Client started beside a Node of the same
        id must not undo the Node's work in progress.
        """
        actions: list[Action] = []
        if not self.journal.first or self._recovered:
            log.info("journal of node %s already open in this process; recovery left to its first user",
                     self.node_id)
            return actions
        config = self.config
        keys = None
        if orphans:
            # a topic's subscriptions: those whose journal this node has (it staged or claimed there)
            derived = [*config.topics, *(k for k in self.journal.registry()
                                         if k not in config.endpoints and config.knows_endpoint(k))]
            keys = [*config.endpoints, *dict.fromkeys(derived),
                    *(KEY_PREFIX + name for name in config.transfers)]
        actions = recover_node(self.journal, self.node_id, group=self._group, inbound=self._inbound,
                               lock=self._recovery_lock, transports=self.transport, orphan_keys=keys)
        self._recovered = True  # a start retried after a server outage recovers until it succeeds
        return actions

    def _recovery_lock(self, lc: Lifecycle) -> RecoveryLock | None:
        """The poll lock recovery holds while deciding an operation of ``lc``: a transfer that
        reads in place has only that lock to keep pollers off its files."""
        layout = lc.layout
        if not isinstance(layout, PartnerLayout) or layout.select is not None:
            return None
        poll_lock = self.coordination.poll_lock(layout.key, self.config.transfers[layout.name].lock)
        return functools.partial(poll_lock.attempt, wait=60.0)

    def _group(self, key: str) -> list[Lifecycle] | None:
        """The lifecycles sharing journal ``key``: an endpoint's two directions, or a transfer."""
        if key.startswith(KEY_PREFIX):
            name = key[len(KEY_PREFIX):]
            return [self.transfer(name)] if name in self.config.transfers else None
        if self.config.knows_endpoint(key):  # an endpoint, a topic, a topic's subscription
            return list(self.endpoint_lifecycles(key))
        return None

    def close(self) -> None:
        with self._lock:
            transports = list(self._transports.values())
            self._transports.clear()
            self._lifecycles.clear()
        for t in transports:
            t.close()
        self.coordination.close()
        self.journal.close()
