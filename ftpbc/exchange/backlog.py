"""How a serving node lists its box: all of it while it is small, a part at a time once it is large.

A listing costs in proportion to the box, and the box can hold a million messages (a node down for
a day, a partner's bulk upload): a whole listing of that is tens of seconds of server and node
time, and vsftpd refuses it outright (``500 OOPS: malloc``).  :class:`BoxLister` decides what the
next listing is, so that a listing costs in proportion to what it hands out, not to the box:

small box (up to ``large`` messages)
    the whole box, every time, in exact delivery order; the remembered backlog is relisted after
    ``poll_interval``, or RELIST_COST_FACTOR listing times if that is longer (a message that
    arrives meanwhile, a priority 9 behind thousands of 4, waits that long at most).
large box
    a listing that finds more than ``large`` messages is stopped there; from then on each refill
    lists one *part*:

    * **a slice**, where the layout cuts its names by globs (``*.0*`` ... ``*.f*``: the UUID's
      first hex digit, :meth:`Layout.slices`) and the server lists by glob (vsftpd, ProFTPD,
      pure-ftpd; ``Transport.globs``): the server reads its directory but sends only that slice
      (read here up to ``large`` messages: a slice of a million holds 62,500), and the slices
      are listed in turn, a new one whenever the backlog of the last is used up;
    * **the first ``large`` messages of a stopped listing** elsewhere (pyftpdlib, which refuses
      globs with ``550``; SFTP, which has none; a local directory): the server's directory order
      has nothing to do with names or ages, and the messages claimed leave it, so each such
      listing brings the next ones.

    Either way the node keeps what the part held in delivery order (priority, then age), at
    most ``large`` messages (a bounded heap while it streams in, :meth:`Lifecycle.listing`), so
    memory stays bounded.
    Order inside a part is exact; across parts it is not, so **a complete pass** (every slice,
    or a listing to the end) finds the best ``large`` of the whole box, and they replace the
    backlog (less what was claimed while the pass ran).  A pass runs on a thread of its own
    while the poller goes on claiming from the backlog it has: at a million messages a pass
    takes minutes, and the node would otherwise stop for it.  A pass starts
    ``poll_interval`` or RELIST_COST_FACTOR pass times after the last one ended, whichever is
    longer, the first one that long after the first part (a pass estimated as PARTS_GUESS
    parts, or as many slices): a priority-9 message that arrives during a long drain goes first
    within one pass interval plus two passes.

    A complete pass or a part that finds fewer than ``large`` messages (half of it, for a
    rotation of slices) makes the box small again.

What is not guaranteed: names of the layout's messages outside every slice cannot exist (``%u``
matches lower-case hex only), but a server that truncates listings (pure-ftpd's
``LimitRecursion``, 10,000 names by default) makes a large box look small, and it is listed as
one, in the server's order.  With ``large`` below such a cap the box is large, but no listing
shows what lies past the cap (pure-ftpd fails a glob there: taken as refused), so parts are
stopped listings and passes see the first names only.  Everything else holds as for a small
box: claims by rename, sizes checked on read, bad lines skipped, ``max_listing_entries``.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable

from ftpbc.config.area import LARGE_BOX
from ftpbc.errors import ConnectionLost, NotFound, OutcomeUnknown, TransportError
from ftpbc.exchange.layout import Candidate, delivery_order
from ftpbc.exchange.lifecycle import Lifecycle, Listing
from ftpbc.transport.base import GlobRefused

log = logging.getLogger("ftpbc.backlog")

#: how many parts a large box listed by first parts is taken to hold until a pass has counted it
PARTS_GUESS = 16
#: names a running pass remembers as taken meanwhile, at most (a pass lasts seconds, not hours)
MAX_TAKEN = 1_000_000
#: a remembered backlog is relisted after poll_interval, or after this many times what its
#: listing took if that is longer (bounds the share of the poller spent listing)
RELIST_COST_FACTOR = 5


class BoxLister:
    """The listings of one provider's box (see the module docstring).  Its poller calls it, under
    the poll lock; complete passes run on a thread of their own, which :meth:`close` stops."""

    def __init__(self, lifecycle: Lifecycle, *, poll_interval: float, large: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``large``: messages above which the box is large (default: an endpoint's default
        ``large_box``)."""
        large = LARGE_BOX if large is None else large
        if large < 1:
            raise ValueError(f"large must be at least 1, got {large!r}")
        self.lifecycle = lifecycle
        self.poll_interval = poll_interval
        #: messages above which the box is large, and how many of a part are kept
        self.large = large
        self.clock = clock
        self.is_large = False
        #: nodes that share this box, taking turns listing it (see :meth:`stale`)
        self.sharers = 1
        self._slices = lifecycle.layout.slices()
        self._next_slice = 0
        #: messages the slices listed since the rotation last started over, and how many slices
        self._rotation_found = 0
        self._rotation_listed = 0
        self._sized = False
        #: why the server refused a glob while the box was not known to be large (logged when
        #: the box turns out large); None: not refused
        self._refused: str | None = None
        #: when the last listing of the remembered backlog was made, and how long it took
        self._listed_at = 0.0
        self.listing_seconds = 0.0
        #: when the next complete pass of a large box is due
        self._pass_due = float("inf")
        self._pass: _Pass | None = None
        self._closed = threading.Event()
        #: how many complete passes and parts were listed, the longest pass and the longest
        #: wait scheduled before a pass (seconds): what bounds a new message's wait
        self.passes = 0
        self.parts = 0
        self.longest_pass = 0.0
        self.longest_pass_wait = 0.0

    # ------------------------------------------------------------------ what to list

    def stale(self) -> bool:
        """Whether a backlog still remembered should be dropped and listed again now: a small
        box's after its relist interval, a large box's once a complete pass has its result (one
        that is due is started here).

        With :attr:`sharers` nodes taking turns listing the box, the interval a listing's cost
        sets is as many times longer: the cluster then lists it about as often as one node
        would, and a message that arrives meanwhile waits for the next listing of any node."""
        now = self.clock()
        if not self.is_large:
            return now - self._listed_at >= max(self.poll_interval,
                                                RELIST_COST_FACTOR * self.listing_seconds * self.sharers)
        running = self._pass
        if running is None:
            if now >= self._pass_due and not self._closed.is_set():
                self._pass = _Pass(self)
            return False
        return running.done.is_set()

    def taken(self, names: Iterable[str]) -> None:
        """Names the poller claimed (or lost to another node) from its backlog: a complete pass
        running now may have listed them still, and must not hand them out again."""
        running = self._pass
        if running is not None:
            running.taken(names)

    def refill(self) -> list[Candidate]:
        """One listing's best messages, in delivery order (at most ``large`` of them)."""
        started = self.clock()
        running = self._pass
        if self.is_large and running is not None and running.done.is_set():
            self._pass = None
            found = self._passed(running)
        elif self.is_large:
            found = self._part()
        else:
            found = self._small()
        self._listed_at = self.clock()
        self.listing_seconds = self._listed_at - started
        return found

    def close(self) -> None:
        """Stop a complete pass under way (its listing is cut short); start no more."""
        self._closed.set()

    def _sliced(self) -> bool:
        return bool(self._slices) and self.lifecycle.transport.globs is not False

    def _small(self) -> list[Candidate]:
        lc = self.lifecycle
        if self._sliced() and not self._sized:
            # The first listing of a node sizes the box by one slice: a box of a million on
            # vsftpd cannot be listed whole at all.
            self._sized = True
            part = self._slice()
            if part is not None and part.found * len(self._slices) > self.large:
                self._enter_large(part.seconds * len(self._slices))
                return part.candidates
        try:
            whole = lc.listing(keep=self.large, stop_after=self.large + 1)
        except (NotFound, ConnectionLost, OutcomeUnknown):
            raise
        except TransportError as exc:
            if not self._sliced():
                raise
            # vsftpd's "500 OOPS" for a directory too large to list: go by slices.
            log.warning("%s: listing the whole of %s failed (%s); listing it by slices", lc.name,
                        lc.layout.box, exc)
            part = self._slice()
            if part is None:
                raise
            self._enter_large(part.seconds * len(self._slices))
            return part.candidates
        if not whole.complete:
            # Stopped at ``large``: the box is larger; how much, the first pass will tell.  Until
            # then it is taken for PARTS_GUESS parts, as many as the slices cut (a pass of a
            # million on pyftpdlib or OpenSSH is 50 such parts: minutes, not seconds).
            self._enter_large(whole.seconds * PARTS_GUESS)
        return whole.candidates

    def _enter_large(self, estimated_pass: float) -> None:
        lc = self.lifecycle
        self.is_large = True
        self._schedule_pass(estimated_pass)
        how = "by slices" if self._sliced() else "first parts"
        if self._refused is not None and not self._sliced():
            how += f"; {self._refused}"
        log.info("%s: %s holds more than %d messages: listed a part at a time (%s)", lc.name,
                 lc.layout.box, self.large, how)

    def _leave_large(self) -> None:
        self.is_large = False
        self._pass = None  # a pass still running is left to end; its result is not wanted
        self._rotation_found = self._rotation_listed = 0
        self._pass_due = float("inf")
        log.info("%s: %s is small again: listed whole", self.lifecycle.name, self.lifecycle.layout.box)

    def _part(self) -> list[Candidate]:
        """The next slice (the next non-empty one, at most one rotation), or the first part."""
        self.parts += 1
        if self._sliced():
            for _ in range(len(self._slices)):
                part = self._slice()
                if part is None:
                    break  # globs refused just now: go on without
                if self._rotation_listed >= len(self._slices):
                    if self._rotation_found < self.large // 2:
                        self._leave_large()
                        return part.candidates
                    self._rotation_found = self._rotation_listed = 0
                if part.candidates:
                    return part.candidates
            if self._sliced():
                return []
        first = self.lifecycle.listing(keep=self.large, stop_after=self.large + 1)
        if first.complete:
            self._leave_large()
        return first.candidates

    def _passed(self, done: _Pass) -> list[Candidate]:
        """Take a finished pass's result (the next pass is scheduled from its time)."""
        if done.error is not None:
            # Logged by the pass; tried again one interval on (a server that went away).
            self._schedule_pass(max(done.seconds, self.poll_interval))
            return self._part()
        self.passes += 1
        self.longest_pass = max(self.longest_pass, done.seconds)
        self._schedule_pass(done.seconds)
        if done.found <= self.large // 2:
            self._leave_large()
        return done.result()

    def _schedule_pass(self, pass_seconds: float) -> None:
        wait = max(self.poll_interval, RELIST_COST_FACTOR * pass_seconds)
        self.longest_pass_wait = max(self.longest_pass_wait, wait)
        self._pass_due = self.clock() + wait

    def _slice(self) -> Listing | None:
        """List the next slice in turn; None if the server refused the glob (never asked again)."""
        glob = self._slices[self._next_slice % len(self._slices)]
        try:
            # Stopped at ``large`` too: a slice of a million-message box holds 62,500, and
            # parsing what is not kept is what the poller would wait for.
            part = self.lifecycle.listing(keep=self.large, stop_after=self.large + 1, glob=glob)
        except GlobRefused as exc:
            # The reason says which: a server without globs (pyftpdlib: 550), or one past its
            # listing cap (pure-ftpd: "Out of memory during globbing"), whose cap an operator
            # may want to raise.  Said at info only for a box known to be large; a box being
            # sized (empty, small, or not yet known) is listed whole from now on, which is
            # nothing to report.
            if self.is_large:
                log.info("%s: a large box is listed by first parts: %s", self.lifecycle.name, exc)
            else:
                self._refused = str(exc)
                log.debug("%s: %s is listed whole: %s", self.lifecycle.name, self.lifecycle.layout.box, exc)
            return None
        self._next_slice = (self._next_slice + 1) % len(self._slices)
        self._rotation_found += part.found
        self._rotation_listed += 1
        return part


class _Pass:
    """One complete pass of a large box, on a daemon thread of its own: the best ``large`` of
    every slice, or of one listing to the end.  Its boundary catches and logs any error (the
    lister tries again an interval later)."""

    def __init__(self, lister: BoxLister) -> None:
        self.lister = lister
        self.done = threading.Event()
        self.found = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._best: list[Candidate] = []
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self._started = lister.clock()
        threading.Thread(target=self._run, name=f"ftpbc-pass-{lister.lifecycle.name}", daemon=True).start()

    def taken(self, names: Iterable[str]) -> None:
        with self._lock:
            if len(self._taken) < MAX_TAKEN:
                self._taken.update(names)

    def result(self) -> list[Candidate]:
        """The pass's best, less what the poller took meanwhile, in delivery order."""
        with self._lock:
            taken = self._taken
            return [c for c in self._best if c.name not in taken]

    def _run(self) -> None:
        lister = self.lister
        lc, large, closed = lister.lifecycle, lister.large, lister._closed
        try:
            found, best = 0, list[Candidate]()
            globs = lister._slices if lister._sliced() else ()
            for glob in globs:
                if closed.is_set():
                    return
                try:
                    part = lc.listing(keep=large, glob=glob, cancel=closed, background=True)
                except GlobRefused:
                    break
                found += part.found
                best = heapq.nsmallest(large, [*best, *part.candidates], key=delivery_order)
            else:
                if globs:
                    self.found, self._best = found, best
                    return
            whole = lc.listing(keep=large, cancel=closed, background=True)
            self.found, self._best = whole.found, whole.candidates
        except Exception as exc:  # the boundary of this thread: logged, tried again later
            self.error = exc
            log.warning("%s: a complete pass of %s failed (tried again later): %s: %s", lc.name,
                        lc.layout.box, type(exc).__name__, exc)
        finally:
            self.seconds = lister.clock() - self._started
            self.done.set()
