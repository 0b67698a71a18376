"""Fault injection: kill this process with SIGKILL at a named step, to test recovery.

Also ``FTPBC_FAIL`` (see :data:`FAILURES`): errors injected at a rate, for the chaos test's
nemesis (a flaky poll lock).

Set ``FTPBC_CRASH_AT`` to a point name (``send.after-put``), optionally with ``@N`` to crash at
the N-th time the point is reached (``serve.after-commit@3``).  Several points may be given,
separated by commas.  Unset, :func:`crash_point` costs one dictionary lookup.
``FTPBC_CRASH_SIGNAL`` (``INT``, ``TERM``; default ``KILL``) sends another signal instead, once:
an interrupt (Ctrl-C) or a stop request arriving at exactly that step.

The points, in the order a request meets them (``POINTS``), sit between every journal write and
every remote write on both sides, and inside recovery.  Endpoints and transfers share them: both
run the one lifecycle of :mod:`ftpbc.exchange.lifecycle`.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
from collections.abc import Callable

POINTS = (
    # client: sending a request
    "send.after-intent", "send.after-put", "send.after-expose",
    # provider: claiming and serving
    "claim.after-intent", "claim.after-rename",
    "serve.after-result", "serve.after-stage", "serve.after-commit", "serve.after-expose",
    # client: collecting the response
    "collect.after-intent", "collect.after-claim", "collect.after-read", "collect.after-archive",
    # recovery itself
    "recover.before-op", "recover.after-op",
    # ftpbc dlq replay: a dead letter back to its box
    "replay.after-intent", "replay.after-rename",
    # ftpbc replay: an archived message's copy noted as begun, then sent (before noted done)
    "archive-replay.after-begin", "archive-replay.after-send",
    # a transaction (Client.transaction): each member staged, the commit record, the first exposed
    "tx.after-stage", "tx.after-commit-record", "tx.after-first-expose",
    # a pull consumer (Client.receive, consume, ftpbc receive): read, not yet handed over
    "receive.after-read",
    # a route (routes:): decided, staged at the destination, renamed into place, source committed
    "route.after-decide", "route.after-stage", "route.after-expose", "route.after-commit",
    # a topic's fan-out (docs/topics.md): its copies named, every copy staged, the commit record,
    # the first copy out
    "fanout.after-intent", "fanout.after-stage", "fanout.after-commit-record", "fanout.after-first-expose",
    # a reason file (a failed, refused, expired or dead-lettered message's): uploaded to its
    # stage name, not yet renamed beside the message
    "reason.after-stage",
)

_targets: dict[str, int] = {}
_seen: dict[str, int] = {}
_lock = threading.Lock()


def _parse(spec: str) -> dict[str, int]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in POINTS:
            raise ValueError(f"FTPBC_CRASH_AT: unknown point {name!r} (known: {', '.join(POINTS)})")
        out[name] = int(nth) if nth else 1
    return out


_targets = _parse(os.environ.get("FTPBC_CRASH_AT", ""))


def _parse_signal(name: str) -> signal.Signals:
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise ValueError(f"FTPBC_CRASH_SIGNAL: unknown signal {name!r} (e.g. KILL, INT, TERM)") from None


_signal = _parse_signal(os.environ.get("FTPBC_CRASH_SIGNAL", "KILL"))

#: errors ``FTPBC_FAIL=point=rate,...`` injects (``poll-lock=0.05``: one poll lock in twenty fails
#: as flock does on an NFS mount without locks)
FAILURES: dict[str, Callable[[], BaseException]] = {
    "poll-lock": lambda: OSError(errno.ENOLCK, f"{os.strerror(errno.ENOLCK)} (injected by FTPBC_FAIL)"),
}


def _parse_rates(spec: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, rate = item.partition("=")
        if name not in FAILURES:
            raise ValueError(f"FTPBC_FAIL: unknown point {name!r} (known: {', '.join(FAILURES)})")
        out[name] = float(rate or 1)
    return out


_rates = _parse_rates(os.environ.get("FTPBC_FAIL", ""))
_random = random.Random()


def fail_point(name: str) -> None:
    """Raise the injected error of ``name`` at the rate ``FTPBC_FAIL`` gives (unset: never)."""
    rate = _rates.get(name)
    if rate is not None and _random.random() < rate:
        raise FAILURES[name]()


def crash_point(name: str) -> None:
    """SIGKILL this process if ``FTPBC_CRASH_AT`` names this point (and its count is reached);
    send ``FTPBC_CRASH_SIGNAL`` instead, once, when that is set."""
    if name not in _targets:
        return
    with _lock:
        _seen[name] = _seen.get(name, 0) + 1
        if _seen[name] < _targets[name]:
            return
        if _signal != signal.SIGKILL:
            del _targets[name]  # a signal the process survives comes once
    os.kill(os.getpid(), _signal)
