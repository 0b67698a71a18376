"""The claims a poller's workers hold, and what each is doing: one bookkeeping for providers,
routes and fan-outs.

A claim is *handling* from the moment a worker takes it until its outcome is recorded (the
handler runs, a route decides, a fan-out stages its copies), then *finishing* while that
outcome is delivered (commit, reply).  At shutdown, past the drain timeout, the handling claims
are handed back to their box for other nodes (:meth:`InFlight.hand_back`) and marked abandoned,
so that a worker that comes back from its handler afterwards records nothing
(:meth:`InFlight.finishing` says False); finishing claims are never handed back, since their
outcome is recorded and must be delivered (by this process, or by its recovery).

Guaranteed: a claim is either handed back or finished, never both, whatever the interleaving of
a worker and the shutdown (one lock decides each claim's state).  Not guaranteed: a hand-back
that fails (the server is away) leaves the claim to this node's recovery or to the lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ftpbc.exchange.lifecycle import Claimed

log = logging.getLogger("ftpbc.provider")

HANDLING = "handling"
FINISHING = "finishing"


class InFlight:
    """The claims in workers' hands.  Thread-safe."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: op id -> (claim, HANDLING or FINISHING)
        self._claims: dict[str, tuple[Claimed, str]] = {}
        #: op ids handed back at shutdown while their worker still had them
        self._abandoned: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, claimed: Claimed) -> Iterator[None]:
        """A worker holds ``claimed`` for the block (handling, until :meth:`finishing`)."""
        with self._lock:
            self._claims[claimed.op_id] = (claimed, HANDLING)
        try:
            yield
        finally:
            with self._lock:
                self._claims.pop(claimed.op_id, None)
                self._abandoned.discard(claimed.op_id)

    def finishing(self, claimed: Claimed) -> bool:
        """Mark ``claimed``'s outcome as being delivered (a shutdown no longer hands it back);
        False if the shutdown handed it back already: its worker must then record nothing."""
        with self._lock:
            if claimed.op_id in self._abandoned:
                return False
            self._claims[claimed.op_id] = (claimed, FINISHING)
            return True

    def any_finishing(self) -> bool:
        """Whether an outcome is still being delivered."""
        with self._lock:
            return any(state == FINISHING for _, state in self._claims.values())

    def hand_back(self, unclaim: Callable[[Claimed], None]) -> tuple[int, int]:
        """Return every handling claim to its box (``unclaim``), marking it abandoned first;
        ``(returned, handling)``.  A claim that cannot be returned is logged and left to this
        node's recovery, or to the lease."""
        with self._lock:
            handling = [c for c, state in self._claims.values() if state == HANDLING]
            self._abandoned.update(c.op_id for c in handling)
        returned = 0
        for c in handling:
            try:
                unclaim(c)
                returned += 1
            except Exception as exc:  # left for the lease, or for this node's recovery
                log.warning("%s: could not return %s at shutdown: %s", self.name, c.name, exc)
        return returned, len(handling)
