"""The poll loop every serving class of a node runs on: worker slots, retries, fencing, draining.

A :class:`Poller` takes the poll lock, has its subclass claim up to as many items as it has
free workers (:meth:`Poller._poll_locked`), and runs each on a worker; polls that found work are
followed at once, empty ones back off up to ``poll_interval``.  Endpoints and transfers
(:class:`~ftpbc.node.provider.Provider`) and routes (:class:`~ftpbc.node.router.Router`) are
its subclasses.  Guaranteed: handlers never run more than ``workers`` at once; a claim is
served only while this node's lease has held since the poll that claimed it; a stopped poller
hands back what it has not finished.  Not guaranteed: any order between the items of one poll.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ftpbc.cluster.liveness import Liveness, LoopGuard
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.errors import TransportError
from ftpbc.exchange.layout import Candidate
from ftpbc.exchange.lifecycle import Claimed, Lifecycle, Unread
from ftpbc.faults import fail_point
from ftpbc.metrics import NULL_OBSERVER, EndpointObserver
from ftpbc.node.inflight import InFlight
from ftpbc.node.workers import Workers

log = logging.getLogger("ftpbc.provider")

T = TypeVar("T")
LOCK_RETRY = 0.005
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
    #: listings of the box (whole, a part, or a pass's result taken)
    listings: int = 0
    #: polls that found the poll lock held by another poller and skipped their turn
    lock_busy: int = 0
    #: seconds spent holding the poll lock, and of those, listing
    lock_held_s: float = 0.0
    listing_s: float = 0.0
    #: time.monotonic() of the last poll that did not fail (0.0: none yet)
    last_poll: float = 0.0
    #: seconds each of the last LATENCY_SAMPLES messages took, claim to commit (bounded: a node
    #: serving 1,000 messages a second for a day kept 86 million of them in a list)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: float) -> None:
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


class Poller:
    """The generic half of a provider: the poll loop, worker slots, retries and draining.

    A subclass implements :meth:`_poll_locked` (called under ``poll_lock``) and hands each item
    to :meth:`_dispatch`; endpoints and transfers (:class:`~ftpbc.node.provider.Provider`) and
    routes share this loop.
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
        unlocked = self._poll_unlocked(free)
        if unlocked is not None:
            self.stats.add(polls=1)
            return unlocked
        fail_point("poll-lock")
        with self.poll_lock.attempt() as held:
            if held:
                began = time.monotonic()
                try:
                    return self._poll_locked(free)
                finally:
                    self.stats.add(polls=1, lock_held_s=time.monotonic() - began)
        # Out of the attempt: its thread lock, when it was had, is released by now.
        self.stats.add(lock_busy=1)
        return self._poll_busy(free)

    def _poll_unlocked(self, free: int) -> int | None:
        """Before the poll lock is tried: take up to ``free`` items that need no lock and
        return their count as :meth:`poll_once` does; None: this poll takes the lock (the
        default)."""
        return None

    def _poll_busy(self, free: int) -> int:
        """The poll lock was busy: what this poll claims without it all the same (items that
        need no lock), as :meth:`poll_once` counts; -1 (the default): nothing, the lock was
        busy."""
        return -1

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
        elif unread.kind == "duplicate":
            log.warning("%s: %s: %s", self.name, claimed.name, unread.disposition)
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
                 extra={**log_extra(self.name, claimed), "event": outcome})

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


#: a Disposition's kind (ftpbc.exchange.lifecycle) as the outcome of a message's log line
_FILED = {"returned": "returned", "error": "failed", "dead": "dead-lettered", "gone": "lost", "lost": "lost",
          "unfinished": "unfinished", "duplicate": "duplicate"}


def log_extra(endpoint: str, claimed: Claimed | Candidate) -> dict[str, object]:
    """``extra=`` of a line about one message: JSON logs carry its endpoint and id."""
    return {"endpoint": endpoint, "message_id": claimed.uuid}
