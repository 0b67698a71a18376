"""What the parts of the message lifecycle share (:mod:`ftpbc.exchange.lifecycle`): the state
of one layout as one node sees it (:class:`Steps`), and the values its steps hand each other
(:class:`Claimed`, :class:`Served`, :class:`Unread`...).

The lifecycle is built in floors, each a class over the one below: :class:`Steps` here, then
:class:`~ftpbc.exchange.outbound.OutboundSteps` (staging and exposing what goes out),
:class:`~ftpbc.exchange.settlement.SettlementSteps` (recording results and settling claimed
messages), :class:`~ftpbc.exchange.inbound.InboundSteps` (listing, claiming, holding and
reading), and :class:`~ftpbc.exchange.lifecycle.Lifecycle` on top, the one class callers use.
"""

from __future__ import annotations

import io
import posixpath
import threading
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from ftpbc.errors import FtpbcError, NotFound, OutcomeUnknown
from ftpbc.exchange.area import REASON_SUFFIX, archive_name, staged_reason_name
from ftpbc.exchange.bounds import DEFAULT_MAX_MESSAGE_BYTES
from ftpbc.exchange.capacity import Capacity
from ftpbc.exchange.layout import Candidate, Layout
from ftpbc.exchange.policy import DEFAULT_POLICY, QueuePolicy
from ftpbc.faults import crash_point
from ftpbc.journal import EndpointJournal
from ftpbc.metrics import NULL_OBSERVER, EndpointObserver
from ftpbc.transport.base import Transport

T = TypeVar("T")

#: ``Claimed.size`` of a claim found in the journal rather than in a listing
UNKNOWN_SIZE = -1
#: names a node holds back after a failed delivery, at most (the oldest holds are dropped)
MAX_HELD = 100_000
#: bytes of a reason file at most (a handler's exception text can be of any length)
MAX_REASON_BYTES = 64 * 1024
#: message ids a node remembers having settled (served, filed), to recognise a duplicate; the
#: oldest are forgotten past this many
REMEMBERED_IDS = 10_000


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


def rename_resolving(transport: Transport, src: str, dst: str) -> None:
    """Rename, resolving a lost reply (OutcomeUnknown) from the server's state.

    SourceGone propagates when ``src`` was never there.
    """
    try:
        transport.rename(src, dst)
    except OutcomeUnknown:
        if transport.exists(src):
            transport.rename(src, dst)


def reason_bytes(text: str) -> bytes:
    """A reason file's content: ``text`` in UTF-8 (what cannot be encoded backslash-escaped),
    cut to :data:`MAX_REASON_BYTES`, and a newline."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) >= MAX_REASON_BYTES:
        data = data[:MAX_REASON_BYTES - 1].decode("utf-8", "ignore").encode("utf-8")
    return data + b"\n"


def write_reason(transport: Transport, filed: str, text: str, *, stage: str, node_id: str,
                 keep_whole: bool = False) -> bool:
    """Write ``text`` as the reason file of the filed message ``filed`` (``<filed>.reason``);
    return whether it was written (False: a whole one was kept).  The one writer of reason files.

    Guaranteed: the reason file appears whole or not at all.  It is uploaded to ``stage`` (a
    directory on the same server that no listing takes messages or reasons from; the layout's
    :attr:`~ftpbc.exchange.layout.Layout.reason_stage`) under
    :func:`~ftpbc.exchange.area.staged_reason_name`, then renamed into place, and a rename
    replaces in one step (:mod:`ftpbc.transport.base`).  A crash between the two leaves the staged
    file only: a retry of the same reason replaces it (its name is fixed by the path), and the
    orphan search (this node, at its start) or the sweeper (a dead node's) removes one nobody
    retries.  With ``keep_whole`` (a retry, recovery) an existing reason of exactly the expected
    size is kept, and any other (empty or cut off: left by a release that wrote in place) is
    replaced.  Not guaranteed: that the reason is there at all when this raises (a
    TransportError: the caller decides whether the filing stands without it).
    """
    path = filed + REASON_SUFFIX
    data = reason_bytes(text)
    if keep_whole:
        try:
            if transport.stat(path).size == len(data):
                return False
        except NotFound:
            pass
    staged = f"{stage.rstrip('/')}/{staged_reason_name(path, node_id)}"
    try:
        transport.put(staged, io.BytesIO(data))
    except NotFound:
        # The stage directory was removed (or never made, a layout prepared by an older
        # release): make it and try once more.
        transport.mkdir(posixpath.dirname(staged))
        transport.put(staged, io.BytesIO(data))
    crash_point("reason.after-stage")
    rename_resolving(transport, staged, path)
    return True


class Hooks:
    """Callbacks the lifecycle calls at fixed points of its steps, for instrumentation (a test's
    log of what each node did, tracing), in the manner of a middleware: append a callable to a
    list of :data:`HOOKS`.  Process-wide (every lifecycle of the process), so set them before
    the steps run, at import for instance.

    Guaranteed: each callback of a point runs once each time a step passes the point, on the
    step's own thread, in the order appended, and never for a step that failed before the point.
    A callback observes; it must not raise (an exception would fail the step after the point,
    which then retries or leaves the message to recovery) nor block.  Not guaranteed: that a
    callback runs at all when the process is killed right at its point.
    """

    def __init__(self) -> None:
        #: ``(served)`` once a result, a filing or an adopted reply is durably recorded
        #: (:meth:`~ftpbc.exchange.settlement.SettlementSteps.served_durable`): from then on the
        #: handler never runs again for ``served.claimed``
        self.after_served_durable: list[Callable[[Served], None]] = []
        #: ``(stage path)`` just before a recorded reply (or a transfer's outbound file) is
        #: uploaded to its stage name, and once that upload has returned
        self.before_reply_staged: list[Callable[[str], None]] = []
        self.after_reply_staged: list[Callable[[str], None]] = []


#: the hooks of this process (:class:`Hooks`)
HOOKS = Hooks()


class Steps:
    """The state of one layout's lifecycle on one node, and its setup: what every floor of
    :class:`~ftpbc.exchange.lifecycle.Lifecycle` reads.  Thread-safe."""

    def __init__(self, layout: Layout, transport: Transport, journal: EndpointJournal, node_id: str, *,
                 max_deliveries: int = 5, redelivery_delay: float = 1.0, max_redelivery_delay: float = 300.0,
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
        self.max_redelivery_delay = max_redelivery_delay
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

    def redelivery_hold(self, count: int) -> float:
        """Seconds a message back in its box after delivery ``count`` is held: ``redelivery_delay``
        doubled per delivery, at most ``max_redelivery_delay``.  Capped because every node holds a
        message from its own first listing of it, a restarted one from scratch: an uncapped hold
        of a message returned many times would outlast every node's uptime."""
        doubled = self.redelivery_delay * 2.0 ** min(max(count - 1, 0), 60)
        return float(min(self.max_redelivery_delay, doubled))

    @property
    def max_message_bytes(self) -> int:
        """The layout's ``max_message_bytes`` (endpoints and transfers have it)."""
        config = getattr(self.layout, "config", None)
        return int(getattr(config, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES))

    def prepare(self) -> None:
        """Create the layout's directories that are missing (once per process)."""
        with self._lock:
            if self._prepared:
                return
            self.layout.prepare(self.transport)
            self._prepared = True

    def filed_dead(self, path: str) -> bool:
        """Whether ``path`` is in this layout's dead-letter directory."""
        dead = self.layout.dead_dir
        return bool(dead) and dead is not None and path.startswith(dead.rstrip("/") + "/")


def message_id_of(op_id: str) -> str:
    """The message id of a journal operation id (``<uuid>.<role>``)."""
    return op_id.rsplit(".", 1)[0]
