"""What comes in (:mod:`ftpbc.exchange.lifecycle`'s inbound floor): the box listed, the best
messages kept in delivery order, returned ones held back, refused entries and expired
messages set aside (:meth:`InboundSteps.listing`); the picks claimed by rename, one journal
operation per message and one message per id (:meth:`~InboundSteps.claim`); a claim read with
its size checked (:meth:`~InboundSteps.read`) under the one read-failure policy
(:meth:`~InboundSteps.read_claim`): filed, given back with its delivery count raised, or given
back unchanged.
"""

from __future__ import annotations

import functools
import heapq
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO

from ftpbc.errors import (
    FtpbcError,
    IncompleteRead,
    MessageTooLarge,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolError,
    SourceGone,
    TransportError,
    UnsafeEntry,
    UnsafeNameError,
)
from ftpbc.exchange.area import REASON_SUFFIX, archive_name, parse_archive_name
from ftpbc.exchange.bounds import READ_MARGIN, BoundedSink
from ftpbc.exchange.layout import LONE_AFTER, AreaLayout, Candidate, delivery_order
from ftpbc.exchange.settlement import SettlementSteps
from ftpbc.exchange.steps import (
    MAX_HELD,
    REMEMBERED_IDS,
    UNFINISHED,
    UNKNOWN_SIZE,
    Claimed,
    Disposition,
    DuplicateMessage,
    Listing,
    Retry,
    Unread,
    op_id_for,
    rename_resolving,
    run_once,
    write_reason,
)
from ftpbc.faults import crash_point
from ftpbc.journal import Operation
from ftpbc.model.envelope import NAME_LIMIT, Envelope, Headers
from ftpbc.paths import join
from ftpbc.transport.base import Entry, Refused

log = logging.getLogger("ftpbc.lifecycle")

#: read failures that are the file's fault (counted as a delivery), not the connection's
POISON_ERRORS: tuple[type[TransportError], ...] = (PermissionDenied, IncompleteRead, ProtocolError)
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
#: the reason a duplicate is filed with (the start of its ``.reason`` file)
DUPLICATE_REASON = "duplicate message id"
#: what a file name of ours may not hold (paths.check_name's rule, plus control characters)
_NOT_IN_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


class InboundSteps(SettlementSteps):
    """Listing, claiming, holding and reading (see the module's docstring)."""

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
        for :meth:`redelivery_hold`, counted from now: the node that
        returned a message holds it from the moment it did, and every other node from the
        moment it first lists it, so no node hands a failing message round the cluster at
        once."""
        with self._lock:
            if len(self._held) + len(returned) > MAX_HELD:
                self._held.clear()
            for c in returned:
                count = c.envelope.headers.delivery_count
                self._held[c.name] = now + self.redelivery_hold(count)

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
                write_reason(t, target, reason, stage=layout.reason_stage, node_id=self.node_id)
            except TransportError as exc:
                log.warning("%s: %s: could not write its reason file: %s", self.name, target, exc)

    # ------------------------------------------------------------------ expired messages

    def is_expired(self, c: Candidate) -> bool:
        exp = c.envelope.headers.expiration
        return self.policy.expires and exp is not None and exp <= self.clock()

    def take_expired(self, limit: int | None = None) -> list[Candidate]:
        """Up to ``limit`` expired messages that listings found and nobody took yet."""
        with self._lock:
            names = list(self._expired)[:limit]
            return [self._expired.pop(n) for n in names]

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

    # ------------------------------------------------------------------ claiming

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

    def claim_from_journal(self, op: Operation) -> Claimed:
        """The claim a pending ``claim`` operation made (for reclaim and recovery)."""
        name = op.fields["src"].rsplit("/", 1)[-1]
        cand = self.layout.decode_name(name) or Candidate(name, UNKNOWN_SIZE, None, _plain(name))
        return Claimed(cand, op.fields["dst"], op.op_id)

    # ------------------------------------------------------------------ reading

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
        delay = self.redelivery_hold(count)
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


def _why(exc: Exception) -> str:
    """A failure as a reason line: its type and text."""
    return f"{type(exc).__name__}: {exc}"
