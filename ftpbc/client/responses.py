"""The client's response poller: one per endpoint, collecting the responses every waiting request
of this process expects (docs/architecture.md, "The life of a request").

One listing of ``outbox`` finds all the responses that have arrived, whatever the number of
waiting threads.  While requests are outstanding it polls soon after a poll that found nothing
(backing off up to ``poll_interval``); with none outstanding it sends nothing at all.  A
response is handed to its caller once read; a poll that fails leaves its claims to the next
poll (or to :meth:`ResponsePoller.close`, else to the next start's recovery), never lost.
"""

from __future__ import annotations

import functools
import io
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from ftpbc.cluster.liveness import LoopGuard
from ftpbc.errors import FtpbcError, RequestExpired
from ftpbc.exchange.layout import Candidate
from ftpbc.exchange.lifecycle import Claimed, Lifecycle, Unread
from ftpbc.faults import crash_point
from ftpbc.model.envelope import ERROR_TYPE, EXPIRED_TYPE

log = logging.getLogger("ftpbc.client")

FIRST_BACKOFF = 0.002
#: how much longer each empty poll waits than the one before, up to poll_interval, while requests
#: are outstanding.  Gentle: with several callers a response comes every few milliseconds, and
#: doubling would leave one that comes after a few empty polls waiting much longer than that gap
#: for its pick-up.  poll_interval is still reached, within a few dozen empty polls.
BACKOFF_GROWTH = 1.25
#: responses found by one poll are read and archived by up to this many threads at once
DELIVERY_THREADS = 4


class ResponsePoller:
    """Collects the responses of ``endpoint`` for every request of this process waiting for one
    (:meth:`wait_for`), on a thread of its own; :meth:`close` cancels the waits left."""

    def __init__(self, endpoint: str, lifecycle: Lifecycle, poll_interval: float) -> None:
        self.endpoint = endpoint
        self.lifecycle = lifecycle
        self.poll_interval = poll_interval
        self._waiters: dict[str, Future[tuple[bytes, bool]]] = {}
        self._cv = threading.Condition()
        self._closed = False
        self._stranded = True  # a process that crashed with this node id may have left claims
        #: requests whose response this poller handed to a caller: collected, never again
        self.delivered = Recent()
        self._delivery: ThreadPoolExecutor | None = None
        self._closing = threading.Event()
        self._guard = LoopGuard(f"response poller {endpoint}", None, self._closing,
                                first_wait=poll_interval, logger=log)
        self._thread = threading.Thread(target=self._run, name=f"responses-{endpoint}", daemon=True)
        self._thread.start()

    def wait_for(self, uuid: str) -> Future[tuple[bytes, bool]]:
        """The future of ``uuid``'s response; callers waiting for the same UUID share one."""
        with self._cv:
            idle = not self._waiters
            fut = self._waiters.get(uuid)
            if fut is None:
                fut = self._waiters[uuid] = Future()
            if idle:
                # Wake an idle poller; a polling one takes the new request in at its next poll
                # (waking it here would cost a listing per request, made before any response
                # can be there).
                self._cv.notify_all()
        return fut

    def forget(self, uuid: str) -> None:
        with self._cv:
            self._waiters.pop(uuid, None)

    def is_waiting(self, uuid: str) -> bool:
        with self._cv:
            return uuid in self._waiters

    def _run(self) -> None:
        delay = FIRST_BACKOFF
        while True:
            with self._cv:
                while not self._waiters and not self._closed:
                    self._cv.wait()
                    delay = FIRST_BACKOFF
                if self._closed:
                    return
                wanted = set(self._waiters)
            # Never dies: any error is logged once per kind, and the guard backs off.  No liveness
            # is reported: with nothing outstanding this loop is idle on purpose.
            found = self._guard.run(functools.partial(self._poll, wanted))
            if found is None:
                self._stranded = True  # a claim may be left in outselect: finish it next poll
                continue
            if found:
                delay = FIRST_BACKOFF
                continue
            with self._cv:
                if not self._closed:
                    self._cv.wait(delay)
            delay = min(delay * BACKOFF_GROWTH, self.poll_interval)

    def _poll(self, wanted: set[str]) -> int:
        lc = self.lifecycle
        if self._stranded:
            self._reclaim(wanted)
            self._stranded = False
        picks = [c for c in lc.waiting() if correlation(c) in wanted]
        claimed, _ = lc.claim(picks, "collect")
        for c in claimed:
            log.debug("%s: claimed response %s", self.endpoint, c.name,
                      extra={"endpoint": self.endpoint, "message_id": correlation(c.candidate)})
        self._deliver_all(claimed)
        return len(claimed)

    def _deliver_all(self, claimed: list[Claimed]) -> None:
        """Deliver the responses one poll claimed, several at once.

        Each takes a read and an archive rename, two round trips or more, and one after the
        other they would keep each response, and the next poll, waiting for those claimed with
        it; so they are delivered on up to DELIVERY_THREADS threads.  The poll returns once
        every one is delivered; a failure leaves this method as it would leave a serial loop,
        after the others are done.
        """
        if len(claimed) <= 1:
            for c in claimed:
                self._deliver(c)
            return
        if self._delivery is None:
            self._delivery = ThreadPoolExecutor(DELIVERY_THREADS,
                                                thread_name_prefix=f"deliver-{self.endpoint}")
        others = [self._delivery.submit(self._deliver, c) for c in claimed[1:]]
        try:
            self._deliver(claimed[0])
        finally:
            for f in others:
                f.exception()  # wait for every one, whatever happened to the first
        for f in others:
            f.result()

    def _reclaim(self, wanted: set[str]) -> None:
        """Finish the claims a failed poll left in outselect (its claim, read, archive or unclaim
        failed): no other node returns them, since this node is alive, and no listing of outbox
        finds them again.  Archived when already delivered, delivered when still awaited, else
        returned to outbox."""
        lc = self.lifecycle
        for op in lc.journal.pending():
            if op.kind != "claim" or not op.op_id.endswith(".collect"):
                continue
            claimed = lc.claim_from_journal(op)
            if "delivered" in op.events:
                lc.finish_collect(claimed)
            elif correlation(claimed.candidate) in wanted:
                self._deliver(claimed)
            else:
                lc.unclaim(claimed)

    def _deliver(self, claimed: Claimed) -> None:
        lc = self.lifecycle
        buf = io.BytesIO()
        got = lc.read_claim(claimed, buf)
        if isinstance(got, Unread):
            if got.kind != "lost":  # lost: returned by a sweeper; seen next poll
                log.warning("%s: cannot read %s: %s; %s", self.endpoint, claimed.name, got.error,
                            got.disposition)
            return
        crash_point("collect.after-read")
        uid = correlation(claimed.candidate)
        with self._cv:
            fut = self._waiters.pop(uid, None)
        if fut is None:
            # The caller gave up meanwhile: leave the response for a later collect of its UUID.
            lc.unclaim(claimed)
            return
        self.delivered.add(uid)
        result = (buf.getvalue(), claimed.candidate.envelope.headers.type == ERROR_TYPE)
        settle = functools.partial(_settle, fut, result, self.endpoint, uid,
                                   claimed.candidate.envelope.headers.type == EXPIRED_TYPE)
        try:
            lc.finish_collect(claimed)
        except FtpbcError as exc:
            # The answer is in hand: a failed archive rename (its reply lost, say) must not cost
            # the caller its response.  Marked delivered only once handed over, so a crash before
            # that still returns the response to the outbox; the next poll archives it.
            log.warning("%s: read %s but could not archive it yet: %s", self.endpoint, claimed.name, exc)
            settle()
            self._stranded = True
            lc.mark_delivered(claimed)
            return
        log.debug("%s: collected response %s: %d bytes, archived", self.endpoint, claimed.name,
                  len(result[0]), extra={"endpoint": self.endpoint, "message_id": uid})
        settle()

    def close(self) -> None:
        self._closing.set()
        with self._cv:
            self._closed = True
            for fut in self._waiters.values():
                fut.cancel()
            self._waiters.clear()
            self._cv.notify_all()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            if self._delivery is not None:
                self._delivery.shutdown(wait=True)
            # Tidy what a failed poll left claimed (delivered responses archived, the rest
            # returned to outbox); what fails here is finished by the next start's recovery.
            try:
                self._reclaim(set())
            except FtpbcError as exc:
                log.warning("%s: claimed responses left for recovery: %s", self.endpoint, exc)



def _settle(fut: Future[tuple[bytes, bool]], result: tuple[bytes, bool], endpoint: str, uid: str,
            expired: bool) -> None:
    """Complete a caller's wait: with the response, or RequestExpired for an expiry reply."""
    if expired:
        fut.set_exception(RequestExpired(endpoint, uid, result[0].decode("utf-8", "replace").strip()))
    else:
        fut.set_result(result)



def correlation(c: Candidate) -> str:
    """The request a response answers."""
    return c.envelope.headers.correlation_id or c.uuid



class Recent:
    """A set of the last ``limit`` things added (thread-safe): a long-lived client forgets the
    oldest rather than grow without bound."""

    def __init__(self, limit: int = 100_000) -> None:
        self._items: OrderedDict[object, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, item: object) -> None:
        with self._lock:
            self._items[item] = None
            if len(self._items) > self._limit:
                self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        with self._lock:
            return item in self._items

