"""Fan-out: what a serving node does for a topic (docs/topics.md).

:class:`FanOut` is the provider of a topic's incoming area: the same poller, poll lock, claim
batches, expiry, shutdown hand-back and metrics as an endpoint's provider
(:mod:`ftpbc.node.provider`), with the fan-out in place of a handler.  Each claimed message is
read once, then copied into every subscription whose selector selects it and that existed when
it was sent, in one transaction that also settles the claim (:func:`ftpbc.exchange.topics.fan_out`):
killed at any step, the node's recovery leaves each matching subscription with one copy and
the message archived, or no copy and the message back in the topic's inbox.

:class:`TopicSweeper` is the sweeper of the incoming area (dead nodes' claims and staged
messages, expiry) plus the subscriptions: a non-durable subscription whose owner's heartbeat is
older than the lease is removed with its messages, and every subscription's area is swept as a
served endpoint's is (dead consumers' claims go back, expired messages are filed).
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from typing import BinaryIO

from ftpbc.cluster.liveness import Liveness
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.topics import TopicConfig
from ftpbc.errors import FtpbcError, NotFound, TransportError
from ftpbc.exchange.lifecycle import SPOOL_IN_MEMORY, Claimed, Unread
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.sweeper import Sweeper
from ftpbc.exchange.topics import Registry, UnknownSubscription, fan_out
from ftpbc.exchange.transaction import open_transactions
from ftpbc.model.message import Message
from ftpbc.node.provider import Provider
from ftpbc.tracing import consuming

log = logging.getLogger("ftpbc.fanout")


def _no_handler(message: Message) -> None:
    raise AssertionError(f"{message.endpoint}: a topic's messages are fanned out, never handled")


class FanOut(Provider):
    """The poller and workers fanning out one topic on one node."""

    # Claim as soon as one worker is free, not half of them as an endpoint's poller does once
    # work keeps coming: a fanned-out message holds its worker for a dozen round trips and more
    # (a STOR per copy), so waiting for a second worker left one idle for most of a message.  A
    # claim still comes from the remembered backlog, so this costs polls under the lock, not
    # listings.
    refill_when_busy = 1

    def __init__(self, topic: str, config: TopicConfig, runtime: Runtime, registry: Registry,
                 poll_lock: PollLock, *, liveness: Liveness | None = None) -> None:
        super().__init__(topic, config, runtime.lifecycle(topic), _no_handler, poll_lock, liveness=liveness)
        self.runtime = runtime
        self.registry = registry
        #: copies exposed by this node (a message to three subscriptions counts three)
        self.copies = 0

    def _serve(self, claimed: Claimed) -> bool:
        env = claimed.candidate.envelope
        # A span for the fan-out, a child of the publisher's; the copies keep the published name,
        # so they carry the publisher's trace context on to the subscribers.
        with consuming("fanout", self.name, env.properties, client_id=self.lifecycle.node_id) as span:
            if span:
                span.message(env.headers.id, claimed.size if claimed.size >= 0 else None,
                             env.headers.correlation_id)
            done = self._fan_out(claimed)
            if span and not done:
                span.failed("not fanned out: returned, lost, filed as unreadable, or left for recovery")
            return done

    def _fan_out(self, claimed: Claimed) -> bool:
        started = time.monotonic()
        # Every subscription that existed when this message was published is in a registry
        # listing begun after the inbox listing the claim came from (the latest one).
        not_before = self._listed_at
        lc = self.lifecycle
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            size = self._read(claimed, spool, started)  # type: ignore[arg-type]
            if size is None:
                return False
            # A message held in memory anyway goes out as bytes: every copy's upload then
            # reads it without a copy per chunk; a larger one streams from its spool file.
            body: bytes | BinaryIO
            if size <= SPOOL_IN_MEMORY:
                spool.seek(0)
                body = spool.read()
            else:
                body = spool  # type: ignore[assignment]  # a SpooledTemporaryFile is a binary file
            try:
                targets = self.registry.targets(not_before)
            except FtpbcError as exc:
                # Without every subscription the copies cannot be decided: the message goes back
                # unchanged (not the message's fault), after a pause that holds this worker's slot
                # so that a registry that stays unreadable does not spin the poller.
                log.warning("%s: cannot read the subscriptions, %s goes back: %s", self.name, claimed.name,
                            exc)
                self._stop.wait(max(self.config.poll_interval, 1.0))
                if self.claims.finishing(claimed):  # else handed back at shutdown already
                    self._retry(functools.partial(lc.unclaim, claimed))
                self._outcome(claimed, "returned", started)
                return False
            try:
                tx, names = fan_out(self.runtime, self.name, claimed, body, targets)
            except TransportError as exc:
                # Nothing visible, the staged copies removed: the message goes back, counted as
                # a delivery when the fault is the file's or the area's (a refusal), not the line's.
                what = (lc.read_failed(claimed, exc, retry=self._retry)
                        if self.claims.finishing(claimed) else "handed back at shutdown")
                log.warning("%s: cannot fan out %s: %s; %s", self.name, claimed.name, exc, what)
                self._outcome(claimed, "returned", started)
                return False
            except Exception as exc:  # a broken journal: nothing can be recorded safely
                log.error("%s: cannot fan out %s, returning it: %s: %s", self.name, claimed.name,
                          type(exc).__name__, exc)
                if self.claims.finishing(claimed):
                    self._retry(lambda: lc.rename_back(claimed))
                self._outcome(claimed, "returned", started)
                return False
        if not self.claims.finishing(claimed):
            # Handed back at shutdown while its copies were staged: they go, nothing was visible.
            try:
                tx.rollback()
            except FtpbcError as exc:  # no commit record: recovery removes them
                log.warning("%s: staged copies of %s left for recovery: %s", self.name, claimed.name, exc)
            self._outcome(claimed, "returned", started, "(handed back at shutdown)")
            return False
        where = self._retry(tx.commit)
        if where is None:
            self._outcome(claimed, "unfinished", started, "(left for recovery: the node is stopping)")
            return False
        if tx.state == "lost":
            self.stats.add(lost_claims=1)
            self._outcome(claimed, "lost", started)
            return False
        self.stats.add(served=1)
        self.copies += len(names)
        with self.stats.lock:
            self.stats.latencies.append(time.monotonic() - started)
        self.observer.completed(claimed.candidate.envelope.headers.timestamp or claimed.candidate.mtime, 0)
        self._outcome(claimed, "fanned out", started, "to %d subscription(s)%s", len(names),
                      f": {', '.join(names)}" if names and len(names) <= 8 else "")
        return True

    def _read(self, claimed: Claimed, spool: BinaryIO, started: float) -> int | None:
        """Read the claim into ``spool``; return its size, None if it could not be read (then
        dealt with as a provider deals with it: filed, returned, or lost to another node)."""
        size = self.lifecycle.read_claim(claimed, spool, retry=self._retry, stop=self._stop)
        if isinstance(size, Unread):
            self._unread(claimed, size, started)
            return None
        self.observer.received(size, claimed.candidate.mtime)
        return size


def declare_subscriptions(registry: Registry, config: TopicConfig, owner: str) -> None:
    """Create the durable subscriptions ``config`` declares that are missing (a changed
    selector is written over the old one: the subscription keeps its messages)."""
    for name, sub in sorted(config.subscriptions.items()):
        registry.create(name, durable=sub.durable, selector=sub.selector, owner=owner, update_selector=True)


def remove_orphan_copies(runtime: Runtime, topic: str) -> int:
    """Delete this node's staged fan-out copies of ``topic`` that no open transaction accounts
    for (after recovery: only a machine crash that lost a copy's unsynced record leaves one).
    Nothing is touched while a committed transaction is still open."""
    if open_transactions(runtime.journal):
        return 0
    config = runtime.config.topics[topic]
    t = runtime.transport(config.server)
    suffix = f"~{runtime.node_id}"
    removed = 0
    try:
        dirs = [e.name for e in t.list(config.fanout_dir) if e.is_dir]
    except NotFound:
        return 0
    for d in dirs:
        path = f"{config.fanout_dir}/{d}"
        try:
            entries = t.list(path)
        except NotFound:
            continue
        for e in entries:
            if not e.is_dir and e.name.endswith(suffix):
                try:
                    t.delete(f"{path}/{e.name}")
                    removed += 1
                except NotFound:
                    pass
    if removed:
        log.warning("%s: removed %d orphan staged cop(ies) of this node", topic, removed)
    return removed


class TopicSweeper(Sweeper):
    """Sweeps a topic's incoming area and its subscriptions (see the module's text)."""

    def __init__(self, runtime: Runtime, topic: str, registry: Registry) -> None:
        super().__init__(list(runtime.endpoint_lifecycles(topic)), runtime.coordination)
        self.runtime = runtime
        self.topic = topic
        self.registry = registry
        self.removed = 0
        self._areas: dict[str, Sweeper] = {}
        self.subscriptions_lock = runtime.coordination.poll_lock(f"{topic}.subscriptions.sweep", "file")

    def sweep(self) -> None:
        super().sweep()
        with self.subscriptions_lock.attempt() as held:
            if held:
                self._sweep_subscriptions()

    def _sweep_subscriptions(self) -> None:
        subs = self.registry.subscriptions()
        live = set()
        for sub in subs:
            try:
                if not sub.durable and self.coordination.is_dead(sub.owner):
                    removed = self.registry.remove(sub.name)
                    self.removed += 1
                    log.warning("%s: non-durable subscription %s removed with %d file(s): its subscriber "
                                "%s has no heartbeat younger than the lease", self.topic, sub.name, removed,
                                sub.owner)
                    continue
                live.add(sub.name)
                area = self._areas.get(sub.name)
                if area is None:
                    inbound, outbound = self.runtime.endpoint_lifecycles(sub.endpoint)
                    area = self._areas[sub.name] = Sweeper([inbound, outbound], self.coordination)
                area.sweep()
            except UnknownSubscription:
                continue  # removed meanwhile by another node or its subscriber
            except FtpbcError as exc:  # one subscription never stops the others
                log.warning("%s: sweep of subscription %s skipped: %s", self.topic, sub.name, exc)
        for gone in [n for n in self._areas if n not in live]:
            del self._areas[gone]


__all__ = ["FanOut", "TopicSweeper", "declare_subscriptions", "remove_orphan_copies"]
