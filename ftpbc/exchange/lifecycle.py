"""The message lifecycle, written once above the transport for every layout: stage, expose,
claim, read, serve, commit, respond, archive or delete, error, return; each remote write
preceded by its journal record.

Who calls what
    a sender      :meth:`Lifecycle.send` (a request, a one-way message, a file to a partner);
    a provider    :meth:`claim` / :meth:`read`, the handler, then :meth:`record_served` and
                  :meth:`finish_served` (endpoints and transfers alike);
    a collector   :meth:`claim` / :meth:`read` a response, then :meth:`finish_collect`.

The provider's order is what makes a crash decidable from the server alone::

    served (durable record: the result and every name still to use)
      -> put the reply's stage file                   (a response, or a transfer's outbound file)
      -> COMMIT: rename the claim to its archive / error / post_receive place   (ownership)
      -> expose the reply: protect an existing target, rename stage -> target, post_send rename

If the commit finds its source gone, another node returned this node's claim (it looked dead)
and serves the message: this node never exposes its reply, so a slow node never causes a second
one.  The reply stays staged under a name that declares its size, and the node that serves the
returned request delivers it instead of running the handler again (:meth:`Lifecycle.adopt`).
A commit whose reply is lost is decided from the server (the commit target exists: done; the
claim still exists: retried; neither: lost).  Recovery
(:mod:`ftpbc.exchange.recovery`) runs the very same :meth:`finish_served`.

Delivery count and poison messages
    :meth:`Lifecycle.read_claim` is the one read-failure policy.  A claimed message that was read
    and found unusable (refused, short, longer than listed) goes back to its box with its
    delivery count raised in its name, and no node claims it again for ``redelivery_delay``
    seconds (doubling with each delivery): every node holds a returned message back from the
    moment it first lists it.  At ``max_deliveries`` it goes to the error directory with
    ``<name>.reason`` beside it, and a requester gets an error reply at once.  A failure that
    says nothing about the message (a dropped or dying session, a timeout, a server
    restarting) is not a delivery: the read is tried again on a fresh session, with backoff,
    and the claim goes back unchanged if the server stays away.  A handler's exception is its
    answer: the message goes to the error directory at once (a requester gets the error reply).

Filing
    Every filing (error directory, dead letters, expiry) is a ``served`` operation whose result
    is the error reply: recorded durably first, then finished by :meth:`finish_served` (reply
    staged, claim renamed into the directory, reason file, reply exposed), so a filing retried
    after a partial failure, or finished by recovery, completes and never loses the message
    nor its caller's answer.
"""

from __future__ import annotations

import functools
import heapq
import io
import logging
import re
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO, Protocol, TypeVar

from ftpbc.errors import (
    FtpbcError,
    IncompleteRead,
    MessageTooLarge,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolError,
    QueueFull,
    SourceGone,
    TransportError,
    UnsafeEntry,
    UnsafeNameError,
)
from ftpbc.exchange.area import REASON_SUFFIX, archive_name, parse_archive_name, split_stage
from ftpbc.exchange.bounds import DEFAULT_MAX_MESSAGE_BYTES, READ_MARGIN, BoundedSink, body_length, check_body
from ftpbc.exchange.capacity import Capacity
from ftpbc.exchange.layout import LONE_AFTER, AreaLayout, Candidate, Commit, Layout, Outbound, delivery_order
from ftpbc.exchange.policy import DEFAULT_POLICY, QueuePolicy
from ftpbc.faults import crash_point
from ftpbc.journal import EndpointJournal, Operation
from ftpbc.metrics import NULL_OBSERVER, EndpointObserver
from ftpbc.model.envelope import EXPIRED_TYPE, NAME_LIMIT, Envelope, Headers
from ftpbc.paths import join
from ftpbc.transport.base import Entry, Refused, Transport

log = logging.getLogger("ftpbc.lifecycle")

T = TypeVar("T")

Body = bytes | BinaryIO

#: ``Claimed.size`` of a claim found in the journal rather than in a listing
UNKNOWN_SIZE = -1
#: handler results and files this large stay in memory; larger ones spool to disk
SPOOL_IN_MEMORY = 4 * 1024 * 1024
#: read failures that are the file's fault (counted as a delivery), not the connection's
POISON_ERRORS: tuple[type[TransportError], ...] = (PermissionDenied, IncompleteRead, ProtocolError)
#: names a node holds back after a failed delivery, at most (the oldest holds are dropped)
MAX_HELD = 100_000
#: how long a read that fails for the connection's sake (not the message's) is tried again, on
#: fresh sessions, before the claim goes back unchanged; and its first and longest pause
READ_RETRY_FOR = 30.0
READ_RETRY_FIRST = 0.05
READ_RETRY_MAX = 2.0
_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,128}")
#: a listing in the background gives the interpreter up every this many entries, a short stretch
#: of parsing
YIELD_EVERY = 50
#: refused entries (links, fifos... planted in a box) one listing files at most; the rest wait for
#: the next listing, so that a box flooded with links does not hold the poll lock for long
MAX_REFUSED_PER_LISTING = 100
#: message ids a node remembers having settled (served, filed), to recognise a duplicate; the
#: oldest are forgotten past this many
REMEMBERED_IDS = 10_000
#: the reason a duplicate is filed with (the start of its ``.reason`` file)
DUPLICATE_REASON = "duplicate message id"
#: what a file name of ours may not hold (paths.check_name's rule, plus control characters)
_NOT_IN_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Listing:
    """What one listing of a box found (:meth:`Lifecycle.listing`)."""

    #: the best messages listed, in delivery order, at most the ``keep`` asked for
    candidates: list[Candidate]
    #: messages listed, held and expired ones included (those ``stop_after`` counts)
    found: int
    #: read to its end (False: stopped after ``stop_after`` messages)
    complete: bool
    #: how long it took
    seconds: float


@dataclass(frozen=True)
class Claimed:
    """A message this node claimed (into the select directory, or in place)."""

    candidate: Candidate
    path: str  # where it is now, e.g. /q/inselect/req.<uuid>~node-a
    op_id: str
    #: why this is a duplicate (its id is another message's: see :meth:`Lifecycle.claim`), to be
    #: filed unread and unanswered; None for a message to serve
    duplicate: str | None = None

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def uuid(self) -> str:
        return self.candidate.uuid

    @property
    def size(self) -> int:
        return self.candidate.size


@dataclass(frozen=True)
class Served:
    """A ``served`` record written by :meth:`Lifecycle.write_served`, not yet known durable."""

    claimed: Claimed
    fields: dict[str, str]
    seq: int  # the journal's record batch (EndpointJournal.wait_durable)


class Retry(Protocol):
    """Runs an idempotent step until it succeeds; None if it gave up (the node is stopping).
    A poller passes its own (:meth:`ftpbc.node.poller.Poller._retry`); :func:`run_once` runs the
    step once and lets its error through."""

    def __call__(self, step: Callable[[], T]) -> T | None: ...


def run_once(step: Callable[[], T]) -> T | None:
    """A :class:`Retry` that does not retry: the step's error reaches the caller."""
    return step()


class Disposition(str):
    """What became of a message that could not be served: the text for a log line, and its
    ``kind`` for whoever counts outcomes (``returned`` to the box, filed as an ``error``, filed
    with the ``dead`` letters, filed as a ``duplicate``, or ``gone`` before it could be filed).
    A str, so callers that only log it need not know."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Disposition:
        self = super().__new__(cls, text)
        self.kind = kind
        return self


#: what became of a claim whose filing or return could not be finished (the node is stopping)
UNFINISHED = Disposition("left for recovery: the node is stopping", "unfinished")


class DuplicateMessage(FtpbcError):
    """Why a claim was not read (:attr:`Unread.error`): its message id is another message's of
    the same box (claimed, being served, or settled by this node), so it is filed in the error
    directory unread, with no reply, since the caller of that id waits for the first message's
    answer.  Never raised to a caller."""


@dataclass(frozen=True)
class Unread:
    """A claim :meth:`Lifecycle.read_claim` could not read, and what it did with it instead.

    ``kind``: ``returned`` (back in its box: unchanged after a connection fault, with its
    delivery count raised after an unusable read), ``error`` or ``dead`` (filed, its reason
    beside it, a requester answered), ``duplicate`` (filed, its reason beside it, nobody
    answered: :meth:`Lifecycle.file_duplicate`), ``lost`` (another node returned this node's claim: it
    is theirs now), ``gone`` (vanished before it could be filed), ``unfinished`` (left for
    recovery)."""

    error: Exception
    disposition: Disposition

    @property
    def kind(self) -> str:
        return self.disposition.kind


def op_id_for(uuid: str | None, role: str) -> str:
    """Journal operation id: the message's UUID plus its role (one op per role per message)."""
    return f"{uuid or uuidlib.uuid4()}.{role}"


def _stream(body: Body) -> BinaryIO:
    return io.BytesIO(body) if isinstance(body, bytes | bytearray) else body


def rename_resolving(transport: Transport, src: str, dst: str) -> None:
    """Rename, resolving a lost reply (OutcomeUnknown) from the server's state.

    SourceGone propagates when ``src`` was never there.
    """
    try:
        transport.rename(src, dst)
    except OutcomeUnknown:
        if transport.exists(src):
            transport.rename(src, dst)
        # else the first rename happened (the target may already be claimed by a consumer)


def expose_each(items: Sequence[tuple[Lifecycle, Outbound]]) -> list[TransportError | None]:
    """:meth:`Lifecycle.expose` of several complete staged files (``staged=True``), with the
    renames of those on one server sent together (:meth:`Transport.rename_each`: one round trip
    on FTP where one each takes one).  Per item, in order: None once it is in place, or the
    TransportError exposing it raised (SourceGone: its stage file was not there).  Every item is
    tried whatever happens to the others; one with a protect or final step is exposed alone.
    """
    outcomes: list[TransportError | None] = [None] * len(items)
    #: transport id -> (the transport, indexes of the items renamed there together)
    together: dict[int, tuple[Transport, list[int]]] = {}
    for i, (lc, out) in enumerate(items):
        if out.stage is None or out.protect or out.final:
            try:
                lc.expose(out, staged=True, body=None)
            except TransportError as exc:
                outcomes[i] = exc
            continue
        try:
            lc.layout.ensure_dir(lc.transport, out.target)
        except TransportError as exc:
            outcomes[i] = exc
            continue
        together.setdefault(id(lc.transport), (lc.transport, []))[1].append(i)
    for t, indexes in together.values():
        pairs = []
        for i in indexes:
            stage = items[i][1].stage
            assert stage is not None  # checked above
            pairs.append((stage, items[i][1].target))
        for i, (src, dst), outcome in zip(indexes, pairs, t.rename_each(pairs), strict=True):
            if isinstance(outcome, OutcomeUnknown):
                try:  # as rename_resolving: the stage still there means it did not happen
                    if t.exists(src):
                        rename_resolving(t, src, dst)
                    outcome = None
                except TransportError as exc:
                    outcome = exc
            outcomes[i] = outcome
    return outcomes


class Lifecycle:
    """One layout's messages as seen by one node.  Thread-safe."""

    def __init__(self, layout: Layout, transport: Transport, journal: EndpointJournal, node_id: str, *,
                 max_deliveries: int = 5, redelivery_delay: float = 1.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 policy: QueuePolicy = DEFAULT_POLICY) -> None:
        self.layout = layout
        self.policy = policy
        #: a bounded inbox's count, kept by its senders (docs/queues.md); None: unbounded
        self.capacity = Capacity(layout, transport, policy) if policy.bounded else None
        #: told of the messages this lifecycle files as dead letters (a provider sets its own)
        self.observer: EndpointObserver = NULL_OBSERVER
        #: expired messages the last listings found (name -> candidate), for take_expired
        self._expired: dict[str, Candidate] = {}
        layout.reserve = len(archive_name("", node_id, datetime.now(UTC)).encode("utf-8"))
        self.transport = transport
        self.journal = journal
        self.node_id = node_id
        self.max_deliveries = max_deliveries
        self.redelivery_delay = redelivery_delay
        self.clock = clock
        self._prepared = False
        self._lock = threading.Lock()
        #: name -> monotonic time before which this node does not claim it again
        self._held: dict[str, float] = {}
        #: names whose hold ran out: listed as any other message from then on (insertion
        #: ordered, the oldest dropped past MAX_HELD)
        self._released: dict[str, None] = {}
        #: deliveries of files whose names cannot carry a count (read in place, responses)
        self._local_deliveries: dict[str, int] = {}
        #: message id -> (journal operation, name) of this node's claims, while that operation
        #: is pending: a file of another name with the same id meanwhile is a duplicate
        self._in_hand: dict[str, tuple[str, str]] = {}
        #: message id -> name of the messages this node settled lately (REMEMBERED_IDS at most)
        self._settled: dict[str, str] = {}

    @property
    def name(self) -> str:
        return self.layout.display

    @property
    def max_message_bytes(self) -> int:
        """The layout's ``max_message_bytes`` (endpoints and transfers have it)."""
        config = getattr(self.layout, "config", None)
        return int(getattr(config, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES))

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Create the layout's directories that are missing (once per process)."""
        with self._lock:
            if self._prepared:
                return
            self.layout.prepare(self.transport)
            self._prepared = True

    # ------------------------------------------------------------------ listing

    def waiting(self) -> list[Candidate]:
        """The messages waiting in the box, in delivery order, less those held back here."""
        return self.listing().candidates

    def listing(self, *, keep: int | None = None, stop_after: int | None = None,
                glob: str | None = None, cancel: threading.Event | None = None,
                background: bool = False) -> Listing:
        """List the box (or the names ``glob`` matches) as the listing streams in, and keep the
        best ``keep`` messages in delivery order (None: all), less those held back here and the
        expired ones (set aside for take_expired).

        Memory is bounded by ``keep`` (one and a half times it, while listing), not by the box: a box of a
        million messages is listed without holding a million of anything.  ``stop_after``:
        the listing is stopped once that many messages were found (``complete`` is then
        False); a layout with ``stable_for`` is always listed to the end, since stability is
        judged over whole listings.  ``cancel``, once set, stops the listing too (a complete
        pass of a node that is stopping).  ``background``: the listing runs on a thread beside
        the node's workers, and lets them have the interpreter every few entries (parsing
        holds it; a worker waiting for it after each of its round trips would wait for the
        interpreter's switch interval, 5 ms, every time).  GlobRefused: the server does not
        list by glob.
        """
        layout = self.layout
        started = time.monotonic()
        held = self._held
        if held:
            with self._lock:
                for name in [n for n, t in held.items() if t <= started]:
                    del held[name]
                    self._released[name] = None
                if len(self._released) > MAX_HELD:
                    for name in list(self._released)[:MAX_HELD // 2]:
                        del self._released[name]
        released = self._released
        hold_returned = self.redelivery_delay > 0
        returned: list[Candidate] = []
        expires = self.policy.expires
        now = self.clock()
        best: list[Candidate] = []
        expired: list[Candidate] = []
        found = 0

        def admit(c: Candidate) -> None:
            nonlocal best
            exp = c.envelope.headers.expiration
            if expires and exp is not None and exp <= now:
                if len(expired) < MAX_HELD:
                    expired.append(c)
                return
            if (held and c.name in held) or keep == 0:
                return
            if hold_returned and c.envelope.headers.delivery_count and c.name not in released:
                returned.append(c)  # first seen here since it came back: held from now on
                return
            best.append(c)
            if keep is not None and len(best) >= keep + keep // 2 + 64:
                best = heapq.nsmallest(keep, best, key=delivery_order)

        gate = layout.gate()
        entries = 0

        def visit(e: Entry) -> bool:
            nonlocal found, entries
            entries += 1
            if background and entries % YIELD_EVERY == 0:
                time.sleep(0)
            c = layout.candidate(e)
            if gate is not None:
                gate.see(e, c)  # judged once the listing is whole
                found += c is not None
                return True
            if c is None:
                return True
            found += 1
            admit(c)
            return (stop_after is None or found < stop_after) and not (cancel is not None and cancel.is_set())

        refused: list[Refused] = []
        complete = self.transport.scan(layout.box, visit, glob=glob, refuse_dirs=layout.files_only,
                                       refused=refused)
        if refused:
            self._file_refused(refused)
        if gate is not None:
            for c in gate.admitted(time.monotonic(), self.clock()):
                admit(c)
            if gate.orphans and glob is None:
                self._report_lone_markers(gate.orphans)
        if expired:
            with self._lock:
                if len(self._expired) >= MAX_HELD:
                    self._expired.clear()
                self._expired.update((c.name, c) for c in expired)
        if returned:
            self._hold(returned, started)
        if keep is not None and len(best) > keep:
            best = heapq.nsmallest(keep, best, key=delivery_order)
        else:
            best.sort(key=delivery_order)
        return Listing(best, found, complete, time.monotonic() - started)

    def _report_lone_markers(self, orphans: set[str]) -> None:
        """Log, once each, the completion markers found without their data file in this
        listing and the one before, unless that file is claimed (a claim keeps its marker until
        it is settled).  Such a marker is left alone: its file may still be on its way."""
        layout = self.layout
        suspects = layout.markers_alone(orphans)
        if not suspects:
            return
        claimed: set[str] = set()
        if layout.select is not None:
            try:
                entries = self.transport.list(layout.select)
            except TransportError as exc:
                log.info("%s: cannot list %s to tell lone markers from claimed files' (next listing "
                         "will): %s", self.name, layout.select, exc)
                return
            for e in entries:
                name, _, _ = parse_archive_name(e.name)
                cand = layout.decode_name(name)
                marker = layout.marker_of(cand) if cand is not None else None
                if marker in suspects:
                    claimed.add(marker)
        for name in layout.lone_markers(suspects, claimed, time.monotonic()):
            layout.report(name, f"completion marker without its data file for {LONE_AFTER:g} s or "
                                "more: left alone (its file is not here, nor claimed)")

    def _hold(self, returned: Sequence[Candidate], now: float) -> None:
        """Hold back messages that came back to the box (their names carry a delivery count)
        for ``redelivery_delay`` doubled per delivery, counted from now: the node that
        returned a message holds it from the moment it did, and every other node from the
        moment it first lists it, so no node hands a failing message round the cluster at
        once."""
        with self._lock:
            if len(self._held) + len(returned) > MAX_HELD:
                self._held.clear()
            for c in returned:
                count = c.envelope.headers.delivery_count
                self._held[c.name] = now + self.redelivery_delay * (2 ** min(count - 1, 16))

    def _file_refused(self, refused: Sequence[Refused]) -> None:
        """File what a listing refused (a link, a fifo, a directory... planted in the box) in
        the error directory, with ``<name>.reason`` beside it: moved unopened (a rename moves a
        link itself, never what it points to), so the box holds messages only and the entry
        shows up where an operator looks for what went wrong.

        One that cannot be filed (a name no path can carry, a full disk) is reported once and
        left where it is; the others are filed all the same, and the listing goes on."""
        t, layout = self.transport, self.layout
        box = layout.box.rstrip("/")
        for r in refused[:MAX_REFUSED_PER_LISTING]:
            src = f"{box}/{r.name}"
            when = self.clock()
            try:
                target = join(layout.error, archive_name(_fileable(r.name, layout.reserve),
                                                         self.node_id, when))
                layout.ensure_dir(t, target)
                t.move_refused(src, target)
            except SourceGone:
                continue  # another node filed (or a partner removed) it meanwhile
            except (TransportError, UnsafeNameError) as exc:
                layout.report(r.name, f"is {r.kind}: refused, and it cannot be filed in "
                                      f"{layout.error}: {exc}")
                continue
            reason = (f"UnsafeEntry: {src} is {r.kind}; refused by node {self.node_id}: moved here "
                      "without being opened or followed")
            log.warning("%s: %r is %s: refused, filed in %s without being opened or followed",
                        self.name, src, r.kind, layout.error)
            try:
                t.put(target + REASON_SUFFIX,
                      io.BytesIO(reason.encode("utf-8", "backslashreplace") + b"\n"))
            except TransportError as exc:
                log.warning("%s: %s: could not write its reason file: %s", self.name, target, exc)

    def is_expired(self, c: Candidate) -> bool:
        exp = c.envelope.headers.expiration
        return self.policy.expires and exp is not None and exp <= self.clock()

    def take_expired(self, limit: int | None = None) -> list[Candidate]:
        """Up to ``limit`` expired messages that listings found and nobody took yet."""
        with self._lock:
            names = list(self._expired)[:limit]
            return [self._expired.pop(n) for n in names]

    def record_expired(self, claimed: Claimed) -> dict[str, str]:
        """Record that a claimed message expired (never to be delivered): it goes to the expired
        directory, or the dead letters with ``expired: dead_letter``, with its reason beside
        it, and a request's caller gets a reply of type EXPIRED_TYPE.  Finished like a served
        message (:meth:`finish_served`), so recovery finishes it too.  A duplicate
        (:attr:`Claimed.duplicate`) is filed as one instead (:meth:`record_duplicate`)."""
        if claimed.duplicate is not None:
            return self.record_duplicate(claimed)
        exp = claimed.candidate.envelope.headers.expiration
        when = self.clock()
        reason = (f"expired at {exp.isoformat(timespec='milliseconds') if exp else '?'}, found by node "
                  f"{self.node_id} at {when.isoformat(timespec='milliseconds')}; never delivered")
        layout = self.layout
        directory = layout.dead_dir if self.policy.expired == "dead_letter" else layout.expired_dir
        target = layout.filed_path(directory, claimed.name, self.node_id, when)
        return self.record_served(claimed, None, error=reason, commit=Commit(target), reply_type=EXPIRED_TYPE)

    def expire(self, picks: Sequence[Candidate]) -> int:
        """Claim expired messages and file them (see :meth:`record_expired`); how many were.

        For a sweep: one that cannot be finished now is left to this node's recovery."""
        claimed, _ = self.claim(picks, "expire")
        done = 0
        for c in claimed:
            try:
                fields = self.record_expired(c)
                if self.finish_served(c.op_id, fields, fresh=True):
                    done += 1
            except TransportError as exc:
                log.warning("%s: %s expired but could not be filed yet (recovery will): %s",
                            self.name, c.name, exc)
        return done

    # ------------------------------------------------------------------ sending

    def send(self, out: Outbound, body: Body, *, op_id: str, kind: str) -> str:
        """Stage ``body`` and expose it at ``out``; return where it is once in place.

        On return the file is visible and complete.  If this raises, the journal still holds the
        intent and recovery rolls it back (a staged file is removed: the sender never got an
        acknowledgement).

        A send to a bounded inbox counts it first (:mod:`ftpbc.exchange.capacity`): when full,
        QueueFull is raised before anything is staged or journaled, or (``on_overflow:
        dead_letter``) the message goes the same way into the dead letters instead, and a
        request raises QueueFull once it is filed there (no reply can come).
        """
        check_body(body, self.max_message_bytes, f"{self.name}: message for {out.target}")
        name = out.target.rsplit("/", 1)[-1]
        if self.capacity is None or out.target != self.layout.box_path(name):
            return self._send(out, body, op_id=op_id, kind=kind)
        with self.capacity.admit(name, body_length(body)) as full:
            if full is None:
                return self._send(out, body, op_id=op_id, kind=kind)
        when = self.clock()
        # The same stage, another target: journaled and recovered like any send, and the name
        # keeps every header the sender gave.
        dead = Outbound(self.layout.filed_path(self.layout.dead_dir, name, self.node_id, when), out.stage)
        this = f" and this message has {full.size} bytes" if full.limit == "max_bytes" and full.size else ""
        reason = (f"overflow: {full.messages} message(s) of {full.waiting_bytes} bytes waiting in "
                  f"{self.layout.box}, {full.limit} is {full.bound}{this}; filed by node {self.node_id} "
                  f"at {when.isoformat(timespec='milliseconds')}, never delivered")
        where = self._send(dead, body, op_id=op_id, kind=kind, reason=reason)
        log.warning("%s: queue full (%s %d): %s filed as a dead letter", self.name, full.limit,
                    full.bound, name)
        if kind == "request":
            raise QueueFull(full.endpoint, full.limit, full.bound, full.messages, full.waiting_bytes,
                            full.size, filed=where)
        return where

    def _send(self, out: Outbound, body: Body, *, op_id: str, kind: str, reason: str | None = None) -> str:
        """:meth:`send` once its bound is decided.  ``reason``: the message is being filed (a
        dead letter); ``<where>.reason`` is put beside it once it is in place, and the reason is
        in the journal record, so recovery puts it when a crash came first."""
        # Not fsynced: written before the put, it survives a kill of this process (the page
        # cache outlives it); after a machine crash, recovery finds the stage file by the node
        # id in its name instead (recovery.recover_orphans).  Only results need fsync.
        fields = {"kind": kind, **out.fields(), **({"reason": reason} if reason is not None else {})}
        self.journal.record_many([(op_id, "send", fields)], durable=False)
        crash_point("send.after-intent")
        if out.stage:
            self.layout.ensure_dir(self.transport, out.stage)
            self.transport.put(out.stage, _stream(body))
            crash_point("send.after-put")
        try:
            where = self.expose(out, staged=True, body=lambda: _stream(body))
        except SourceGone:
            # A sweeper removed our staged file, judging this node dead (its heartbeat was
            # older than the lease).  The message was never exposed: say so.
            self.journal.end(op_id)
            raise
        crash_point("send.after-expose")
        if reason is not None:
            if self.filed_dead(where):
                self.observer.dead_lettered()
            try:
                self.transport.put(where + REASON_SUFFIX, io.BytesIO(reason.encode("utf-8") + b"\n"))
            except TransportError as exc:
                # The message is filed: failing the send now would have it sent again.
                log.warning("%s: %s: could not write its reason file: %s", self.name, where, exc)
        self.journal.end(op_id)
        return where

    def stage(self, out: Outbound, body: Body, *, op_id: str, kind: str, tx: str) -> None:
        """The first half of :meth:`send` for a member of transaction ``tx``: journal the send
        (its record names the transaction), upload to the stage; nothing is exposed.

        The transaction (:mod:`ftpbc.exchange.transaction`) exposes its members with
        :meth:`expose` once its commit record is durable.  Until then recovery rolls the member
        back like any staged send; after it, the transaction's recovery rolls it forward.
        """
        if not out.stage:
            raise ValueError(f"{self.name}: {out.target} has no stage: it cannot be sent in a transaction")
        check_body(body, self.max_message_bytes, f"{self.name}: message for {out.target}")
        # Not fsynced, as a send's record: the commit record is, and it names every member.
        self.journal.record_many([(op_id, "send", {"kind": kind, "tx": tx, **out.fields()})], durable=False)
        self.layout.ensure_dir(self.transport, out.stage)
        self.transport.put(out.stage, _stream(body))

    def upload_stage(self, out: Outbound, body: Body) -> None:
        """Upload ``body`` to ``out.stage``, journaling and checking nothing: for a transaction
        whose own record named this stage before the upload, so that its recovery removes it,
        and that checked the body's size against :attr:`max_message_bytes` before that record
        (a fan-out's copies: :meth:`Transaction.stage_copies
        <ftpbc.exchange.transaction.Transaction.stage_copies>`)."""
        if not out.stage:
            raise ValueError(f"{self.name}: {out.target} has no stage: it cannot be sent in a transaction")
        self.layout.ensure_dir(self.transport, out.stage)
        self.transport.put(out.stage, _stream(body))

    def expose(self, out: Outbound, *, staged: bool, body: Callable[[], BinaryIO] | None) -> str:
        """From a complete staged file (or, unstaged, from ``body``) to target and final names.

        ``staged``: the stage file is known to hold the whole message.  Idempotent: after a crash
        or a lost reply, a step whose source is gone had happened already.
        """
        t, layout = self.transport, self.layout
        if out.stage:
            if staged:
                self._protect(out)
                layout.ensure_dir(t, out.target)
                rename_resolving(t, out.stage, out.target)
        elif body is not None:
            self._protect(out)
            layout.ensure_dir(t, out.target)
            t.put(out.target, body())
        if out.final:
            layout.ensure_dir(t, out.final)
            try:
                rename_resolving(t, out.target, out.final)
            except SourceGone:
                if not t.exists(out.final):
                    log.warning("%s: %s was gone before its post_send rename to %s (taken already?)",
                                self.name, out.target, out.final)
        return out.where

    def _protect(self, out: Outbound) -> None:
        """Move (or copy) an existing target aside before a new file takes its name."""
        if not out.protect:
            return
        t = self.transport
        self.layout.ensure_dir(t, out.protect)
        if not out.protect_copy:
            try:
                rename_resolving(t, out.target, out.protect)
            except SourceGone:
                pass  # no existing target: nothing to protect
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            try:
                t.get(out.target, spool)  # type: ignore[arg-type]
            except NotFound:
                return
            spool.seek(0)
            t.put(out.protect, spool)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ claiming and reading

    def claim(self, picks: Sequence[Candidate], role: str) -> tuple[list[Claimed], int]:
        """Claim ``picks`` from the box; return (claimed, races lost).

        One journal record batch covers the whole poll, written before any rename so recovery
        can return every claim.  It is not fsynced: claims carry this node's id in their names,
        so after a machine crash recovery finds them by listing the select directory
        (recovery.recover_orphans); a killed process leaves the records in the page cache.
        A layout that reads in place (no select directory) claims nothing: the poll lock is
        what keeps other nodes off those files, and the caller handles them while holding it.

        One message per id at a time: a pick whose id (where ids are unique) is another
        message's, under another name (``req.<U>;p=9`` beside ``req.<U>``), is a duplicate when
        that other message is earlier in this batch, claimed by this node and not settled yet,
        or one of the last REMEMBERED_IDS this node settled.  It is claimed under a journal
        operation of its own, with :attr:`Claimed.duplicate` saying why, and
        :meth:`read_claim` files it unread and unanswered (:meth:`file_duplicate`).  The same
        message come back (its name differs only in its delivery count or expiration: another
        node returned this node's claim, a dead letter was replayed) is no duplicate; it gets an
        operation of its own if this node still holds its first claim.  Not
        guaranteed: a duplicate another node claims, or one arriving after this node forgot
        the first (a restart, REMEMBERED_IDS later), is served as a message of its own.
        """
        if not picks:
            return [], 0
        layout = self.layout
        plan: list[tuple[Candidate, str, str, str, str | None]] = []
        batch: dict[str, str] = {}
        for c in picks:
            op = self._op_id(c, role)
            duplicate = self._duplicate(c, batch) if layout.unique_ids else None
            if duplicate is not None or self.journal.is_pending(op):
                op = op_id_for(None, role)  # never two messages in one operation
            plan.append((c, op, layout.box_path(c.name), layout.claim_path(c.name, self.node_id), duplicate))
        self.journal.record_many([(op, "claim", {"src": src, "dst": dst}) for _, op, src, dst, _ in plan],
                                 durable=False)
        serving = role != "collect"
        crash_point("claim.after-intent" if serving else "collect.after-intent")
        if layout.unique_ids:
            self._note_in_hand([(c, op) for c, op, _, _, duplicate in plan if duplicate is None])
        if layout.select is None:
            return [Claimed(c, src, op, duplicate) for c, op, src, _, duplicate in plan], 0
        won: list[Claimed] = []
        lost = 0
        failed: TransportError | None = None
        # All renames at once (FTP: one round trip for the batch); each has its own outcome.
        outcomes = self.transport.rename_each([(src, dst) for _, _, src, dst, _ in plan])
        for (c, op, _, dst, duplicate), outcome in zip(plan, outcomes, strict=True):
            if isinstance(outcome, OutcomeUnknown) and self._claimed_after_all(dst):
                outcome = None  # it happened, or may have: the worker's read decides
            if outcome is not None:  # not renamed
                self.journal.end(op)
                if isinstance(outcome, SourceGone | OutcomeUnknown):
                    lost += 1  # taken by another node (or returned) meanwhile
                elif failed is None:
                    failed = outcome
                continue
            crash_point("claim.after-rename" if serving else "collect.after-claim")
            won.append(Claimed(c, dst, op, duplicate))
        if failed is not None:
            if not won:
                raise failed  # the poll failed: its caller logs it and backs off
            log.warning("%s: claimed %d, one or more others failed: %s", self.name, len(won), failed)
        return won, lost

    def _duplicate(self, c: Candidate, batch: dict[str, str]) -> str | None:
        """Why ``c`` is a duplicate (see :meth:`claim`), or None; ``batch`` holds the ids of
        the messages claimed before it in the same batch (``c``'s is added unless it is one)."""
        uid = c.uuid
        other = batch.get(uid)
        why = None
        if other is not None:
            why = f"{other} has the same id and is claimed with it"
        else:
            held = self._in_hand.get(uid)
            if held is not None and self.journal.is_pending(held[0]):
                if not self._same_message(held[1], c):
                    why = f"{held[1]} has the same id and is being served"
            else:
                settled = self._settled.get(uid)
                if settled is not None and not self._same_message(settled, c):
                    why = f"{settled} had the same id and was settled"
        if why is None:
            batch[uid] = c.name
            return None
        return f"{DUPLICATE_REASON} {uid}: {why} by node {self.node_id}; filed unread, no reply sent"

    def _same_message(self, name: str, c: Candidate) -> bool:
        """Whether file ``name`` and ``c`` are one message: their names differ at most in what
        ftpbc itself changes, the delivery count (one came back to the box while this node held
        the other) and the expiration (``ftpbc dlq replay`` drops it)."""
        if name == c.name:
            return True
        other = self.layout.decode_name(name)
        return other is not None and self._identity(other) == self._identity(c)

    def _identity(self, c: Candidate) -> str:
        """``c``'s name less its delivery count and expiration (see :meth:`_same_message`)."""
        layout = self.layout
        if not isinstance(layout, AreaLayout):
            return c.name
        env = c.envelope
        try:
            return layout.name_for(env.replace(delivery_count=0, expiration=None).headers,
                                   dict(env.properties), env.base if layout.codec.name == "ftpbc" else "")
        except (FtpbcError, ValueError):
            return c.name

    def _note_in_hand(self, claims: Sequence[tuple[Candidate, str]]) -> None:
        """Remember which operation holds each id (for :meth:`_duplicate`); bounded: past
        REMEMBERED_IDS, the entries whose operation ended are dropped."""
        with self._lock:
            if len(self._in_hand) + len(claims) > REMEMBERED_IDS:
                for uid in [u for u, (op, _) in self._in_hand.items() if not self.journal.is_pending(op)]:
                    del self._in_hand[uid]
                if len(self._in_hand) + len(claims) > REMEMBERED_IDS:
                    self._in_hand.clear()
            for c, op in claims:
                self._in_hand[c.uuid] = (op, c.name)

    def _note_settled(self, op_id: str, name: str) -> None:
        """Remember that the message ``name`` was settled by operation ``op_id``, when that
        operation is named after its message's id (a duplicate's own operation is not)."""
        if not self.layout.unique_ids:
            return
        uid = _message_id(op_id)
        if uid not in name:
            return
        with self._lock:
            if len(self._settled) >= REMEMBERED_IDS:
                for old in list(self._settled)[:REMEMBERED_IDS // 2]:
                    del self._settled[old]
            self._settled[uid] = name

    def _claimed_after_all(self, dst: str) -> bool:
        """After a claim rename whose reply was lost: whether ``dst`` (the claim) may exist.
        True when it does, and when the server cannot say (the connection is down again): the
        claim is then handed to a worker, whose read finds it or finds it gone and ends its
        operation, rather than left claimed and journaled with nobody to serve it."""
        try:
            return self.transport.exists(dst)
        except TransportError:
            return True

    def _op_id(self, c: Candidate, role: str) -> str:
        """The message id plus its role where ids are unique tokens (an endpoint's UUIDs), a
        fresh UUID otherwise (a partner's file names may repeat or hold spaces)."""
        uid = c.uuid
        if self.layout.unique_ids and _TOKEN.fullmatch(uid):
            return f"{uid}.{role}"
        return op_id_for(None, role)

    def read(self, claimed: Claimed, sink: BinaryIO) -> int:
        """Read a claimed file into ``sink``; return its size.

        NotFound means the claim vanished (another node returned it); a file that is there but
        cannot be read raises PermissionDenied.  Raises IncompleteRead when the byte count
        differs from the listed size (unless it is ``UNKNOWN_SIZE``): files are complete when
        they become candidates and never change there, so a short read is a transfer fault
        even if the server said it succeeded, and a handler must not see half a message.
        """
        t = self.transport
        limit = self.max_message_bytes
        if claimed.size > limit:
            raise MessageTooLarge(f"{t.server} {claimed.path}", claimed.size, limit)
        bound = limit if claimed.size == UNKNOWN_SIZE else claimed.size + READ_MARGIN
        listed = "no size" if claimed.size == UNKNOWN_SIZE else f"{claimed.size} bytes"
        try:
            got = t.get(claimed.path, BoundedSink(sink, bound, server=t.server, path=claimed.path,
                                                  listed=listed).as_binary())
        except UnsafeEntry:
            raise
        except NotFound:
            # Some servers answer 550 "Failed to open file" for a file they cannot read (a
            # partner's 0600 upload): if the claim is still there, the file is the problem.
            if t.exists(claimed.path):
                raise PermissionDenied("the server will not let this node read it", server=t.server,
                                       path=claimed.path) from None
            raise
        if claimed.size != UNKNOWN_SIZE and got != claimed.size:
            raise IncompleteRead(f"read {got} bytes of a file listed with {claimed.size}",
                                 server=self.transport.server, path=claimed.path)
        return got

    def unclaim(self, claimed: Claimed) -> None:
        """Put a claimed file back in its box unchanged (a dropped connection, a shutdown)."""
        if claimed.path != self.layout.box_path(claimed.name):
            try:
                self.transport.rename(claimed.path, self.layout.box_path(claimed.name))
            except SourceGone:
                pass
        self.journal.end(claimed.op_id)

    def rename_back(self, claimed: Claimed) -> None:
        """Put a claimed file back in its box without touching the journal (which failed)."""
        if claimed.path != self.layout.box_path(claimed.name):
            try:
                self.transport.rename(claimed.path, self.layout.box_path(claimed.name))
            except SourceGone:
                pass

    def read_claim(self, claimed: Claimed, sink: BinaryIO, *, retry: Retry = run_once,
                   stop: threading.Event | None = None) -> int | Unread:
        """Read a claim into ``sink`` and return its size; or, if it cannot be read, settle it
        and say how (:class:`Unread`).  The one read-failure policy of every reader (providers,
        routes, fan-outs, receivers, response pollers):

        * not a file this node may open (a link swapped in): filed as it is, unopened;
        * larger than ``max_message_bytes``: filed unread;
        * gone (NotFound): another node returned the claim; the operation ends here;
        * read and found unusable (:data:`POISON_ERRORS`): a delivery (:meth:`redeliver`);
        * any other failure says nothing about the message (a dropped or dying session, a
          timeout, a refused connection): with ``stop`` given, the read is tried again on a
          fresh session, with backoff, for up to READ_RETRY_FOR seconds (or until ``stop`` is
          set); then the claim goes back unchanged.  Never a delivery.

        ``retry`` runs each settling step (a filing, a return) until it succeeds; with the
        default, a step's TransportError reaches the caller, and the journal still holds the
        claim for recovery.  ``sink`` is rewound before each new attempt.

        A duplicate (:attr:`Claimed.duplicate`) is not read: it is filed (:meth:`file_duplicate`).
        """
        if claimed.duplicate is not None:
            return Unread(DuplicateMessage(claimed.duplicate), self.file_duplicate(claimed, retry=retry))
        give_up = time.monotonic() + READ_RETRY_FOR
        pause = READ_RETRY_FIRST
        while True:
            try:
                return self.read(claimed, sink)
            except NotFound as exc:  # UnsafeEntry (one of them) included: _unread tells
                return self._unread(claimed, exc, retry)
            except MessageTooLarge as exc:
                return self._unread(claimed, exc, retry)
            except TransportError as exc:
                passing = not isinstance(exc, POISON_ERRORS) and stop is not None and not stop.is_set()
                if not passing or time.monotonic() >= give_up:
                    return self._unread(claimed, exc, retry)
                log.info("%s: reading %s failed (%s); trying again in %.2f s", self.name, claimed.name, exc,
                         pause)
                assert stop is not None
                if stop.wait(pause):
                    continue  # stopping: the next failure settles the claim
                pause = min(pause * 2, READ_RETRY_MAX)
                sink.seek(0)
                sink.truncate()

    def _unread(self, claimed: Claimed, exc: FtpbcError, retry: Retry) -> Unread:
        """Settle a claim whose read failed for good with ``exc`` (see :meth:`read_claim`)."""
        step: Callable[[], Disposition]
        if isinstance(exc, UnsafeEntry):
            step = functools.partial(self.file_error, claimed, _why(exc), refused=True, retry=retry)
        elif isinstance(exc, MessageTooLarge):
            step = functools.partial(self.file_error, claimed, _why(exc), retry=retry)
        elif isinstance(exc, NotFound):
            self.journal.end(claimed.op_id)
            return Unread(exc, Disposition("lost: another node returned the claim", "lost"))
        else:
            assert isinstance(exc, TransportError)
            step = functools.partial(self.read_failed, claimed, exc, retry=retry)
        # Called once, not under ``retry``: each step repeats only its own remote parts, so a
        # filing is recorded once however often its finish is tried.
        return Unread(exc, step())

    def read_failed(self, claimed: Claimed, exc: TransportError, *, retry: Retry = run_once) -> Disposition:
        """Settle a claim whose handling failed with ``exc`` before anything was recorded: a
        delivery (:meth:`redeliver`) when ``exc`` is the message's fault (:data:`POISON_ERRORS`),
        else back to its box unchanged.  Returns what was done (for the log line)."""
        if isinstance(exc, POISON_ERRORS):
            return self.redeliver(claimed, _why(exc), retry=retry)
        def unclaim() -> bool:
            self.unclaim(claimed)
            return True

        if retry(unclaim) is None:
            return UNFINISHED
        return Disposition("returned unchanged (connection fault)", "returned")

    def redeliver(self, claimed: Claimed, reason: str, *, retry: Retry = run_once) -> Disposition:
        """Give a message back with its delivery count raised, or file it as an error once it
        has had ``max_deliveries``.  Returns what was done.  The count is decided once; only
        the remote steps are repeated by ``retry``."""
        layout = self.layout
        in_place = claimed.path == layout.box_path(claimed.name)
        with self._lock:
            count = max(claimed.candidate.envelope.headers.delivery_count,
                        self._local_deliveries.get(claimed.name, 0)) + 1
        if count >= self.max_deliveries:
            with self._lock:
                self._local_deliveries.pop(claimed.name, None)
            return self.file_error(claimed, f"delivery {count} of {self.max_deliveries} failed: {reason}",
                                   dead=self.policy.dead_letter, retry=retry)
        name = claimed.name if in_place else layout.with_delivery_count(claimed.candidate, count)
        if name == claimed.name:
            # The name cannot carry the count (read in place, a response, a foreign name): this
            # node keeps it, so the file still ends in the error directory, if later.
            with self._lock:
                if len(self._local_deliveries) >= MAX_HELD:
                    self._local_deliveries.clear()
                self._local_deliveries[name] = count
        if not in_place and retry(lambda: self._rename_back(claimed.path, layout.box_path(name))) is None:
            return UNFINISHED
        self.journal.end(claimed.op_id)
        delay = self.redelivery_delay * (2 ** (count - 1))
        with self._lock:
            if len(self._held) >= MAX_HELD:
                self._held.clear()
            self._held[name] = time.monotonic() + delay
        return Disposition(f"returned as delivery {count} of {self.max_deliveries}, held for "
                           f"{delay:g} s by every node", "returned")

    def _rename_back(self, src: str, dst: str) -> bool:
        """Rename a claim back into its box; a source already gone (a retry whose first rename
        happened, or a sweeper that returned it) is done too."""
        try:
            rename_resolving(self.transport, src, dst)
        except SourceGone:
            pass
        return True

    def file_error(self, claimed: Claimed, reason: str, *, dead: bool = False,
                   refused: bool = False, retry: Retry = run_once) -> Disposition:
        """File a claimed message in the error directory (``dead``: the dead letters, if the
        layout has them) with ``reason`` beside it; a request's caller gets an error reply
        carrying the reason at once.  ``refused``: the claim is no longer a file this node may
        open (a link swapped in after it was claimed): moved as it is, unopened.

        Recorded durably first (a ``served`` operation whose result is the error reply), then
        finished by :meth:`finish_served` under ``retry``: a filing interrupted anywhere
        completes on its next attempt or in recovery, reason file and reply included."""
        dead = dead and bool(self.layout.dead_dir)
        directory = self.layout.dead_dir if dead and self.layout.dead_dir else self.layout.error
        target = self.layout.filed_path(directory, claimed.name, self.node_id, self.clock())
        fields = self.record_served(claimed, None, error=reason, commit=Commit(target), unopened=refused)
        attempts = iter(range(1 << 30))
        done = retry(lambda: self.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if done is None:
            return UNFINISHED
        if not done:
            return Disposition("gone before it could be filed as an error", "gone")
        return Disposition(f"filed in {directory} ({reason})", "dead" if dead else "error")

    def file_duplicate(self, claimed: Claimed, *, retry: Retry = run_once) -> Disposition:
        """File a duplicate (:attr:`Claimed.duplicate`) in the error directory, unread, with its
        reason beside it, and answer nobody: the caller waiting on that id waits for the other
        message's reply, and an error reply would be a second one.  Recorded and finished as
        :meth:`file_error` is."""
        fields = self.record_duplicate(claimed)
        attempts = iter(range(1 << 30))
        done = retry(lambda: self.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if done is None:
            return UNFINISHED
        if not done:
            return Disposition("gone before it could be filed as a duplicate", "gone")
        return Disposition(f"filed in {self.layout.error} ({claimed.duplicate})", "duplicate")

    def record_duplicate(self, claimed: Claimed) -> dict[str, str]:
        """Durably record the filing of a duplicate (no reply); the fields
        :meth:`finish_served` needs."""
        assert claimed.duplicate is not None
        target = self.layout.filed_path(self.layout.error, claimed.name, self.node_id, self.clock())
        return self.record_served(claimed, None, error=None, commit=Commit(target), reason=claimed.duplicate)

    # ------------------------------------------------------------------ dead letters

    def replay(self, src: str, name: str, *, op_id: str) -> str:
        """Put a filed message (a dead letter at ``src``) back in the box as ``name``; return
        where it went.

        Journaled (durably) before the rename, and :meth:`finish_replay` is what recovery runs:
        killed at any point, the message ends up in the box exactly once, never in both places
        and never in neither (the rename is atomic, and finishing it again is idempotent).
        Refused (FileExistsError) when a message of that name is waiting already.
        """
        dst = self.layout.box_path(name)
        if self.transport.exists(dst):
            raise FileExistsError(f"{dst} exists: a message of that name is waiting already")
        fields = {"src": src, "dst": dst, "reason": src + REASON_SUFFIX}
        self.journal.record(op_id, "replay", durable=True, **fields)
        crash_point("replay.after-intent")
        self.finish_replay(op_id, fields)
        return dst

    def finish_replay(self, op_id: str, fields: dict[str, str]) -> str:
        """Carry a ``replay`` operation to its end (rename, then the reason file); idempotent."""
        t = self.transport
        try:
            rename_resolving(t, fields["src"], fields["dst"])
            outcome = f"returned to {self.layout.box}"
        except SourceGone:
            outcome = "had been returned already"
        crash_point("replay.after-rename")
        try:
            t.delete(fields["reason"])
        except NotFound:
            pass
        self.journal.end(op_id)
        return outcome

    # ------------------------------------------------------------------ serving

    def record_served(self, claimed: Claimed, result: bytes | None, *, error: str | None,
                      commit: Commit | None = None, reply_type: str | None = None,
                      unopened: bool = False, adopted: str | None = None,
                      reason: str | None = None) -> dict[str, str]:
        """Durably record the handler's outcome and every name still to use; return the fields
        :meth:`finish_served` needs.  :meth:`write_served` then :meth:`served_durable`.

        ``error`` is the handler's failure reason (the message goes to the error directory; a
        requester gets an error reply).  ``result`` None means nothing to send.  Once this
        returns the handler must never run again for this message: recovery sends the result.
        ``commit`` overrides where the message goes, ``reply_type`` the type of the error reply.
        ``reason`` (with no ``result`` nor ``error``): filed with that reason beside it and no
        reply at all (a duplicate).
        A result for a request whose reply_to cannot be reached (:meth:`Layout.reply_refusal`)
        is recorded as a failure with that reason: filed as an error, the error reply in the
        request's own outbox.
        """
        return self.served_durable(self.write_served(claimed, result, error=error, commit=commit,
                                                     reply_type=reply_type, unopened=unopened,
                                                     adopted=adopted, reason=reason))

    def write_served(self, claimed: Claimed, result: bytes | None, *, error: str | None,
                     commit: Commit | None = None, reply_type: str | None = None,
                     unopened: bool = False, adopted: str | None = None,
                     reason: str | None = None) -> Served:
        """The first half of :meth:`record_served`: the ``served`` record written (a large
        result's side file fsynced), the record itself not yet known to be on disk.

        Until :meth:`served_durable` of what this returns has returned, the caller must change
        nothing on the server for this message (no stage, no commit): a power loss before then
        may lose the record, and recovery then returns the claim, as if the handler had not run.
        A killed process loses nothing (the page cache outlives it).  The gap lets a worker
        give its handler slot to the next message while the fsync runs, and lets one fsync cover
        the records of every worker that wrote meanwhile (wider group commit).
        """
        layout = self.layout
        when = self.clock()
        if error is None and result is not None:
            # A reply_to this node cannot reach: the caller hears why, from its own outbox.
            refused = layout.reply_refusal(claimed.candidate)
            if refused is not None:
                error, result = refused, None
        commit = commit or layout.commit(claimed.candidate, self.node_id, when, error=error is not None)
        fields = {"claim": claimed.path, "commit": commit.path, "request": claimed.name}
        marker = layout.marker_of(claimed.candidate)
        if marker is not None:
            fields["marker"] = layout.box_path(marker)  # removed once the file is settled
        if commit.cleanup:
            fields["cleanup"] = "1"
        if unopened:
            fields["unopened"] = "1"  # committed by move_refused: never opened nor followed
        body = error.encode("utf-8") if error is not None else (result or b"")
        reply = (layout.reply(claimed.candidate, self.node_id, when, claimed.op_id, error=error is not None,
                              type=reply_type, size=len(body))
                 if result is not None or error is not None else None)
        if reply is not None:
            fields.update(reply.fields())
            fields.update(self.journal.save_result(claimed.op_id, body))
        if adopted is not None:
            fields["adopted"] = adopted  # another node's staged reply, removed once this is done
        if error is not None or reason is not None:
            fields["reason"] = error if error is not None else reason or ""
        seq = self.journal.record_many([(claimed.op_id, "served", fields)], durable=False)
        return Served(claimed, fields, seq)

    def served_durable(self, served: Served) -> dict[str, str]:
        """Wait until ``served``'s record is on disk (fsync, shared with every record written
        before it began); return the fields :meth:`finish_served` needs.  From here on the
        handler must never run again for this message."""
        self.journal.wait_durable(served.seq)
        crash_point("serve.after-result")
        return served.fields

    def finish_served(self, op_id: str, fields: dict[str, str], *, fresh: bool = False) -> bool:
        """Carry a ``served`` operation to its end; idempotent, so recovery calls it too.

        ``fresh`` says the caller has just recorded the result and nothing since touched the
        server, so the claim is known to be there and no reply staged: the ``stat`` round trips
        that recovery needs are skipped on the hot path.  Returns False when this node had lost
        the claim (another node serves the message).
        """
        t = self.transport
        f = _current_fields(fields)
        claim, commit = f["claim"], f.get("commit", "")
        out = Outbound.from_fields(f)
        stage = out.stage if out is not None else None
        staged = False if fresh else stage is not None and t.exists(stage)
        if fresh or t.exists(claim):
            if out is not None and stage is not None:
                # Uploaded again even when found staged: a node killed mid-upload leaves a torn
                # file there, and only the commit below proves an upload was complete.
                self.layout.ensure_dir(t, stage)
                t.put(stage, io.BytesIO(self.journal.load_result(f)))
                staged = True
                crash_point("serve.after-stage")
            if not self._commit(claim, commit, unopened=bool(f.get("unopened"))):
                return self._lost(op_id, stage if staged else None)
            crash_point("serve.after-commit")
            if log.isEnabledFor(logging.DEBUG):  # no message id to cut out when nobody reads it
                log.debug("%s: committed %s to %s", self.name, f.get("request", claim), commit or "(deleted)",
                          extra={"message_id": _message_id(op_id)})
            if self.filed_dead(commit):
                # Counted where the rename happened, whoever runs this (a worker, the sweeper's
                # expiry, recovery): an expired message with ``expired: dead_letter``.
                self.observer.dead_lettered()
        elif commit and not f.get("cleanup") and not t.exists(commit):
            # Not claimed, not committed: our claim was returned while we looked dead.  Never
            # expose then.  (With cleanup, a missing commit means everything finished already.)
            # The result is staged whole all the same, so that whichever node serves the request
            # next delivers it rather than running the handler again.
            if stage is not None and not staged:
                staged = self._stage_for_adoption(stage, f)
            return self._lost(op_id, stage if staged else None)
        if "reason" in f and commit:
            reason_path = commit + REASON_SUFFIX
            if not t.exists(reason_path):
                t.put(reason_path, io.BytesIO(f["reason"].encode("utf-8") + b"\n"))
        if f.get("marker"):
            self._consume_marker(f["marker"])
        if out is not None:
            self.expose(out, staged=staged, body=lambda: io.BytesIO(self.journal.load_result(f)))
            crash_point("serve.after-expose")
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: reply to %s out as %s", self.name, f.get("request", claim), out.target,
                          extra={"message_id": _message_id(op_id)})
        if f.get("cleanup") and commit:
            try:
                t.delete(commit)
            except NotFound:
                pass
        if f.get("adopted"):
            try:
                t.delete(f["adopted"])
            except NotFound:
                pass
        if "request" in f:
            self._note_settled(op_id, f["request"])
        self.journal.end(op_id)
        return True

    def _consume_marker(self, marker: str) -> None:
        """Remove a settled file's completion marker: after the commit, so that a crash between
        the two leaves a marker without a file (never received twice), which recovery's run
        of :meth:`finish_served` removes.  One this node may not remove is left and logged:
        failing the finish for it would hold the file's result back for good."""
        try:
            self.transport.delete(marker)
        except NotFound:
            pass  # removed by an earlier attempt (or by the partner)
        except PermissionDenied as exc:
            log.warning("%s: %s: cannot remove the completion marker; a new file of the same name "
                        "will be received as soon as it is listed: %s", self.name, marker, exc)

    def filed_dead(self, path: str) -> bool:
        """Whether ``path`` is in this layout's dead-letter directory."""
        dead = self.layout.dead_dir
        return bool(dead) and dead is not None and path.startswith(dead.rstrip("/") + "/")

    def _commit(self, claim: str, commit: str, *, unopened: bool = False) -> bool:
        """Rename the claim to its commit place (or delete it in place); False if it was lost.
        ``unopened``: the claim is not a regular file (moved as it is, never followed)."""
        t = self.transport
        try:
            if commit:
                self.layout.ensure_dir(t, commit)
                if unopened:
                    t.move_refused(claim, commit)
                else:
                    t.rename(claim, commit)
            else:
                t.delete(claim)
        except NotFound:  # SourceGone included
            return False
        except OutcomeUnknown:
            # The reply was lost (say, the server restarted): decide from what is there now.
            if commit and t.exists(commit):
                return True
            if t.exists(claim):
                raise  # it did not happen: the caller retries this whole step
            return not commit  # deleted in place: gone is done
        return True

    def _stage_for_adoption(self, stage: str, fields: dict[str, str]) -> bool:
        """Put a recorded reply at its stage name when that name declares its size (else
        nothing: no other node could tell it complete); True if it is there now."""
        if split_stage(stage.rsplit("/", 1)[-1])[2] is None:
            return False
        t = self.transport
        try:
            self.layout.ensure_dir(t, stage)
            t.put(stage, io.BytesIO(self.journal.load_result(fields)))
        except TransportError as exc:
            log.warning("%s: %s: could not stage the recorded reply for another node: %s", self.name, stage,
                        exc)
            return False
        return True

    def _lost(self, op_id: str, staged_reply: str | None) -> bool:
        """The claim went to another node before this one committed: never expose.  A staged
        reply whose name carries its size is complete (it was put in full before the commit was
        tried) and stays for the node that serves the request now, which delivers it instead of
        running the handler again (:meth:`adopt`); any other staged reply is removed."""
        if staged_reply and split_stage(staged_reply.rsplit("/", 1)[-1])[2] is not None:
            log.warning("%s: %s: claim lost to another node before commit; the reply stays staged "
                        "for whichever node serves the request now", self.name, op_id)
        else:
            if staged_reply:
                try:
                    self.transport.delete(staged_reply)
                except NotFound:
                    pass
            log.warning("%s: %s: claim lost to another node before commit; reply withheld", self.name, op_id)
        self.journal.end(op_id)
        return False

    # ------------------------------------------------------------------ adopting a staged reply

    def adopt(self, claimed: Claimed) -> dict[str, str] | None:
        """If a complete reply to ``claimed`` is staged on the server (by a node whose claim on
        it went back: it looked dead, or was stopped or cut off after staging), record it as this
        node's result, durably, and return the fields :meth:`finish_served` needs: the handler
        must not run.  None when there is none, or none provably complete (a staged reply is
        complete when its size is the one its name declares), and the handler may run.

        Only requests that came back (a delivery count above zero) can have one, so only those
        cost the listing of the stage directory."""
        c = claimed.candidate
        if (c.envelope.headers.delivery_count <= 0 or c.envelope.headers.kind != "request"
                or not isinstance(self.layout, AreaLayout) or claimed.duplicate is not None):
            return None  # (a transfer's reply name may draw a sequence number: never asked here)
        when = self.clock()
        variants: dict[str, tuple[bool, str | None]] = {}
        stage_dir = None
        for error, rtype in ((False, None), (True, None), (True, EXPIRED_TYPE)):
            out = self.layout.reply(c, self.node_id, when, claimed.op_id, error=error, type=rtype)
            if out is None or out.stage is None:
                return None
            variants[out.target.rsplit("/", 1)[-1]] = (error, rtype)
            stage_dir = out.stage.rsplit("/", 1)[0]
        assert stage_dir is not None
        t = self.transport
        try:
            entries = t.list(stage_dir)
        except NotFound:
            return None
        for e in entries:
            name, owner, size = split_stage(e.name)
            if owner is None or size is None or name not in variants or e.size != size or e.is_dir:
                continue
            path = f"{stage_dir}/{e.name}"
            buf = io.BytesIO()
            try:
                got = t.get(path, BoundedSink(buf, size + READ_MARGIN, server=t.server, path=path,
                                              listed=f"{size} bytes").as_binary())
            except NotFound:
                continue  # removed meanwhile: not there to adopt
            if got != size:
                continue
            error, rtype = variants[name]
            body = buf.getvalue()
            log.warning("%s: %s: its reply, staged by node %s, is delivered; the handler does not run "
                        "again", self.name, claimed.name, owner)
            if error:
                return self.record_served(claimed, None, error=body.decode("utf-8", "replace"),
                                          reply_type=rtype, adopted=path)
            return self.record_served(claimed, body, error=None, adopted=path)
        return None

    # ------------------------------------------------------------------ collecting

    def claim_from_journal(self, op: Operation) -> Claimed:
        """The claim a pending ``claim`` operation made (for reclaim and recovery)."""
        name = op.fields["src"].rsplit("/", 1)[-1]
        cand = self.layout.decode_name(name) or Candidate(name, UNKNOWN_SIZE, None, _plain(name))
        return Claimed(cand, op.fields["dst"], op.op_id)

    def mark_delivered(self, claimed: Claimed) -> None:
        """Note that a response was handed to its caller but is not archived yet; from now on
        reclaim and recovery archive it rather than return it to the outbox.  Not fsynced:
        after a machine crash the response goes back to the outbox and a later collect delivers
        it again (at least once)."""
        self.journal.record(claimed.op_id, "delivered")

    def finish_collect(self, claimed: Claimed) -> None:
        """Archive (or delete) a message that has been read and handed over; end its operation."""
        commit = self.layout.commit(claimed.candidate, self.node_id, self.clock(), error=False)
        t = self.transport
        try:
            if commit.cleanup or not commit.path:
                t.delete(claimed.path)
            else:
                t.rename(claimed.path, commit.path)
        except NotFound:
            pass
        crash_point("collect.after-archive")
        self._note_settled(claimed.op_id, claimed.name)
        self.journal.end(claimed.op_id)


def _message_id(op_id: str) -> str:
    """The message id of a journal operation id (``<uuid>.<role>``)."""
    return op_id.rsplit(".", 1)[0]


def _current_fields(f: dict[str, str]) -> dict[str, str]:
    """Fields of a ``served`` record, also as the previous release wrote them (an upgrade must
    finish what the old version left in its journal)."""
    if "commit" in f:
        return f
    g = dict(f)
    if "archived" in g:  # endpoint: archived, resp_stage, resp_target
        g["commit"] = g.pop("archived")
        if "resp_target" in g:
            g["target"] = g.pop("resp_target")
            g["stage"] = g.pop("resp_stage", "")
    elif "commit_to" in g:  # transfer: commit_to, target, stage, protect, final
        g["commit"] = g.pop("commit_to")
    return g


def _fileable(name: str, reserve: int) -> str:
    """A name a refused entry can be filed under: ``name`` with what no name of ours may hold
    replaced by ``_``, cut so that ``<name>~<node>~<stamp>.reason`` fits the name limit."""
    safe = _NOT_IN_NAME.sub("_", name)
    if safe in ("", ".", ".."):
        safe = "_"
    limit = max(NAME_LIMIT - reserve - len(REASON_SUFFIX), 1)
    while len(safe.encode("utf-8", "surrogateescape" if _escaped(safe) else "replace")) > limit:
        safe = safe[:-1]
    return safe


def _escaped(text: str) -> bool:
    """Whether ``text`` encodes with surrogateescape (as names read from a local directory do)."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _plain(name: str) -> Envelope:
    return Envelope(Headers(id=name), {}, name)


__all__ = ["DUPLICATE_REASON", "UNKNOWN_SIZE", "Claimed", "Commit", "Disposition", "Lifecycle", "Outbound",
           "Served", "op_id_for", "rename_resolving"]


def _why(exc: Exception) -> str:
    """A failure as a reason line: its type and text."""
    return f"{type(exc).__name__}: {exc}"
