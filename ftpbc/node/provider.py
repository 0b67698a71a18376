"""A provider: the inbound poller and worker pool of one endpoint or transfer on one node (its
poll loop, worker slots and draining are :class:`~ftpbc.node.poller.Poller`'s).

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
import random
import tempfile
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from ftpbc.cluster.coordination import Share
from ftpbc.cluster.liveness import Liveness
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.exchange.backlog import RELIST_COST_FACTOR as RELIST_COST_FACTOR
from ftpbc.exchange.backlog import BoxLister
from ftpbc.exchange.layout import KEY_PREFIX as TRANSFER_KEY_PREFIX
from ftpbc.exchange.layout import Candidate, delivery_order
from ftpbc.exchange.lifecycle import SPOOL_IN_MEMORY, Claimed, Lifecycle, Unread
from ftpbc.metrics import EndpointObserver
from ftpbc.model.message import Message, result_bytes
from ftpbc.node.failure import DEFAULT_ERROR_REPLY, failure_reason
from ftpbc.node.poller import Poller as Poller
from ftpbc.node.poller import PollSettings, log_extra
from ftpbc.tracing import consuming

log = logging.getLogger("ftpbc.provider")

Handler = Callable[[Message], object]
#: a claim batch is drawn from this many times its size of the oldest remembered files
CLAIM_WINDOW = 8
#: a poll gives up on a remembered backlog after this many attempts per claim it wanted
STALE_TRIES = 4


class BoxSettings(PollSettings, Protocol):
    """What a :class:`Provider` needs besides: when its box counts as large."""

    @property
    def large_box(self) -> int: ...


class Provider(Poller):
    """The poller and workers of one endpoint (its inbound direction) or one transfer."""

    def __init__(self, name: str, config: BoxSettings, lifecycle: Lifecycle, handler: Handler,
                 poll_lock: PollLock, *, liveness: Liveness | None = None,
                 share: Share | None = None) -> None:
        """``share``: this node's part of the box, for nodes sharing it (see :meth:`_poll_unlocked`);
        None takes the whole box, under the poll lock."""
        super().__init__(name, config, poll_lock, liveness=liveness)
        self.lifecycle = lifecycle
        self.handler = handler
        self.in_place = lifecycle.layout.select is None
        # What the last listing found and this node has not claimed yet, best first: this
        # node's part of it (see share), and the other nodes' parts.
        self._mine: deque[Candidate] = deque()
        self._backlog: deque[Candidate] = deque()
        #: whether the last listing found any of this node's part (see _poll_locked)
        self._had_mine = False
        #: this node's part among the nodes serving the box; None: the whole box, always
        self.share = share
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

    def _poll_unlocked(self, free: int) -> int | None:
        """Claim up to ``free`` messages of this node's part of the remembered backlog without
        the poll lock; None when this poll needs the lock (a listing is due, this node's part is
        used up, or another part holds a better priority than this node's best).

        No lock is needed here: the nodes serving the box split it (:class:`Share`), so none
        other goes for these files; where they disagree on who serves (a node joining or
        dying), the cost is a lost race, a claim being a rename exactly one node wins.  The lock
        is kept for what needs it: listing (one node at a time, so the cluster's listings do
        not pile up on the server) and taking from another node's part."""
        if self.in_place or self.share is None:
            return None
        self._resplit()
        if not self._mine or self.lister.stale():
            return None
        return self._claim_mine(free)

    def _poll_busy(self, free: int) -> int:
        """The poll lock is held by another node (listing, most likely): a listing due here
        waits for the next turn, and meanwhile this node goes on with its own part of what it
        remembers, as :meth:`_poll_unlocked` would."""
        if self.in_place or self.share is None or not self._mine:
            return -1
        found = self._claim_mine(free)
        if found is None:
            return -1
        self.stats.add(polls=1)
        return found

    def _claim_mine(self, free: int) -> int | None:
        """Claim from this node's part, unless another part holds a better priority (None)."""
        mine, theirs = self._mine, self._backlog
        if theirs and theirs[0].envelope.headers.priority > mine[0].envelope.headers.priority:
            return None
        picks = self._take(mine, free)
        claimed, lost = self._claim_and_dispatch(picks)
        if not claimed and lost:
            self._forget()
        return self._claimed_count(len(claimed), lost)

    def _poll_locked(self, free: int) -> int:
        """Claim up to ``free`` messages from the remembered backlog, listing the box if empty.

        The box is listed only when the remembered backlog of the last listing is used up (or
        went stale): a listing of a large box costs far more to fetch and parse than a claim, a
        single rename.  A remembered file another node took meanwhile is a lost race, one round
        trip; the poll then draws again from the backlog until it has its ``free`` claims, within
        STALE_TRIES x ``free`` attempts.  Nodes sharing a box each take their own part of what
        they list (:class:`Share`), and from another's part only when theirs holds nothing as
        good, so what one remembers stays valid while the others claim; with one node the whole
        box is its part.  A poll that wins nothing drops the backlog.
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
                    log.debug("%s: claimed %s (in place)", self.name, c.name, extra=log_extra(self.name, c))
            return sum(1 for c in claimed if not self._stop.is_set() and self._serve_one(c))
        listed = False
        won = lost = tried = 0
        self._resplit()
        if (self._backlog or self._mine) and self.lister.stale():
            # Relisted once it is a poll_interval old, used up or not: a message that arrived
            # since (a priority 9 behind 2,000 of priority 4) waits one interval at most, and a
            # large backlog costs one listing per interval, as an idle endpoint does.  Unless
            # the listing itself takes longer than a fraction of that interval (10,000 entries
            # at a short poll_interval): then it is relisted after RELIST_COST_FACTOR listing
            # times, so listing never takes more than about 1/RELIST_COST_FACTOR of the poller
            # (of the cluster's pollers together, when several nodes share the box: see
            # BoxLister.sharers).  A large box's backlog is kept until used up or a complete
            # pass is due instead.
            self._forget()
        if not self._mine and self._backlog and self._had_mine:
            # This node's part is used up: a fresh listing splits what is left again, rather
            # than racing the other nodes for the parts they are still working through.
            self._forget()
        while won < free and tried < STALE_TRIES * free:
            if not self._backlog and not self._mine:
                if listed:
                    break
                self._refill(free)
                listed = True
                if not self._backlog and not self._mine:
                    break
            picks = self._take(self._best_part(), free - won)
            claimed, lost_now = self._claim_and_dispatch(picks)
            won += len(claimed)
            lost += lost_now
            tried += len(picks)
        if won == 0 and lost:
            self._forget()
        return self._claimed_count(won, lost)

    def _refill(self, free: int) -> None:
        """List the box (a part of it, if large: see exchange.backlog) and split what it found
        into this node's part (:attr:`_mine`) and the other nodes' (:attr:`_backlog`)."""
        share = self.share
        if share is not None:
            # Several nodes take turns listing, each remembering what it found for longer:
            # the cluster lists about as often as one node would.
            self.lister.sharers = share.refresh()
        found = self._selected(self.lister.refill())
        self._listed_at = time.monotonic()
        self.longest_listing = max(self.longest_listing, self.lister.listing_seconds)
        self.stats.add(listings=1, listing_s=self.lister.listing_seconds)
        self.observer.listed(c.mtime for c in found)
        if share is None or share.count <= 1:
            self._mine, self._backlog = deque(found), deque()
        else:
            mine = share.mine
            self._mine = deque(c for c in found if mine(c.name))
            self._backlog = deque(c for c in found if not mine(c.name))
        # A listing that found nothing of this node's part: what there is belongs to the other
        # nodes' parts, and this node takes from them rather than listing again at once.
        self._had_mine = bool(self._mine)
        self._expire_found(free)

    def _resplit(self) -> None:
        """Split the remembered backlog again if the nodes serving the box changed since it was
        split (one joined, or died): each node then goes on with its new part at once."""
        share = self.share
        if share is None:
            return
        split = (share.index, share.count)
        self.lister.sharers = share.refresh()
        if split == (share.index, share.count) or not (self._mine or self._backlog):
            return
        remembered = sorted([*self._mine, *self._backlog], key=delivery_order)
        mine = share.mine
        self._mine = deque(c for c in remembered if mine(c.name))
        self._backlog = deque(c for c in remembered if not mine(c.name))
        self._had_mine = bool(self._mine)

    def _best_part(self) -> deque[Candidate]:
        """Where the next claims come from: this node's part, unless it is empty or another
        part's best is of a higher priority (then that one: priorities go first)."""
        mine, theirs = self._mine, self._backlog
        if not mine:
            return theirs
        if theirs and theirs[0].envelope.headers.priority > mine[0].envelope.headers.priority:
            return theirs
        return mine

    def _claim_and_dispatch(self, picks: list[Candidate]) -> tuple[list[Claimed], int]:
        """Claim ``picks`` and hand each claim won to a worker; (claims won, races lost)."""
        claimed, lost = self.lifecycle.claim(picks, "serve")
        self.lister.taken(c.name for c in picks)  # a complete pass under way may list them
        if claimed and log.isEnabledFor(logging.DEBUG):
            for c in claimed:
                log.debug("%s: claimed %s", self.name, c.name, extra=log_extra(self.name, c))
        for c in claimed:
            # a remembered message may have expired since it was listed: never delivered
            job = self._expire_one if self.lifecycle.is_expired(c.candidate) else self._serve_one
            self._dispatch(functools.partial(job, c), c.name)
        return claimed, lost

    def _forget(self) -> None:
        """Drop the remembered backlog (both parts): the next claim lists the box again."""
        self._mine.clear()
        self._backlog.clear()

    @property
    def remembered(self) -> int:
        """Messages remembered from the last listing and not claimed yet (every part)."""
        return len(self._mine) + len(self._backlog)

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

    def _take(self, backlog: deque[Candidate], count: int) -> list[Candidate]:
        """``count`` files from the best part of ``backlog``, chosen at random within it.

        Nodes that listed the same backlog would otherwise all go for the same oldest files and
        lose most of their claims to each other; drawing from a window of the oldest keeps the
        order approximately best-first while making collisions rare.
        """
        count = min(count, len(backlog))
        if count <= 0:
            return []
        if backlog is self._backlog and self._mine is not backlog and self.share is not None \
                and self.share.count > 1:
            return self._steal(backlog, count)
        return self._take_head(backlog, count)

    def _take_head(self, backlog: deque[Candidate], count: int) -> list[Candidate]:
        """``count`` (at most ``len(backlog)``) files at random from the oldest of the best
        priority in ``backlog``."""
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

    def _steal(self, theirs: deque[Candidate], count: int) -> list[Candidate]:
        """``count`` files of the other nodes' parts, taken from the young end of the best
        priority waiting there: their owners work from the old end, so the two rarely go for
        the same file.  From the old end when that priority is not the last one remembered
        (an older, better message must not wait behind worse ones taken first)."""
        top = theirs[0].envelope.headers.priority
        if theirs[-1].envelope.headers.priority != top:
            return self._take_head(theirs, count)
        window = min(len(theirs), count * CLAIM_WINDOW)
        tail = [theirs.pop() for _ in range(window)]
        chosen = set(random.sample(range(window), count))
        theirs.extend(reversed([entry for i, entry in enumerate(tail) if i not in chosen]))
        return [tail[i] for i in sorted(chosen)]

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
                          extra=log_extra(self.name, claimed))
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
                # The handler's span: a child of the sender's (the trace context its properties
                # carry), current while the handler runs, so the handler's own spans are its children.
                with consuming("process", self.name, env.properties, client_id=lc.node_id) as span:
                    if span:
                        span.message(env.headers.id, size, env.headers.correlation_id)
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


def sent_at(candidate: Candidate) -> datetime | None:
    """When a message was sent: the send stamp its name carries (``headers.timestamp``), else
    its file's modification time on the server (written once, so close to its sending too)."""
    return candidate.envelope.headers.timestamp or candidate.mtime
