"""Liveness of a node's background loops, and the guard every loop runs its steps under.

A heartbeat says "my claims are mine"; it must never go on over a dead poller, or the claims of
a node that no longer works would never be returned.  So every loop (poller, response poller,
sweeper, heartbeat) reports progress to a :class:`Liveness`, and the heartbeat beats only while
every registered loop progressed within half the lease: a node whose loops are stuck stops its
heartbeat, other nodes see it dead after the lease and take its work over, and it says so.
A loop in the middle of a step (a poll over a slow link) is given longer, ``step_within``: a
slow but live node keeps beating, a stuck one stops.

The node's :class:`~ftpbc.cluster.lease.Lease` travels with its liveness (:attr:`Liveness.lease`):
the pollers that report progress here are the ones that must not claim once it is over.

:class:`LoopGuard` is what keeps a loop from dying: any exception of a step is caught, logged
once per distinct error with its traceback (repeats are counted, not logged again), and the loop
backs off (tenacity's exponential wait with jitter) and goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tenacity import RetryCallState, wait_exponential_jitter

from ftpbc.errors import TransportError

if TYPE_CHECKING:
    from ftpbc.cluster.lease import Lease

log = logging.getLogger("ftpbc.liveness")

T = TypeVar("T")

#: distinct errors a guard remembers having logged (then it starts afresh)
REMEMBERED_ERRORS = 1000


class Liveness:
    """When each registered loop last made progress.  Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, lease: Lease | None = None) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        #: loops in the middle of a step (see LoopGuard.run)
        self._stepping: set[str] = set()
        self._lock = threading.Lock()
        #: this node's lease, which its pollers check before claiming (None: never fenced)
        self.lease = lease

    def progress(self, loop: str) -> None:
        with self._lock:
            self._last[loop] = self._clock()

    def stepping(self, loop: str, busy: bool) -> None:
        """``loop`` starts (``busy``) or ends a step; its progress is reported apart."""
        with self._lock:
            if busy:
                self._stepping.add(loop)
            else:
                self._stepping.discard(loop)

    def forget(self, loop: str) -> None:
        """A loop that ended on purpose (a stopped poller) is no longer watched."""
        with self._lock:
            self._last.pop(loop, None)
            self._stepping.discard(loop)

    def stuck(self, within: float, step_within: float | None = None) -> list[tuple[str, float]]:
        """Loops with no progress for more than ``within`` seconds, or ``step_within`` for a
        loop in the middle of a step (default: ``within`` too): ``(name, seconds)``."""
        now = self._clock()
        slow = within if step_within is None else step_within
        with self._lock:
            return sorted((name, now - t) for name, t in self._last.items()
                          if now - t > (slow if name in self._stepping else within))

    def health(self, within: float, step_within: float | None = None) -> Callable[[], str | None]:
        """For :class:`~ftpbc.cluster.heartbeat.Heartbeat`: None while every loop progressed
        within ``within`` seconds (``step_within`` for one in the middle of a step), else why
        not.  A loop whose steps fail is not in a step while it backs off: ``within`` applies."""
        def check() -> str | None:
            stuck = self.stuck(within, step_within)
            if not stuck:
                return None
            return ", ".join(f"{name} made no progress for {age:.0f} s" for name, age in stuck)
        return check


class LoopGuard:
    """Runs one step of a background loop so that nothing kills the loop.

    ``run(step)`` returns the step's result, or None after a failure, having logged it and
    waited (``stop.wait``, so a stopping node does not sleep through its shutdown).  The first
    occurrence of each distinct error is logged with its traceback, later ones are counted and
    summed up at the next success.  Waits grow from ``first_wait`` to ``max_wait``.
    """

    def __init__(self, loop: str, liveness: Liveness | None, stop: threading.Event, *,
                 first_wait: float, max_wait: float = 30.0, logger: logging.Logger = log) -> None:
        self.loop = loop
        self.liveness = liveness
        self.stop = stop
        self.log = logger
        self._wait = wait_exponential_jitter(multiplier=first_wait, max=max(max_wait, first_wait),
                                             jitter=first_wait)
        self._failures = 0
        self._seen: set[tuple[str, str]] = set()
        self._repeats = 0
        if liveness is not None:
            liveness.progress(loop)

    def progress(self) -> None:
        """The loop is alive and working (or idle on purpose)."""
        if self.liveness is not None:
            self.liveness.progress(self.loop)

    def run(self, step: Callable[[], T]) -> T | None:
        if self.liveness is not None:
            self.liveness.stepping(self.loop, True)
        try:
            result = step()
        except Exception as exc:  # the loop's boundary: nothing may kill it
            self._stepped()
            self._failed(exc)
            return None
        if self._failures:
            self.log.warning("%s: working again after %d failure(s)%s", self.loop, self._failures,
                             f" ({self._repeats} repeated)" if self._repeats else "")
            self._failures = self._repeats = 0
        self.progress()
        self._stepped()  # after its progress: a long step is never judged by ``within`` meanwhile
        return result

    def _stepped(self) -> None:
        if self.liveness is not None:
            self.liveness.stepping(self.loop, False)

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        signature = (type(exc).__name__, str(exc)[:200])
        if signature in self._seen:
            self._repeats += 1
            self.log.debug("%s: failed again: %s: %s", self.loop, *signature)
        else:
            if len(self._seen) >= REMEMBERED_ERRORS:
                self._seen.clear()
            self._seen.add(signature)
            self.log.warning("%s: failed: %s: %s", self.loop, type(exc).__name__, exc,
                             exc_info=not _expected(exc))
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = self._failures
        self.stop.wait(self._wait(state))


def _expected(exc: Exception) -> bool:
    """Errors whose traceback says nothing more than their message (a server that is down)."""
    return isinstance(exc, TransportError)
