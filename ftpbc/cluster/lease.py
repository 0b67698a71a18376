"""This node's own lease: whether the claims it holds are still provably its own.

Other nodes judge this node by its heartbeat: once its last beat is older than ``node.lease``
they may return its claims and serve them themselves.  So this node may claim, and may start a
handler for a claim, only while its own lease is *provably* valid: its last heartbeat written
successfully, timed on this host's clock *before* the write was issued (a slow write counts
against it), plus the lease, minus a safety margin, is still ahead.  Otherwise it fences itself:
it claims nothing and starts no handler until a heartbeat is written again.

A claim must also have been the node's *all along*: a node paused (SIGSTOP, a VM frozen) or cut
off past its lease may wake up, beat again and find its lease valid, yet the claims it took
before may have been returned and served elsewhere meanwhile.  Every lapse therefore starts a
new *term*; a claim is served only in the term it was made in (:meth:`Lease.term` when
claiming, :meth:`Lease.holds` before the handler).

What is guaranteed: a handler is started only if, at the moment of the check, no other node can
yet have judged this node dead, given that the hosts' clocks (or, with ``coordination: server``,
this node's estimate of the server's clock) are within the margin of each other.  What is not:
a process paused between that check and the handler's first instruction, or a handler that runs
on past the lease, can still overlap with another node's run of the same message; its commit
then fails (the commit is a rename of the claim, which is gone) and its result is never
delivered.

The clock is ``CLOCK_BOOTTIME`` where there is one (Linux): unlike ``time.monotonic`` it goes on
while the host is suspended, and a suspended host's lease runs out like any other's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

log = logging.getLogger("ftpbc.lease")


def _boot_clock() -> Callable[[], float]:
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:  # not Linux: the monotonic clock, which may stop while suspended
        return time.monotonic
    return lambda: time.clock_gettime(boottime)


#: the clock leases are timed on: monotonic, and counting time the host spent suspended
lease_clock: Callable[[], float] = _boot_clock()


def safety_margin(lease: float, interval: float, *, clock_error: float = 0.0) -> float:
    """How much earlier than the other nodes this node considers its own lease over.

    A sixth of the lease plus ``clock_error`` (what the hosts' judgement of a heartbeat's age may
    be off by: a server's file times are whole seconds), but never more than half of what the
    lease leaves over one heartbeat interval, so that a node beating on time always holds a
    valid lease between two beats.
    """
    return min(lease / 6 + clock_error, (lease - interval) / 2)


class Lease:
    """Whether this node's lease is valid now, renewed by its heartbeat.  Thread-safe.

    Open (valid, whatever the time) until :meth:`arm` is called: a process without a heartbeat
    (a handler tested on its own) is never fenced.  Once armed it is valid only until ``lease -
    margin`` after the start of the last beat :meth:`renewed` reports.  Transitions are logged
    once each: WARNING ``fenced: ...`` when a check first finds it over, WARNING ``unfenced:
    ...`` when a beat renews it again.
    """

    def __init__(self, lease: float, margin: float, *, node_id: str = "",
                 clock: Callable[[], float] = lease_clock, wall: Callable[[], float] = time.time) -> None:
        if not 0 <= margin < lease:
            raise ValueError(f"margin {margin!r} must be at least 0 and below the lease {lease!r}")
        self.lease = lease
        self.margin = margin
        self.node_id = node_id
        self.now = clock
        self._wall = wall
        self._lock = threading.Lock()
        #: valid until this time on ``now``'s clock; None: not armed (always valid)
        self._until: float | None = None
        #: lapses so far; a claim made in one term is not served in another
        self._term = 0
        #: the lease is known to be over (counted in _term)
        self._lapsed = False
        #: "fenced" was logged and "unfenced" was not yet
        self._said = False
        #: started_at of the last successful beat (None: none yet)
        self._renewed_at: float | None = None
        #: when the current term began (the beat that ended the last lapse was issued)
        self._valid_since = -float("inf")

    def arm(self) -> None:
        """A heartbeat starts: the lease is over until its first beat is written."""
        with self._lock:
            if self._until is None:
                self._until = -float("inf")
                self._lapsed = True  # not logged: nothing was claimed under it yet

    def renewed(self, started_at: float) -> None:
        """A beat was written successfully; ``started_at`` is :attr:`now` taken before its write
        was issued."""
        with self._lock:
            if self._until is None:
                return
            now = self.now()
            self._observe(now, quiet=True)  # a lapse that ended just now is still a lapse
            self._renewed_at = started_at if self._renewed_at is None else max(self._renewed_at, started_at)
            self._until = max(self._until, self._renewed_at + self.lease - self.margin)
            if self._lapsed and now < self._until:
                self._lapsed = False
                self._valid_since = started_at
                if self._said:
                    self._said = False
                    log.warning("unfenced: node %s: heartbeat written again; lease valid until %s; "
                                "claiming and serving again", self.node_id, self._stamp(self._until, now))

    def term(self) -> int | None:
        """The current term if the lease is valid now (claim under it), else None."""
        with self._lock:
            if self._until is None:
                return self._term
            now = self.now()
            self._observe(now)
            return None if self._lapsed else self._term

    def valid(self) -> bool:
        """Whether the lease is valid now."""
        return self.term() is not None

    def holds(self, term: int | None) -> bool:
        """Whether the lease is valid now and has not lapsed since ``term`` (from :meth:`term`)
        began: a claim made then is still this node's."""
        return term is not None and self.term() == term

    def held_for(self) -> float:
        """How long the lease has been valid without a lapse (0 while it is over, infinite
        when not armed).  A node judges other nodes dead only once this is a whole lease: after
        an outage that stopped every heartbeat (the coordination server's, say), every live
        node has then had a lease to write its heartbeat again."""
        with self._lock:
            if self._until is None:
                return float("inf")
            now = self.now()
            self._observe(now, quiet=True)
            return 0.0 if self._lapsed else now - self._valid_since

    @property
    def until(self) -> float | None:
        """Until when (on :attr:`now`'s clock) the lease is valid; None if not armed."""
        with self._lock:
            return self._until

    def _observe(self, now: float, *, quiet: bool = False) -> None:
        """Under the lock: notice (and log, once, unless ``quiet``: noticed by the renewal that
        ends it, when nobody asked meanwhile) that the lease is over."""
        assert self._until is not None
        if not self._lapsed and now >= self._until:
            self._lapsed = True
            self._term += 1
        if quiet or self._said or not self._lapsed or self._until == -float("inf"):
            return
        self._said = True
        since = (f"last written {now - self._renewed_at:.1f} s ago" if self._renewed_at is not None
                 else "none written yet")
        log.warning("fenced: node %s: no heartbeat written in time (%s); lease valid until %s only; "
                    "claiming nothing and starting no handler until one is written (claims held may "
                    "have been taken over: they are given back)", self.node_id, since,
                    self._stamp(self._until, now))

    def _stamp(self, until: float, now: float) -> str:
        """``until`` as this host's wall-clock time."""
        wall = datetime.fromtimestamp(self._wall() + (until - now))
        return wall.isoformat(sep=" ", timespec="milliseconds")
