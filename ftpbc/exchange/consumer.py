"""Pull consumers: take one-way messages from an endpoint's inbox and acknowledge them.

A pull consumer is a client that competes with the serving nodes (and with other consumers) for
an endpoint's messages, through the very steps a serving node takes (:mod:`ftpbc.exchange.lifecycle`):

receive
    under the endpoint's poll lock (the one serving nodes take), list the inbox and claim the
    best message that the consumer's selector selects: a ``claim`` record in this identity's
    journal, then the rename ``inbox/X -> inselect/X~<identity>``; then, outside the lock, read
    it with the size check.  The claim is held while the client's heartbeat is alive.
ack
    what a serving node does once its handler returned nothing to send: a durable ``served``
    record, then the commit rename to ``inarchive`` (:meth:`Lifecycle.record_served` and
    :meth:`Lifecycle.finish_served`, the code nodes and recovery run).
nack(requeue=True)
    :meth:`Lifecycle.redeliver`: back to the inbox with its delivery count raised, held back
    from this client for ``redelivery_delay`` (doubling with each delivery, up to
    ``max_redelivery_delay``); at
    ``max_deliveries`` filed in ``inerror`` (``indead`` with ``dead_letter: true``).
nack(requeue=False)
    :meth:`Lifecycle.file_error`: filed at once, in ``indead`` with ``dead_letter: true`` or
    else ``inerror``, the reason beside it.

What is guaranteed
    * Two live consumers (or a consumer and a node) never hold one message at once: a claim is a
      rename, and exactly one rename of a file wins.
    * An acknowledged message is archived exactly once and never delivered again.
    * A message received and never acknowledged comes back: returned at once by ``nack``, by
      leaving a :class:`Consumer`'s ``with`` block or by closing the client; after the lease when
      the consumer died (any sweeper, a consumer's included, returns the claims of an identity
      whose heartbeat is older than ``node.lease``); or by the next start of the same identity
      (``Client`` replays its journal) or ``ftpbc recover``.  Each such return raises the
      message's delivery count, so a message that kills its consumers ends in the error (or
      dead-letter) directory after ``max_deliveries``.

What is not
    * Exactly-once processing: a consumer killed after processing a message and before its
      ack is recorded gets it processed again elsewhere (at least once, as JMS).  Once the ack
      is recorded the commit is finished by recovery, never undone.
    * A consumer that was only slow (its heartbeat older than the lease) loses its claims to a
      sweeper; its ``ack`` then returns False, and the message is delivered again.

Requests (``req.``) are not received: a request is answered by a handler (``ftpbc serve``), and
a pull consumer that took one could not reply, so its caller would wait for a response that
never comes.  A pull consumer receives one-way messages only; requests stay in the box.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import IO, Literal

from ftpbc import tracing
from ftpbc.errors import FtpbcError, TransportError
from ftpbc.exchange.layout import Candidate
from ftpbc.exchange.lifecycle import SPOOL_IN_MEMORY, Claimed, Disposition, Lifecycle, Unread
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.sweeper import Sweeper
from ftpbc.faults import crash_point
from ftpbc.model.envelope import Envelope, Headers, PropertyValue
from ftpbc.model.message import Message
from ftpbc.model.selector import Selector, compile_selector

log = logging.getLogger("ftpbc.consumer")

AckMode = Literal["auto", "client", "dups_ok"]
ACK_MODES: tuple[AckMode, ...] = ("auto", "client", "dups_ok")
#: journal role of a consumer's claims (op id ``<uuid>.receive``)
ROLE = "receive"
#: first wait after an empty poll; doubles up to the endpoint's poll_interval
FIRST_WAIT = 0.002
#: wait before trying a poll lock another consumer or node holds
LOCK_RETRY = 0.005
#: claims one poll tries before it lists again (each lost one was taken by another consumer)
CLAIM_TRIES = 8
#: expired messages one poll files (never delivered), so a queue without serving nodes is kept clean
EXPIRE_PER_POLL = 4
#: dups_ok: deliveries acknowledged together, at the latest
DUPS_OK_BATCH = 32
#: attempts of an acknowledgement's commit before ack() raises (a later ack() tries again)
ACK_ATTEMPTS = 3


class Delivery:
    """One message a pull consumer received and holds until it is settled: acknowledged
    (:meth:`ack`), given back (:meth:`nack`) or returned when its consumer ends.

    ``headers``, ``properties``, ``body``, ``stream`` and ``text()`` are the message's, as a
    handler sees them (:class:`ftpbc.Message`, which is :attr:`message`).
    ``state`` is ``received`` until settled, then ``acked``, ``requeued`` (back in the box),
    ``filed`` (in the error or dead-letter directory) or ``lost`` (a sweeper returned the claim
    while this consumer looked dead; the message is, or will be, delivered again).
    """

    def __init__(self, receiver: Receiver, claimed: Claimed, message: Message) -> None:
        self.endpoint = receiver.endpoint
        self.message = message
        self.state = "received"
        self._receiver = receiver
        self._claimed = claimed
        self._lock = threading.Lock()
        #: the ``served`` record's fields once the ack is recorded (it is then finished, never undone)
        self._acking: dict[str, str] | None = None
        self._fresh = True
        #: what ack() does: acknowledge this one, or (client mode) all up to it
        self._ack: Callable[[Delivery], bool] = receiver.ack

    # what the message carries

    @property
    def name(self) -> str:
        """The message's file name in the box (as :attr:`ftpbc.Message.name`)."""
        return self.message.name

    @property
    def uuid(self) -> str:
        """The message's id."""
        return self._claimed.uuid

    @property
    def size(self) -> int:
        """The body's length in bytes."""
        return self.message.size

    @property
    def headers(self) -> Headers:
        """The message's headers."""
        assert self.message.headers is not None  # Message fills it in
        return self.message.headers

    @property
    def properties(self) -> Mapping[str, PropertyValue]:
        """The message's typed properties (read-only)."""
        return self.message.properties

    @property
    def envelope(self) -> Envelope:
        """Headers and properties as the name carried them."""
        return self._claimed.candidate.envelope

    @property
    def body(self) -> bytes:
        """The whole body in memory."""
        return self.message.body

    @property
    def stream(self) -> IO[bytes]:
        """The body as a binary file, rewound to its start at each access."""
        return self.message.stream

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded; UnicodeDecodeError if it is not ``encoding``."""
        return self.message.text(encoding)

    @property
    def delivery_count(self) -> int:
        """Which delivery of the message this is, counting from 1 (JMSXDeliveryCount)."""
        return self.headers.delivery_count + 1

    @property
    def redelivered(self) -> bool:
        """Whether the message was handed out before (JMSRedelivered)."""
        return self.headers.delivery_count > 0

    # settling

    def ack(self) -> bool:
        """Acknowledge: the message is archived and never delivered again.  In a consumer with
        ``ack="client"``, every delivery received before this one and not settled yet is
        acknowledged too, first.

        True once committed; False if a claim had been lost (returned by a sweeper while this
        consumer looked dead: that message is delivered again).  Raises TransportError when the
        commit cannot be made now; the ack is recorded by then, and calling ack() again, closing
        the client or the identity's next recovery finishes it (it is never undone).
        """
        return self._ack(self)

    def nack(self, requeue: bool = True, reason: str | None = None) -> Disposition:
        """Give the message back: ``requeue`` to the box with its delivery count raised (at
        ``max_deliveries``, filed as an error or dead letter instead), else filed at once in the
        dead letters (``dead_letter: true``) or the error directory with ``reason`` beside it.
        Returns what was done.  Only this delivery is settled, whatever the ack mode."""
        return self._receiver.nack(self, requeue=requeue, reason=reason)

    def __repr__(self) -> str:
        return f"<Delivery {self.endpoint} {self.name} {self.state}>"


class Receiver:
    """The pull side of one endpoint for one client identity.  Thread-safe.

    Holds the endpoint's poll lock only while it lists and claims, and sweeps (as serving nodes
    do, every ``lease / 3`` at most, when it polls) so that the claims of dead consumers come
    back even where no node serves the endpoint.
    """

    def __init__(self, runtime: Runtime, endpoint: str) -> None:
        ep = runtime.config.endpoint(endpoint)
        self.endpoint = endpoint
        self.poll_interval = ep.poll_interval
        inbound, outbound = runtime.endpoint_lifecycles(endpoint)
        self.lifecycle: Lifecycle = inbound
        coordination = runtime.coordination
        self.poll_lock = coordination.poll_lock(endpoint, ep.lock)
        self.sweeper = Sweeper([inbound, outbound], coordination, uncollected_after=ep.uncollected_after)
        self._sweep_every = coordination.lease / 3
        self._next_sweep = 0.0
        self._closing = threading.Event()
        self._lock = threading.Lock()
        #: deliveries handed out and not settled, by op id
        self._outstanding: dict[str, Delivery] = {}
        #: claims whose return failed (a server error): retried by the next poll and at close
        self._stranded: list[Claimed] = []

    # ------------------------------------------------------------------ receiving

    def receive(self, timeout: float | None, selector: Selector | None = None) -> Delivery | None:
        """The next one-way message ``selector`` selects (all: None), waiting up to ``timeout``
        seconds (None: until :meth:`close`); None if none came.  Priority order, as nodes take
        them.  Raises what the server answers when listing or claiming fails."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = FIRST_WAIT
        started = time.time_ns() if tracing.enabled() else 0
        while not self._closing.is_set():
            self._housekeeping()
            with self.poll_lock.attempt() as held:
                claimed = self._claim(selector) if held else None
            if claimed is not None:
                delivery = self._read(claimed)
                if delivery is not None:
                    if started:
                        message = delivery.message
                        tracing.received(self.endpoint, started, message.properties, message_id=message.uuid,
                                         body_size=message.size, client_id=self.lifecycle.node_id)
                    return delivery
                continue  # that one could not be read (it was dealt with): look again at once
            pause = LOCK_RETRY if not held else wait
            if held:
                wait = min(wait * 2, self.poll_interval)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                pause = min(pause, left)
            self._closing.wait(pause)
        return None

    def _housekeeping(self) -> None:
        if self._stranded:
            self._return_stranded()
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_every
            try:
                self.sweeper.sweep()
            except FtpbcError as exc:  # housekeeping: the next one tries again
                log.warning("%s: sweep failed: %s", self.endpoint, exc)

    def _claim(self, selector: Selector | None) -> Claimed | None:
        """Under the poll lock: claim the best waiting message the selector selects."""
        lc = self.lifecycle
        waiting = lc.waiting()
        expired = lc.take_expired(EXPIRE_PER_POLL)
        if expired:
            lc.expire(expired)
        picks = [c for c in waiting if _receivable(c, selector)]
        for c in picks[:CLAIM_TRIES]:
            claimed, _ = lc.claim([c], ROLE)
            if not claimed:
                continue  # taken by another consumer or node since the listing
            got = claimed[0]
            if lc.is_expired(got.candidate):
                # expired since it was listed: never delivered, filed as a serving node files it
                try:
                    lc.finish_served(got.op_id, lc.record_expired(got), fresh=True)
                except TransportError as exc:  # recorded: this identity's recovery files it
                    log.warning("%s: %s expired but could not be filed yet: %s", self.endpoint, got.name, exc)
                continue
            return got
        return None

    def _read(self, claimed: Claimed) -> Delivery | None:
        """Read a claim (size-checked) into a delivery; None if it could not be read, in which
        case it went where a serving node would send it (back, or to the error directory)."""
        lc = self.lifecycle
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115 - the delivery owns it
        delivered = False
        try:
            try:
                got = lc.read_claim(claimed, spool)  # type: ignore[arg-type]
            except TransportError as again:
                # Not settled: handed to close() and recovery, never left claimed for nobody.
                self._strand(claimed, again)
                raise
            if isinstance(got, Unread):
                if got.kind != "lost":  # lost: returned by a sweeper, this identity looked dead
                    log.warning("%s: cannot read %s: %s; %s", self.endpoint, claimed.name, got.error,
                                got.disposition)
                return None
            delivered = True
        finally:
            if not delivered:
                spool.close()  # every path but a delivery: the spool may hold a file on disk
        crash_point("receive.after-read")
        env = claimed.candidate.envelope
        message = Message(self.endpoint, claimed.name, env.headers.id, claimed.size, spool,  # type: ignore[arg-type]
                          dict(claimed.candidate.values), env.headers, env.properties)
        delivery = Delivery(self, claimed, message)
        with self._lock:
            self._outstanding[claimed.op_id] = delivery
        return delivery

    # ------------------------------------------------------------------ settling

    def ack(self, d: Delivery) -> bool:
        """Acknowledge ``d`` alone (see :meth:`Delivery.ack`)."""
        lc = self.lifecycle
        with d._lock:
            if d.state == "acked":
                return True
            if d.state == "lost":
                return False
            if d.state != "received":
                raise ValueError(f"{d.name}: cannot acknowledge a delivery that was {d.state}")
            if d._acking is None:
                # What a serving node records when its handler returned nothing to send: from
                # here on the message is committed, by this call or by recovery, never returned.
                d._acking = lc.record_served(d._claimed, None, error=None)
            attempt = 0
            while True:
                fresh, d._fresh = d._fresh, False  # a retry re-checks the server (stat calls)
                try:
                    ok = lc.finish_served(d._claimed.op_id, d._acking, fresh=fresh)
                    break
                except TransportError:
                    attempt += 1
                    if attempt >= ACK_ATTEMPTS:
                        raise
                    self._closing.wait(0.05 * 2 ** attempt)
            d.state = "acked" if ok else "lost"
        self._settled(d)
        return ok

    def nack(self, d: Delivery, *, requeue: bool, reason: str | None) -> Disposition:
        """Requeue (delivery count raised) or file ``d`` (see :meth:`Delivery.nack`)."""
        lc = self.lifecycle
        why = reason or f"not acknowledged by consumer {lc.node_id}"
        with d._lock:
            if d._acking is not None or d.state != "received":
                raise ValueError(f"{d.name}: cannot give back a delivery that was "
                                 f"{'acknowledged' if d._acking is not None else d.state}")
            if requeue:
                what = lc.redeliver(d._claimed, why)
            else:
                what = lc.file_error(d._claimed, why, dead=lc.policy.dead_letter)
            d.state = {"returned": "requeued", "gone": "lost"}.get(what.kind, "filed")
        self._settled(d)
        log.info("%s: %s %s", self.endpoint, d.name, what)
        return what

    def give_back(self, d: Delivery) -> None:
        """Return an unsettled delivery (its consumer ended): requeued with its delivery count
        raised, as a claim of a dead node is; an ack already recorded is finished instead.  A
        server error is logged: the claim is then left to this identity's recovery, or to the
        lease once the client is closed."""
        try:
            if d._acking is not None:
                self.ack(d)
            elif d.state == "received":
                self.nack(d, requeue=True,
                          reason=f"returned unacknowledged by consumer {self.lifecycle.node_id}")
        except TransportError as exc:
            log.warning("%s: %s left claimed (recovery or the lease returns it): %s", self.endpoint,
                        d.name, exc)

    def _settled(self, d: Delivery) -> None:
        with self._lock:
            self._outstanding.pop(d._claimed.op_id, None)

    def _strand(self, claimed: Claimed, exc: Exception) -> None:
        log.warning("%s: could not return %s yet: %s", self.endpoint, claimed.name, exc)
        with self._lock:
            self._stranded.append(claimed)

    def _return_stranded(self) -> None:
        with self._lock:
            stranded, self._stranded = self._stranded, []
        for c in stranded:
            try:
                self.lifecycle.unclaim(c)
            except TransportError as exc:
                self._strand(c, exc)

    def close(self) -> None:
        """Wake waiting receives (they return None), return every unsettled delivery and
        release the locks' files."""
        self._closing.set()
        with self._lock:
            outstanding = list(self._outstanding.values())
        for d in outstanding:
            self.give_back(d)
        self._return_stranded()
        self.poll_lock.close()
        self.sweeper.lock.close()


class Consumer:
    """``with client.consume(endpoint, ...) as deliveries: for m in deliveries: ...``

    ``ack``:

    ``auto``
        a delivery is acknowledged when the loop asks for the next one, or when the ``with``
        block is left without an exception (the code that got it finished);
    ``client``
        nothing is acknowledged until ``m.ack()``, which acknowledges ``m`` and every delivery
        received before it that is not settled (JMS CLIENT_ACKNOWLEDGE; JMS also takes those
        received after ``m``, which a loop has not looked at yet: here they stay unacknowledged);
    ``dups_ok``
        as ``auto``, but acknowledged lazily, ``DUPS_OK_BATCH`` at a time and whenever the
        consumer is about to wait for messages: a consumer killed meanwhile has the ones not
        yet acknowledged delivered again (duplicates, as the name says).

    Leaving the ``with`` block returns every delivery not acknowledged to the box at once, its
    delivery count raised (it had been handed out), for any consumer or node to take.  The
    iteration ends when ``timeout`` seconds pass without a message (None: never; it then ends
    when the client is closed).  One consumer is used by one thread.
    """

    def __init__(self, receiver: Receiver, selector: Selector | None, ack: AckMode,
                 timeout: float | None) -> None:
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, got {ack!r}")
        self.receiver = receiver
        self.selector = selector
        self.mode = ack
        self.timeout = timeout
        #: deliveries handed out and not settled, in the order received
        self._unsettled: list[Delivery] = []
        #: the delivery the loop is working on (auto, dups_ok)
        self._current: Delivery | None = None
        #: dups_ok: finished deliveries whose acknowledgement is deferred
        self._done: list[Delivery] = []
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __iter__(self) -> Iterator[Delivery]:
        while not self._closed:
            self._moved_on()
            d = None
            if self._done:
                d = self.receiver.receive(0, self.selector)
                if d is None:
                    self._flush()  # about to wait: acknowledge what is finished first
            if d is None:
                d = self.receiver.receive(self.timeout, self.selector)
            if d is None:
                return
            if self.mode == "client":
                d._ack = self._ack_through
            self._unsettled.append(d)
            self._current = d
            yield d

    def _moved_on(self) -> None:
        """The loop is done with the current delivery: auto acknowledges it, dups_ok defers it."""
        d, self._current = self._current, None
        if d is None or d.state != "received" or self.mode == "client":
            return
        if self.mode == "auto":
            self.receiver.ack(d)
            self._forget()
            return
        self._done.append(d)
        if len(self._done) >= DUPS_OK_BATCH:
            self._flush()

    def _flush(self) -> None:
        done, self._done = self._done, []
        for d in done:
            if d.state == "received":
                self.receiver.ack(d)
        self._forget()

    def _ack_through(self, d: Delivery) -> bool:
        """Client mode: acknowledge every unsettled delivery up to ``d``, oldest first."""
        if d not in self._unsettled:
            return self.receiver.ack(d)  # settled already (True if acked)
        upto = self._unsettled.index(d) + 1
        ok = True
        for each in self._unsettled[:upto]:
            if each.state == "received":
                ok = self.receiver.ack(each) and ok
        self._forget()
        return ok and d.state == "acked"

    def _forget(self) -> None:
        self._unsettled = [d for d in self._unsettled if d.state == "received"]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._closed = True
        try:
            if exc_type is None:
                self._moved_on()  # auto, dups_ok: the last one was finished too
            else:
                self._current = None
            self._flush()  # dups_ok: what the loop had finished is acknowledged, even on an error
        finally:
            for d in self._unsettled:
                if d.state == "received":
                    self.receiver.give_back(d)
            self._unsettled = []


def as_selector(selector: str | Selector | None) -> Selector | None:
    """A compiled selector (text is compiled: SelectorError, one line naming the column)."""
    return compile_selector(selector) if isinstance(selector, str) else selector


def _receivable(c: Candidate, selector: Selector | None) -> bool:
    """One-way messages (requests are for handlers) that ``selector`` selects."""
    env = c.envelope
    if env.headers.kind == "request":
        return False
    return selector is None or selector.matches(env.headers, env.properties)


__all__ = ["ACK_MODES", "AckMode", "Consumer", "Delivery", "Receiver", "as_selector"]
