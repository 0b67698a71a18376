"""A provider: the inbound poller and worker pool of one endpoint or transfer on one node.

The poller takes the poll lock (T_LOCK + F_LOCK), lists the inbox, claims the oldest matching
files (no more than it has idle workers for, so one node never hoards work that another could
serve), releases the lock and hands the claims to its workers.  A poll that found work is
followed at once by the next one (once half the workers are free); empty polls
then back off from 2 ms to ``poll_interval``, the wait of an endpoint that stays idle.

A worker reads the claimed file (spooled to disk past a few MiB), calls the handler, records the
result durably, then commits and replies (see :mod:`ftpbc.lifecycle`).  Once the result is written
to the journal its slot goes to the next claim: the record's fsync (shared with every record
written meanwhile) and the commit run on, on a thread of their own, and nothing is committed
before the record is on disk; handlers never run more than ``workers`` at once.  A handler that raises
sends the request to ``inerror`` with the reason beside it and the caller gets an error reply at
once.  Remote failures after the result is recorded are retried with backoff until they succeed
or the node stops, in which case recovery finishes the job on the next start.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from ftpbc.cluster.liveness import Liveness, LoopGuard
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.errors import TransportError
from ftpbc.exchange.backlog import RELIST_COST_FACTOR as RELIST_COST_FACTOR
from ftpbc.exchange.backlog import BoxLister
from ftpbc.exchange.layout import KEY_PREFIX as TRANSFER_KEY_PREFIX
from ftpbc.exchange.layout import Candidate
from ftpbc.exchange.lifecycle import SPOOL_IN_MEMORY, Claimed, Lifecycle, Unread
from ftpbc.exchange.message import Message, result_bytes
from ftpbc.faults import fail_point
from ftpbc.metrics import NULL_OBSERVER, EndpointObserver
from ftpbc.node.failure import DEFAULT_ERROR_REPLY, failure_reason
from ftpbc.node.inflight import InFlight
from ftpbc.node.workers import Workers

log = logging.getLogger("ftpbc.provider")

Handler = Callable[[Message], object]
T = TypeVar("T")
LOCK_RETRY = 0.005
#: a claim batch is drawn from this many times its size of the oldest remembered files
CLAIM_WINDOW = 8
#: a poll gives up on a remembered backlog after this many attempts per claim it wanted
STALE_TRIES = 4
#: first wait after a poll that found work; grows by IDLE_GROWTH per empty poll up to poll_interval
FIRST_IDLE_WAIT = 0.002
#: gentle, not doubling: while requests keep coming every few milliseconds, the wait after an
#: empty poll stays near the gap between them instead of overshooting it by as much again; an
#: endpoint that goes idle still reaches poll_interval within a few dozen empty polls
IDLE_GROWTH = 1.25
#: seconds a handled item (waiting for its record's fsync and its commit) keeps its slot before
#: a poller waiting for one may take it: a fast disk's fsync and the commit are done well within
#: it, so no thread is added (see Poller._leave_slot); a slow disk's give their slots up
LEAVE_SLOT_AFTER = 0.02
#: how long a stopping node still tries to deliver results already recorded
FINISH_GRACE = 5.0
#: latencies a provider keeps (ProviderStats.latencies), the newest
LATENCY_SAMPLES = 10_000


@dataclass
class ProviderStats:
    served: int = 0
    failed: int = 0
    lost_races: int = 0
    lost_claims: int = 0
    polls: int = 0
    #: time.monotonic() of the last poll that did not fail (0.0: none yet)
    last_poll: float = 0.0
    #: seconds each of the last LATENCY_SAMPLES messages took, claim to commit (bounded: a node
    #: serving 1,000 messages a second for a day kept 86 million of them in a list)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)


class PollSettings(Protocol):
    """What a :class:`Poller` needs of its configuration (endpoints and transfers have it)."""

    @property
    def drain_timeout(self) -> float: ...

    @property
    def poll_interval(self) -> float: ...
    @property
    def max_per_poll(self) -> int: ...
    @property
    def workers(self) -> int: ...


class BoxSettings(PollSettings, Protocol):
    """What a :class:`Provider` needs besides: when its box counts as large."""

    @property
    def large_box(self) -> int: ...


class Poller:
    """The generic half of a provider: the poll loop, worker slots, retries and draining.

    A subclass implements :meth:`_poll_locked` (called under ``poll_lock``) and hands each item
    to :meth:`_dispatch`; endpoints (:class:`Provider`) and transfers share this loop.
    """

    #: free workers to wait for before claiming again while work keeps coming (None: half of
    #: them); a subclass whose items hold a worker for long claims for each one (1)
    refill_when_busy: int | None = None
    #: the lifecycle whose claims this poller serves (set by the subclass)
    lifecycle: Lifecycle

    def __init__(self, name: str, config: PollSettings, poll_lock: PollLock, *,
                 liveness: Liveness | None = None) -> None:
        self.name = name
        self.config = config
        self.poll_lock = poll_lock
        self.stats = ProviderStats()
        self._observer: EndpointObserver = NULL_OBSERVER
        self._stop = threading.Event()
        self._guard = LoopGuard(f"poller {name}", liveness, self._stop, first_wait=config.poll_interval,
                                logger=log)
        self._liveness = liveness
        #: the claims in workers' hands, and whether each is being handled or finished
        self.claims = InFlight(name)
        #: this node's lease (None: never fenced), and its term when the last poll began: a
        #: claim is served only while the lease has held since (see ftpbc.cluster.lease)
        self._lease = liveness.lease if liveness is not None else None
        self._term: int | None = 0
        # Twice the workers: ``workers`` threads handling messages, and up to as many more whose
        # message is handled and waits only for its record's fsync and its commit (see
        # _leave_slot); handlers never run more than ``workers`` at once.
        self._pool = Workers(config.workers * 2, f"ftpbc-{name}")
        self._thread: threading.Thread | None = None
        #: items claimed whose handling is not done (each holds a slot of _capacity)
        self._in_flight = 0
        #: of _in_flight, items handled that still hold their slot: job token -> since when
        #: (see _leave_slot)
        self._leavable: dict[object, float] = {}
        #: items handled whose slot the poller took: they wait for their fsync and commit on a
        #: thread of their own, outside _in_flight (job tokens)
        self._taken: set[object] = set()
        #: the poller waits for a free slot (see _free_slots)
        self._slot_wanted = False
        self._in_flight_cv = threading.Condition()
        #: per worker thread: its job's token (None outside a job)
        self._left = threading.local()
        # Claimed work a node may hold: one claim per worker, none queued behind a busy worker
        # while another node's workers are idle, and refilled only once half of it is free while
        # work keeps coming.  A listing still serves many claims: what it found is remembered as
        # the backlog (see Provider), so claiming less per poll costs polls, not listings.  (With
        # twice the workers, cheap polls let one node take every request of a few callers while
        # the other nodes idle.)
        self._capacity = config.workers
        self._refill_at = 1
        self._give_up_at = float("inf")

    @property
    def observer(self) -> EndpointObserver:
        """Where this poller reports its events (metrics: ftpbc.node.health attaches one)."""
        return self._observer

    @observer.setter
    def observer(self, observer: EndpointObserver) -> None:
        self._observer = observer
        self._observed(observer)

    def _observed(self, observer: EndpointObserver) -> None:
        """A new observer was attached (a subclass passes it on)."""

    def poll_once(self) -> int:
        """One poll: claimed count, 0 if nothing to do, -1 if another poller held the lock."""
        free = min(self._free_slots(), self.config.max_per_poll)
        if free <= 0 or self._stop.is_set():
            return 0
        if self._lease is not None:
            # Fenced (the lease may be over: other nodes may be taking this node's claims): claim
            # nothing.  An empty poll, so the poller still counts as making progress and the
            # heartbeat that ends the fence is not held up by it.
            self._term = self._lease.term()
            if self._term is None:
                return 0
        fail_point("poll-lock")
        with self.poll_lock.attempt() as held:
            if not held:
                return -1
            self.stats.add(polls=1)
            return self._poll_locked(free)

    def _poll_locked(self, free: int) -> int:
        """Under the poll lock: take up to ``free`` items and :meth:`_dispatch` them."""
        raise NotImplementedError

    def _claimed_count(self, claimed: int, lost: int) -> int:
        """What a poll reports: a poll that only lost races still found work (poll again soon)."""
        self.stats.add(lost_races=lost)
        return claimed if claimed else (1 if lost else 0)

    # ------------------------------------------------------------------ polling

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"poller-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # After a poll that found work, empty polls back off from FIRST_IDLE_WAIT up to
        # poll_interval instead of waiting a whole interval at once: a caller that sends its
        # next request as soon as it has the previous answer would otherwise wait a full
        # poll_interval every time.  An endpoint idle for long still lists once per poll_interval.
        idle_wait = self.config.poll_interval
        while not self._stop.is_set():
            found = self._guard.run(self.poll_once)  # never raises: logs, backs off, goes on
            if found is None:
                continue
            self.stats.last_poll = time.monotonic()
            if found > 0:
                idle_wait = min(FIRST_IDLE_WAIT, self.config.poll_interval)
                self._refill_at = self.refill_when_busy or max(1, self._capacity // 2)
                continue
            self._refill_at = 1
            if found < 0:
                self._stop.wait(LOCK_RETRY)
                continue
            self._stop.wait(idle_wait)
            idle_wait = min(idle_wait * IDLE_GROWTH, self.config.poll_interval)
        if self._liveness is not None:
            self._liveness.forget(self._guard.loop)

    @property
    def in_flight(self) -> int:
        """Items claimed and not finished yet (being handled, or handled and being committed)."""
        return self._in_flight + len(self._taken)

    def _free_slots(self) -> int:
        """How many items to claim now; waits until at least ``_refill_at`` are free."""
        with self._in_flight_cv:
            while self._capacity - self._in_flight < self._refill_at and not self._stop.is_set():
                wait = self._take_leavable()
                if wait == 0:
                    continue
                self._guard.progress()  # busy workers are not a stuck poller
                self._slot_wanted = True
                try:
                    self._in_flight_cv.wait(min(wait, 0.5))
                finally:
                    self._slot_wanted = False
            return self._capacity - self._in_flight

    def _take_leavable(self) -> float:
        """Under ``_in_flight_cv``: take the slots of items handled LEAVE_SLOT_AFTER ago or
        more (their jobs go on without them); 0 if any was taken, else how long until one can
        be (inf: none is leavable)."""
        if not self._leavable or len(self._taken) >= self._capacity:
            return math.inf
        now = time.monotonic()
        ripe = [token for token, since in self._leavable.items() if now - since >= LEAVE_SLOT_AFTER]
        if not ripe:
            return min(self._leavable.values()) + LEAVE_SLOT_AFTER - now
        for token in ripe[:self._capacity - len(self._taken)]:
            del self._leavable[token]
            self._taken.add(token)
            self._in_flight -= 1
        return 0

    def _dispatch(self, job: Callable[[], object], what: str) -> None:
        """Run ``job`` on a worker; it holds one of the slots :meth:`_free_slots` counts."""
        with self._in_flight_cv:
            self._in_flight += 1
        self._pool.submit(self._work, job, what, self._term)

    def _work(self, job: Callable[[], object], what: str, term: int | None = 0) -> None:
        token = self._left.token = object()
        self._left.term = term  # the lease's term the claim was made in
        try:
            job()
        except Exception:
            log.exception("%s: unexpected failure serving %s", self.name, what)
        finally:
            with self._in_flight_cv:
                if token in self._taken:
                    self._taken.discard(token)
                else:
                    self._leavable.pop(token, None)
                    self._in_flight -= 1
                self._wake()
            self._left.token = None

    def _wake(self) -> None:
        """Under ``_in_flight_cv``, after a count changed: wake its waiters if one can go on.

        The poller waits for ``_refill_at`` free slots; waking it for every finished message
        (twice per message, counting the slot it leaves before its commit) would mostly have it
        check and sleep again, a thread switch each time.  A stopping poller's drain is woken at every
        change.  No wake-up is lost: a waiter checks the counts, under the same lock, before it
        waits, and ``_refill_at`` changes only on the poller's own thread, before it waits.
        """
        if self._capacity - self._in_flight >= self._refill_at or self._stop.is_set():
            self._in_flight_cv.notify_all()

    def _leave_slot(self) -> None:
        """Called by a job, on its worker thread, once its handler is done and its result is
        written to the journal: only the record's fsync and the commit are left.  From then on
        its slot is the poller's for the asking once LEAVE_SLOT_AFTER has passed: a poller
        waiting for a free slot takes it (:meth:`_take_leavable`) and the job goes on on its
        own thread, so a slow fsync does not hold up the next claim (whose record joins the
        same fsync, or the one after it).  Handlers still run ``workers`` at most; at most
        ``workers`` items wait like this, so the pool's ``2 x workers`` threads always suffice
        and no claimed item ever queues.

        Not at once, nor unasked: a slot given up as soon as the record was written sends the
        next claim to another thread while this one commits, so a node answering a few callers
        runs up to twice as many threads as messages, all contending for the GIL, for commits
        that are short anyway.
        A no-op outside a dispatched job (a message read in place is served on the poller's
        own thread, holding no slot).
        """
        token = getattr(self._left, "token", None)
        if token is None:
            return
        with self._in_flight_cv:
            if token not in self._leavable:
                self._leavable[token] = time.monotonic()
            if self._slot_wanted:
                self._in_flight_cv.notify_all()  # its wait is timed to the first one ripe

    def _unread(self, claimed: Claimed, unread: Unread, started: float) -> bool:
        """A claim :meth:`Lifecycle.read_claim` could not read (and settled): counted, logged
        and reported as its outcome.  False (not served)."""
        # Not counted as failed: that counter is for handlers that raised (dead letters have
        # their own, from the lifecycle's observer).
        if unread.kind == "lost":
            self.stats.add(lost_claims=1)
        else:
            log.warning("%s: cannot read %s: %s; %s", self.name, claimed.name, unread.error,
                        unread.disposition)
        self._outcome(claimed, _FILED.get(unread.kind, "failed"), started)
        return False

    def _outcome(self, claimed: Claimed, outcome: str, started: float, detail: str = "",
                 *args: object) -> None:
        """The one INFO line per message: its outcome and how long this node took over it.

        Lazy %-arguments, and nothing built unless INFO is on: this runs once per message."""
        if not log.isEnabledFor(logging.INFO):
            return
        log.info("%s: %s %s in %.3f s" + (" " + detail if detail else ""), self.name, claimed.name, outcome,
                 time.monotonic() - started, *args,
                 extra={**_about(self.name, claimed), "event": outcome})

    def _retry(self, step: Callable[[], T]) -> T | None:
        """Run an idempotent step until it succeeds or the node stops (recovery then finishes).

        While stopping, a step is still tried for a few more seconds: a recorded result should
        go out before the node exits rather than wait for its next start."""
        delay = 0.05
        while True:
            try:
                return step()
            except TransportError as exc:
                if self._stop.is_set() and time.monotonic() > self._give_up_at:
                    log.warning("%s: stopping with a step unfinished (recovery will finish it): %s",
                                self.name, exc)
                    return None
                log.warning("%s: retrying after: %s", self.name, exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------------ stopping

    def stop(self, drain_timeout: float) -> bool:
        """Stop claiming, give in-flight handlers ``drain_timeout``, then hand back what is not
        done: claims whose handler has not returned go straight back to their box (other nodes
        take them at once, no lease to wait for), recorded results are still delivered.  True if
        nothing was left behind (every claim finished or returned)."""
        self._stop.set()
        self._give_up_at = time.monotonic() + drain_timeout + FINISH_GRACE
        if self._thread is not None:
            self._thread.join(timeout=max(drain_timeout, 1.0))
        with self._in_flight_cv:
            busy = self.in_flight
        if busy:
            log.info("%s: draining %d in-flight message(s), up to %g s", self.name, busy, drain_timeout)
        deadline = time.monotonic() + drain_timeout
        with self._in_flight_cv:
            while self.in_flight > 0 and time.monotonic() < deadline:
                self._in_flight_cv.wait(min(0.1, max(deadline - time.monotonic(), 0.001)))
            drained = self.in_flight == 0
        clean = drained or self._hand_back()
        if not drained:
            # Results being delivered get a short grace; handlers still running are abandoned
            # (their claims are back in the box, and they will not record anything).
            deadline = time.monotonic() + FINISH_GRACE
            with self._in_flight_cv:
                while self._finishing() and time.monotonic() < deadline:
                    self._in_flight_cv.wait(0.1)
            clean = clean and not self._finishing()  # the rest is this node's recovery's
        self._pool.shutdown()
        return clean

    def _hand_back(self) -> bool:
        """Return the claims whose handling has not finished to their box (for other nodes, at
        once: no lease to wait for); True if all went back."""
        returned, handling = self.claims.hand_back(self.lifecycle.unclaim)
        if returned:
            self.observer.returned(returned)
        if handling:
            log.info("%s: returned %d unfinished claim(s) to %s for other nodes", self.name, returned,
                     self.lifecycle.layout.box)
        return returned == handling

    def _finishing(self) -> bool:
        """Whether a worker is delivering a recorded outcome."""
        return self.claims.any_finishing()

    def _lease_holds(self) -> bool:
        """Whether the claim being served (on this thread) is still this node's: the lease is
        valid and has not lapsed since the poll that claimed it began.  Always true without a
        lease."""
        if self._lease is None:
            return True
        return self._lease.holds(getattr(self._left, "term", self._term))


class Provider(Poller):
    """The poller and workers of one endpoint (its inbound direction) or one transfer."""

    def __init__(self, name: str, config: BoxSettings, lifecycle: Lifecycle, handler: Handler,
                 poll_lock: PollLock, *, liveness: Liveness | None = None) -> None:
        super().__init__(name, config, poll_lock, liveness=liveness)
        self.lifecycle = lifecycle
        self.handler = handler
        self.in_place = lifecycle.layout.select is None
        # What the last listing found and this node has not claimed yet, best first.
        self._backlog: deque[Candidate] = deque()
        #: what the next listing is: the whole box, or a part of a large one (exchange.backlog)
        self.lister = BoxLister(lifecycle, poll_interval=config.poll_interval, large=config.large_box)
        #: when the listing behind the backlog was made (time.monotonic())
        self._listed_at = 0.0
        #: the longest listing of the box so far (seconds): bounds how stale a backlog can get
        self.longest_listing = 0.0
        #: messages this node found expired and filed, never delivered
        self.expired = 0
        lifecycle.observer = self._observer

    def stop(self, drain_timeout: float) -> bool:
        self.lister.close()  # a complete pass of a large box under way ends with its listing
        return super().stop(drain_timeout)

    def _observed(self, observer: EndpointObserver) -> None:
        # The lifecycle files dead letters (in workers, the sweeper and recovery alike): it
        # reports them to the same observer.
        self.lifecycle.observer = observer

    def _poll_locked(self, free: int) -> int:
        """Claim up to ``free`` messages from the remembered backlog, listing the box if empty.

        The box is listed only when the remembered backlog of the last listing is used up (or
        went stale): a listing of a large box costs far more to fetch and parse than a claim, a
        single rename.  A remembered file another node took meanwhile is a lost race, one round
        trip; the poll then draws again from the backlog until it has its ``free`` claims, within
        STALE_TRIES x ``free`` attempts.  Nodes sharing a box each take most of what the others
        remember, so dropping the backlog whenever most of a batch was lost would make nearly
        every poll a full listing under the poll lock.  A poll that wins nothing drops the
        backlog.
        """
        lc = self.lifecycle
        if self.in_place:
            # Read in place: only holding the lock keeps other nodes off these files.  A file
            # that could not be handled stays (held back a while) and counts 0.
            waiting = self._selected(lc.waiting())
            self.observer.listed(c.mtime for c in waiting)
            picks = waiting[:free]
            claimed, _ = lc.claim(picks, "serve")
            if claimed and log.isEnabledFor(logging.DEBUG):
                for c in claimed:
                    log.debug("%s: claimed %s (in place)", self.name, c.name, extra=_about(self.name, c))
            return sum(1 for c in claimed if not self._stop.is_set() and self._serve_one(c))
        listed = False
        won = lost = tried = 0
        if self._backlog and self.lister.stale():
            # Relisted once it is a poll_interval old, used up or not: a message that arrived
            # since (a priority 9 behind 2,000 of priority 4) waits one interval at most, and a
            # large backlog costs one listing per interval, as an idle endpoint does.  Unless
            # the listing itself takes longer than a fraction of that interval (10,000 entries
            # at a short poll_interval): then it is relisted after RELIST_COST_FACTOR listing
            # times, so listing never takes more than about 1/RELIST_COST_FACTOR of the poller.
            # A large box's backlog is kept until used up or a complete pass is due instead.
            self._backlog.clear()
        while won < free and tried < STALE_TRIES * free:
            if not self._backlog:
                if listed:
                    break
                # A large box is listed a part at a time (a slice, or the first part), and
                # its best messages only are kept: see exchange.backlog.
                self._backlog = deque(self._selected(self.lister.refill()))
                self._listed_at = time.monotonic()
                self.longest_listing = max(self.longest_listing, self.lister.listing_seconds)
                self.observer.listed(c.mtime for c in self._backlog)
                listed = True
                self._expire_found(free)
                if not self._backlog:
                    break
            picks = self._take(free - won)
            claimed, lost_now = lc.claim(picks, "serve")
            self.lister.taken(c.name for c in picks)  # a complete pass under way may list them
            if claimed and log.isEnabledFor(logging.DEBUG):
                for c in claimed:
                    log.debug("%s: claimed %s", self.name, c.name, extra=_about(self.name, c))
            for c in claimed:
                # a remembered message may have expired since it was listed: never delivered
                job = self._expire_one if lc.is_expired(c.candidate) else self._serve_one
                self._dispatch(functools.partial(job, c), c.name)
            won += len(claimed)
            lost += lost_now
            tried += len(picks)
        if won == 0 and lost:
            self._backlog.clear()
        return self._claimed_count(won, lost)

    def _selected(self, waiting: list[Candidate]) -> list[Candidate]:
        """The waiting messages this node's selector (the endpoint's ``selector:``) takes.

        Filtered here, at listing time, so that the others are never claimed, returned or
        counted as work by this node: they stay for other consumers, and a box holding only
        messages this node does not take is an empty box to it (the poller backs off to
        ``poll_interval`` instead of claiming and listing again at once).  Expired ones are
        filed all the same (``waiting`` sets them aside before this; so does the sweeper)."""
        selector = self.lifecycle.policy.selector
        if selector is None:
            return waiting
        matches = selector.matches
        return [c for c in waiting if matches(c.envelope.headers, c.envelope.properties)]

    def _expire_found(self, limit: int) -> None:
        """Claim up to ``limit`` of the expired messages listings found; workers file them."""
        lc = self.lifecycle
        picks = lc.take_expired(limit)
        if picks:
            claimed, _ = lc.claim(picks, "expire")
            for c in claimed:
                self._dispatch(functools.partial(self._expire_one, c), c.name)

    def _expire_one(self, claimed: Claimed) -> bool:
        """File a claimed message that expired (inexpired or indead, a request's caller gets an
        expiry reply) instead of serving it; True once done."""
        started = time.monotonic()
        lc = self.lifecycle
        fields = lc.record_expired(claimed)
        attempts = iter(range(1 << 30))
        ok = self._retry(lambda: lc.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if ok:
            self.expired += 1
            self._outcome(claimed, "expired", started, "before it was delivered; filed in %s",
                          fields["commit"].rsplit("/", 1)[0])
        else:
            self._outcome(claimed, "lost" if ok is False else "unfinished", started)
        return ok is not None

    def _take(self, count: int) -> list[Candidate]:
        """``count`` files from the best part of the backlog, chosen at random within it.

        Nodes that listed the same backlog would otherwise all go for the same oldest files and
        lose most of their claims to each other; drawing from a window of the oldest keeps the
        order approximately best-first while making collisions rare.
        """
        backlog = self._backlog
        count = min(count, len(backlog))
        window = min(len(backlog), count * CLAIM_WINDOW)
        # Never across priorities: the window holds only messages of the best one waiting (the
        # next poll, or the next round of this one, goes on with the next priority).
        top = backlog[0].envelope.headers.priority
        if backlog[window - 1].envelope.headers.priority != top:
            window = next(i for i, c in enumerate(backlog) if c.envelope.headers.priority != top)
            count = min(count, window)
        # Only the window is touched (a deque): copying the rest of a large backlog on every
        # poll would be O(backlog) work per claim batch in the poller thread.
        head = [backlog.popleft() for _ in range(window)]
        chosen = set(random.sample(range(window), count))
        backlog.extendleft(reversed([entry for i, entry in enumerate(head) if i not in chosen]))
        return [head[i] for i in sorted(chosen)]

    # ------------------------------------------------------------------ serving

    def _serve_one(self, claimed: Claimed) -> bool:
        """Read, call the handler, record, commit and reply; True once the message is done."""
        with self.claims.holding(claimed):
            return self._serve(claimed)

    def _serve(self, claimed: Claimed) -> bool:
        started = time.monotonic()
        lc = self.lifecycle
        # A request that came back may have its reply staged already, by a node that lost its
        # claim after staging: that reply is delivered, the handler is not run again.
        adopted = self._retry(lambda: (lc.adopt(claimed),))
        if adopted is None:
            self._outcome(claimed, "unfinished", started, "(left for recovery: the node is stopping)")
            return False
        if adopted[0] is not None:
            if not self.claims.finishing(claimed):  # handed back at shutdown meanwhile
                return False
            return self._finish(claimed, adopted[0], started, "served", "(its reply was staged already)")
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        with spool:
            size = lc.read_claim(claimed, spool, retry=self._retry, stop=self._stop)  # type: ignore[arg-type]
            if isinstance(size, Unread):
                return self._unread(claimed, size, started)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: read %s: %d bytes", self.name, claimed.name, size,
                          extra=_about(self.name, claimed))
            self.observer.received(size, claimed.candidate.mtime)
            env = claimed.candidate.envelope
            message = Message(self.name, claimed.name, env.headers.id, claimed.size, spool,  # type: ignore[arg-type]
                              dict(claimed.candidate.values), env.headers, env.properties)
            error: str | None = None
            result: bytes | None = None
            if not self._lease_holds():
                return self._fenced(claimed, started)
            handler_started = time.monotonic()
            try:
                returned = self.handler(message)
                result = None if returned is None and self.result_optional else result_bytes(returned)
            except Exception as exc:  # the handler is user code: any failure is its reply
                error = failure_reason(exc, getattr(self.config, "error_reply", DEFAULT_ERROR_REPLY),
                                       logger=log, what=f"{self.name}: handler failed on {claimed.name}")
            self.observer.handled(time.monotonic() - handler_started)
        if not self.claims.finishing(claimed):  # handed back at shutdown while the handler ran
            self._outcome(claimed, "returned", started, "(handed back at shutdown; its result is dropped)")
            return False
        try:
            served = lc.write_served(claimed, result, error=error)
            # Handled: the slot goes to the next claim while this thread waits for the fsync.
            self._leave_slot()
            fields = lc.served_durable(served)
        except Exception as exc:
            # Nothing recorded (a full or broken journal): the result cannot be delivered safely,
            # so the message goes back for any node; this node's poller stops too (its claims
            # need the same journal), and a node that cannot work stops its heartbeat.
            log.error("%s: cannot record the result of %s, returning it: %s: %s", self.name, claimed.name,
                      type(exc).__name__, exc)
            self._retry(functools.partial(lc.rename_back, claimed))
            self._outcome(claimed, "returned", started)
            return False
        return self._finish(claimed, fields, started, "served" if error is None else "failed",
                            size=len(result or b""))

    def _finish(self, claimed: Claimed, fields: dict[str, str], started: float, outcome: str,
                detail: str = "", *, size: int = 0) -> bool:
        """Deliver a recorded result (commit, reply), retrying until done or the node stops;
        ``outcome`` is the log line's word once done.  True unless left for recovery."""
        lc = self.lifecycle
        attempts = iter(range(1 << 30))
        # The first attempt knows the server's state; a retry must re-check it (stat calls).
        ok = self._retry(lambda: lc.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if ok is False:
            self.stats.add(lost_claims=1)
            self._outcome(claimed, "lost", started)
        elif ok:
            self.stats.add(served=1 if outcome == "served" else 0, failed=1 if outcome == "failed" else 0)
            with self.stats.lock:
                self.stats.latencies.append(time.monotonic() - started)
            self.observer.completed(sent_at(claimed.candidate), size)
            self._outcome(claimed, outcome, started, detail)
        else:
            self._outcome(claimed, "unfinished", started, "(left for recovery: the node is stopping)")
        return ok is not None

    def _fenced(self, claimed: Claimed, started: float) -> bool:
        """A claim read while the lease lapsed (or lapsed since it was made): another node may
        have it, so its handler is not started.  Put back in the box if it is still this node's
        claim (else another node took it: nothing to do).  False (not served here)."""
        self._retry(functools.partial(self.lifecycle.unclaim, claimed))
        self.observer.returned(1)
        self._outcome(claimed, "returned", started, "(fenced: this node's lease may have run out)")
        return False

    @property
    def result_optional(self) -> bool:
        """A transfer's handler may return None (nothing to send); an endpoint's None is an
        empty response."""
        return self.lifecycle.layout.key.startswith(TRANSFER_KEY_PREFIX)


#: a Disposition's kind (ftpbc.exchange.lifecycle) as the outcome of a message's log line
_FILED = {"returned": "returned", "error": "failed", "dead": "dead-lettered", "gone": "lost", "lost": "lost",
          "unfinished": "unfinished"}


def _about(endpoint: str, claimed: Claimed | Candidate) -> dict[str, object]:
    """``extra=`` of a line about one message: JSON logs carry its endpoint and id."""
    return {"endpoint": endpoint, "message_id": claimed.uuid}


def sent_at(candidate: Candidate) -> datetime | None:
    """When a message was sent: the send stamp its name carries (``headers.timestamp``), else
    its file's modification time on the server (written once, so close to its sending too)."""
    return candidate.envelope.headers.timestamp or candidate.mtime
