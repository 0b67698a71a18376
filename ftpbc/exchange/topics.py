"""Topics: the subscription registry, and the fan-out of one published message.

The registry lives on the topic's server, so every node and client sees one set: subscription
SUB of a topic is the marker file ``<repository>/subscriptions/SUB.subscription`` (JSON: topic,
name, durable, selector, owner, created) beside its exchange area ``<repository>/subscriptions/SUB/``.
A subscription exists exactly while its marker does.  Creating one makes the area, empties it of
anything a removed namesake left, then writes the marker (staged, renamed into place); removing
one deletes the marker first (from then on no fan-out copies to it), then the area's files.

Fan-out (:func:`fan_out`, run by serving nodes: :mod:`ftpbc.node.fanout`) is one
:class:`~ftpbc.exchange.transaction.Transaction` per claimed message: one member per matching
subscription (the message's name and body, staged under ``<repository>/fanout/SUB/``, where no
subscription's sweeper looks), settling the claim (see the transaction's text).  After any crash
and recovery each matching subscription holds the message once, or none does and the message is
back in the topic's inbox for another try.

What a subscription gets: every message whose sent time (the ``timestamp`` header a publish
stamps; a foreign producer's file: its modification time on the server) is not before the
subscription's ``created`` time, and that its selector selects.  Both times are wall clocks
(the publisher's, the subscriber's): hosts must keep their clocks in step (NTP), as leases need.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

from ftpbc.config.topics import (
    MARKER_SUFFIX,
    SEPARATOR,
    SUBSCRIPTION_RE,
    TopicConfig,
    check_subscription_name,
)
from ftpbc.errors import ConfigError, FtpbcError, NotFound, ReadPastSize, SelectorError
from ftpbc.exchange.area import CLAIM_SEPARATOR, ExchangeArea, claim_name
from ftpbc.exchange.bounds import BoundedSink
from ftpbc.exchange.layout import AreaLayout, Candidate, Outbound
from ftpbc.exchange.lifecycle import Claimed
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.transaction import Settlement, Transaction
from ftpbc.faults import crash_point
from ftpbc.model.selector import Selector, compile_selector
from ftpbc.transport.base import Entry, Transport

log = logging.getLogger("ftpbc.topics")

#: a marker larger than this is not one of ours (it holds a selector and a few names)
MAX_MARKER_BYTES = 64 * 1024
#: subscriptions a topic may have; markers beyond are logged and ignored
MAX_SUBSCRIPTIONS = 1000
#: hex digits of its transaction's id in a fan-out copy's stage name (``<name>~<token>~<node>``)
STAGE_TOKEN = 12


class UnknownSubscription(FtpbcError):
    """A subscription that does not exist (never made, or removed)."""

    def __init__(self, topic: str, name: str) -> None:
        self.topic = topic
        self.name = name
        super().__init__(f"topic {topic!r} has no subscription {name!r}")


@dataclass(frozen=True)
class Subscription:
    """One subscription of a topic, as its marker on the server says (immutable)."""

    topic: str
    """The topic it belongs to."""
    name: str
    """Its name, unique within the topic."""
    durable: bool
    """True: it keeps its messages until it is removed; False: it ends with its owner."""
    selector: str | None
    """The JMS selector choosing the messages copied to it (None: every message)."""
    owner: str
    """The node or client identity that made it; a non-durable one lives as long as its
    heartbeat."""
    created: datetime
    """When it was made (UTC)."""

    @property
    def endpoint(self) -> str:
        """The derived endpoint name of its exchange area (``TOPIC/SUB``)."""
        return f"{self.topic}{SEPARATOR}{self.name}"

    def to_json(self) -> bytes:
        """Its marker file's content (one JSON line), as :meth:`from_json` reads it."""
        return json.dumps({"version": 1, "topic": self.topic, "name": self.name, "durable": self.durable,
                           "selector": self.selector, "owner": self.owner,
                           "created": self.created.isoformat(timespec="microseconds")},
                          separators=(",", ":")).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, topic: str, name: str, data: bytes) -> Subscription:
        """ValueError for a marker that is not one (whatever a server or hand put there)."""
        try:
            d = json.loads(data.decode("utf-8"))
            selector = d.get("selector")
            created = datetime.fromisoformat(str(d["created"]))
            owner, durable = str(d["owner"]), d["durable"]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a subscription marker: {type(exc).__name__}: {exc}") from None
        if not isinstance(durable, bool) or not (selector is None or isinstance(selector, str)):
            raise ValueError("not a subscription marker: durable must be true/false, selector text")
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return cls(topic, name, durable, selector, owner[:200], created)


@dataclass(frozen=True)
class Target:
    """A subscription a message is copied to, with its compiled selector."""

    subscription: Subscription
    selector: Selector | None

    def accepts(self, c: Candidate) -> bool:
        """Whether ``c`` goes to this subscription: sent at or after it was created, and selected."""
        sent = c.envelope.headers.timestamp or c.mtime
        if sent is not None and sent < self.subscription.created:
            return False
        return self.selector is None or self.selector.matches(c.envelope.headers, c.envelope.properties)


def is_marker(e: Entry) -> bool:
    """Whether a listed entry of a topic's ``subscriptions`` directory is a subscription's marker."""
    return (not e.is_dir and e.name.endswith(MARKER_SUFFIX)
            and SUBSCRIPTION_RE.fullmatch(e.name[:-len(MARKER_SUFFIX)]) is not None)


def read_marker(transport: Transport, topic: str, directory: str, e: Entry) -> Subscription:
    """The subscription marker ``e`` of ``directory`` says (read at most MAX_MARKER_BYTES);
    NotFound if it is gone, ValueError or another FtpbcError if it is not a usable marker."""
    path = f"{directory}/{e.name}"
    sink = io.BytesIO()
    transport.get(path, BoundedSink(sink, MAX_MARKER_BYTES, server=transport.server, path=path,
                                    listed=f"{e.size} bytes").as_binary())
    return Subscription.from_json(topic, e.name[:-len(MARKER_SUFFIX)], sink.getvalue())


def read_subscriptions(transport: Transport, topic: str, config: TopicConfig) -> list[Subscription]:
    """Every subscription of ``topic`` read from its server, by name, without a runtime (for
    ``ftpbc status``: no journal, no lock); markers that cannot be used are left out."""
    try:
        entries = transport.list(config.subscriptions_dir)
    except NotFound:
        return []
    found = []
    for e in sorted(filter(is_marker, entries), key=lambda e: e.name)[:MAX_SUBSCRIPTIONS]:
        try:
            found.append(read_marker(transport, topic, config.subscriptions_dir, e))
        except (FtpbcError, ValueError):
            continue
    return found


class Registry:
    """The subscriptions of one topic, read from and written to its server.  Thread-safe."""

    def __init__(self, runtime: Runtime, topic: str) -> None:
        if topic not in runtime.config.topics:
            known = ", ".join(sorted(runtime.config.topics)) or "none"
            raise ConfigError(f"unknown topic {topic!r} (defined: {known})", file=runtime.config.source)
        self.runtime = runtime
        self.topic = topic
        self.config: TopicConfig = runtime.config.topics[topic]
        self.directory = self.config.subscriptions_dir
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        #: marker name -> ((size, mtime), the subscription it held; None: unusable, logged once)
        self._markers: dict[str, tuple[tuple[int, datetime | None], Subscription | None]] = {}
        self._warned_many = False
        #: the last listing's targets and when it began (time.monotonic())
        self._snapshot: list[Target] = []
        self._taken = float("-inf")
        self._selectors: dict[str, Selector | None] = {}

    @property
    def transport(self) -> Transport:
        return self.runtime.transport(self.config.server)

    # ------------------------------------------------------------------ reading

    def subscriptions(self) -> list[Subscription]:
        """Every subscription, by name; a marker that is not one (too large, not JSON) is logged
        and left out.  Raises what the server answers otherwise."""
        t = self.transport
        try:
            entries = t.list(self.directory)
        except NotFound:
            return []
        markers = [e for e in entries if is_marker(e)]
        if len(markers) > MAX_SUBSCRIPTIONS and not self._warned_many:
            self._warned_many = True
            log.warning("%s: %d subscription markers; only the first %d by name are used", self.topic,
                        len(markers), MAX_SUBSCRIPTIONS)
        if len(markers) > MAX_SUBSCRIPTIONS:
            markers = sorted(markers, key=lambda e: e.name)[:MAX_SUBSCRIPTIONS]
        found = []
        for e in markers:
            sub = self._read(t, e)
            if sub is not None:
                found.append(sub)
        with self._lock:
            listed = {e.name for e in markers}
            for gone in [n for n in self._markers if n not in listed]:
                del self._markers[gone]
        return sorted(found, key=lambda s: s.name)

    def _read(self, t: Transport, e: Entry) -> Subscription | None:
        key = (e.size, e.mtime)
        with self._lock:
            cached = self._markers.get(e.name)
        if cached is not None and cached[0] == key and e.mtime is not None:
            return cached[1]
        try:
            sub: Subscription | None = read_marker(t, self.topic, self.directory, e)
        except NotFound:
            return None  # removed since the listing
        except (ReadPastSize, ValueError) as exc:
            # Not a marker of ours (too large, not JSON): ignored, logged once per version of the
            # file.  Any other failure (the server) propagates: a fan-out that went on without a
            # subscription it could not read would lose that subscription's copies.
            log.warning("%s: subscription marker %s/%s cannot be used, ignored: %s", self.topic,
                        self.directory, e.name, exc)
            sub = None
        with self._lock:
            self._markers[e.name] = (key, sub)
        return sub

    def get(self, name: str) -> Subscription | None:
        """Subscription ``name`` if it exists."""
        check_subscription_name(name)
        t = self.transport
        path = self.marker(name)
        try:
            entry = t.stat(path)
        except NotFound:
            return None
        return self._read(t, Entry(path.rsplit("/", 1)[-1], entry.size, entry.mtime, False))

    def targets(self, not_before: float) -> list[Target]:
        """The subscriptions as a listing begun at or after ``not_before`` (time.monotonic())
        found them, with their selectors compiled: one listing serves every message claimed
        from an inbox listing made before it began."""
        # One refresh at a time: workers arriving together wait for one listing, not make their own.
        with self._refresh_lock:
            with self._lock:
                if self._taken >= not_before:
                    return self._snapshot
            began = time.monotonic()
            subs = self.subscriptions()
            targets = [Target(s, self._selector(s)) for s in subs]
            # Only the selectors of markers still there are kept: markers planted and removed
            # over and over do not grow the cache, and one that stays is still logged once.
            kept = {s.selector for s in subs}
            self._selectors = {text: sel for text, sel in self._selectors.items() if text in kept}
            with self._lock:
                self._snapshot, self._taken = targets, began
            return targets

    def _selector(self, s: Subscription) -> Selector | None:
        """The compiled selector of ``s`` (None: every message); a selector that does not
        compile (too long, too deep, malformed) selects nothing and is logged once."""
        if s.selector is None or not s.selector.strip():
            return None
        if s.selector not in self._selectors:
            try:
                self._selectors[s.selector] = compile_selector(s.selector)
            except FtpbcError as exc:
                # A marker written by hand, by another version or by someone hostile: better no
                # copies than wrong ones, and the topic's other subscriptions go on.  The text
                # is cut short: a refused selector may be as long as the marker.
                problem = (f"column {exc.column}: {exc.problem}" if isinstance(exc, SelectorError)
                           else str(exc))
                log.warning("%s/%s: selector %s does not compile (%s): the subscription gets nothing",
                            self.topic, s.name, _shortened(repr(s.selector)), _shortened(problem))
                self._selectors[s.selector] = _NOTHING
        return self._selectors[s.selector]

    def marker(self, name: str) -> str:
        return f"{self.directory}/{name}{MARKER_SUFFIX}"

    def backlog(self, name: str) -> int:
        """Messages waiting in subscription ``name``'s inbox (0 if it has none)."""
        area = ExchangeArea(self.config.subscription_dir(name))
        try:
            return sum(1 for e in self.transport.list(area.dir("in", "box")) if not e.is_dir)
        except NotFound:
            return 0

    # ------------------------------------------------------------------ writing

    def create(self, name: str, *, durable: bool, selector: str | None, owner: str,
               update_selector: bool = False) -> tuple[Subscription, bool]:
        """Subscription ``name``, made if missing; ``(subscription, made now)``.

        An existing one is kept (its messages and created time) when its durability is the
        same and ``selector`` is None (resumed as it is) or its own; a different durability is
        refused (ValueError), and so is a different selector unless ``update_selector`` (a
        configuration changed: the marker is rewritten with the new selector, None included,
        its created time kept).
        """
        check_subscription_name(name)
        if selector is not None and not selector.strip():
            selector = None  # the empty selector is no selector (JMS)
        if selector is not None:
            compile_selector(selector)  # SelectorError before anything is written
        existing = self.get(name)
        if existing is not None:
            if existing.durable != durable:
                raise ValueError(f"subscription {self.topic}/{name} exists and is "
                                 f"{'durable' if existing.durable else 'non-durable'}")
            if existing.selector == selector or (selector is None and not update_selector):
                return existing, False
            if not update_selector:
                raise ValueError(f"subscription {self.topic}/{name} exists with selector "
                                 f"{existing.selector!r}; unsubscribe it first to change it")
            sub = Subscription(self.topic, name, durable, selector, existing.owner, existing.created)
            self._write(sub)
            log.info("%s/%s: selector changed to %r", self.topic, name, selector)
            return sub, False
        # The next millisecond (sent times travel in names to the millisecond): a message sent
        # before this call, even within the same millisecond, is older; one sent after it
        # returns is not (see the wait below).
        created = _next_millisecond(datetime.now(UTC))
        sub = Subscription(self.topic, name, durable, selector, owner, created)
        lc_in = self.runtime.lifecycle(sub.endpoint)
        # Made (again) here, not only once per process: a removed subscription's namesake
        # needs its directories back
        lc_in.layout.prepare(lc_in.transport)
        self._purge(name)  # a subscription starts empty, whatever a removed namesake left
        self._write(sub)
        log.info("%s: subscription %s created (%s%s)", self.topic, name,
                 "durable" if durable else "non-durable", f", selector {selector!r}" if selector else "")
        while datetime.now(UTC) < created:  # at most a millisecond: a clock tick, not a wait for others
            time.sleep(0.0002)
        return sub, True

    def _write(self, sub: Subscription) -> None:
        t = self.transport
        t.mkdir(self.directory)
        staged = f"{self.directory}/{claim_name(sub.name + MARKER_SUFFIX, self.runtime.node_id)}"
        t.put(staged, io.BytesIO(sub.to_json()))
        t.rename(staged, self.marker(sub.name))
        with self._lock:
            self._taken = float("-inf")  # this process's next fan-out lists again

    def remove(self, name: str) -> int:
        """Remove subscription ``name`` and every message in its area; how many files went.
        UnknownSubscription if it does not exist."""
        check_subscription_name(name)
        try:
            self.transport.delete(self.marker(name))
        except NotFound:
            raise UnknownSubscription(self.topic, name) from None
        with self._lock:
            self._taken = float("-inf")
        removed = self._purge(name)
        log.info("%s: subscription %s removed with %d file(s)", self.topic, name, removed)
        return removed

    def _purge(self, name: str) -> int:
        """Delete every file of subscription ``name``'s area and fan-out stage (directories
        stay: the transports remove files only)."""
        t = self.transport
        dirs = [*ExchangeArea(self.config.subscription_dir(name)).all_dirs(),
                f"{self.config.fanout_dir}/{name}"]
        removed = 0
        for d in dirs:
            try:
                entries = t.list(d)
            except NotFound:
                continue
            for e in entries:
                if e.is_dir:
                    continue
                try:
                    t.delete(f"{d}/{e.name}")
                    removed += 1
                except NotFound:
                    pass
        return removed


#: what a subscription whose selector does not compile selects
_NOTHING = compile_selector("FALSE")


def _shortened(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for a log line."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _next_millisecond(t: datetime) -> datetime:
    """``t`` rounded up to a whole millisecond."""
    whole = t.replace(microsecond=t.microsecond // 1000 * 1000)
    return whole if whole == t else whole + timedelta(milliseconds=1)


# ---------------------------------------------------------------------- fan-out

def copy_name(layout: AreaLayout, c: Candidate) -> str:
    """The name a message's copies take: its own, with the delivery count of its tries here reset."""
    if c.envelope.headers.delivery_count == 0:
        return c.name
    return layout.with_delivery_count(c, 0)


def fan_out(runtime: Runtime, topic: str, claimed: Claimed, body: bytes | BinaryIO,
            targets: Sequence[Target]) -> tuple[Transaction, list[str]]:
    """Stage a copy of the claimed message ``claimed`` of ``topic`` (read into ``body``: bytes,
    or a seekable stream) for every subscription of ``targets`` that accepts it, in one transaction that
    settles the claim (archived, or deleted with ``archive: false``); return it uncommitted,
    with the names of the subscriptions it copies to.

    The caller commits it (:meth:`Transaction.commit`, retried after a server error: it is
    idempotent once its record is written).  Its state is then ``done`` (every copy exposed,
    the claim settled) or ``lost`` (the claim was returned to another node: no copy exposed).
    Raises what the server answers while staging, with the staged copies removed (or left to
    recovery, which removes them: there is no commit record yet); the claim is the caller's.
    """
    lc = runtime.lifecycle(topic)
    layout = lc.layout
    assert isinstance(layout, AreaLayout)
    fanout_dir = runtime.config.topics[topic].fanout_dir
    chosen = [t.subscription for t in targets if t.accepts(claimed.candidate)]
    tx = Transaction(runtime, points="fanout")
    # The transaction's own token in every stage name: a node may fan one message out twice (a
    # fan-out left to recovery, its claim given back and taken again), and what recovery or an
    # undo removes of one must never be the other's copies.
    token = tx.id.replace("-", "")[:STAGE_TOKEN]
    try:
        copies = []
        for sub in chosen:
            sub_layout = runtime.lifecycle(sub.endpoint).layout
            assert isinstance(sub_layout, AreaLayout)
            name = copy_name(sub_layout, claimed.candidate)
            staged = claim_name(f"{name}{CLAIM_SEPARATOR}{token}", runtime.node_id)
            stage = f"{fanout_dir}/{sub.name}/{staged}"
            copies.append((sub.endpoint, Outbound(sub_layout.box_path(name), stage)))
        tx.stage_copies(copies, body, uid=claimed.uuid)
        crash_point("fanout.after-stage")
        commit = layout.commit(claimed.candidate, runtime.node_id, lc.clock(), error=False)
        tx.settle_claim(Settlement(topic, claimed.op_id, claimed.path, commit.path, commit.cleanup))
    except BaseException:
        try:
            tx.rollback()
        except FtpbcError as exc:  # no commit record: recovery removes them
            log.warning("%s: staged copies of %s left for recovery: %s", topic, claimed.name, exc)
        raise
    return tx, [s.name for s in chosen]


def subscriber_name(owner: str) -> str:
    """A fresh name for a non-durable subscription of ``owner`` (its identity, shortened)."""
    base = "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in owner)[:40].strip("-.") or "sub"
    return f"{base}-{uuidlib.uuid4().hex[:12]}"


__all__ = ["Registry", "Subscription", "Target", "UnknownSubscription", "copy_name", "fan_out",
           "read_subscriptions", "subscriber_name"]
