"""Fault injection: kill this process with SIGKILL at a named step, to test recovery.

Set ``FTPBC_CRASH_AT`` to a point name (``send.after-put``), optionally with ``@N`` to crash at
the N-th time the point is reached (``serve.after-commit@3``).  Several points may be given,
separated by commas.  Unset, :func:`crash_point` costs one dictionary lookup.

The points, in the order a request meets them (``POINTS``), sit between every journal write and
every remote write on both sides, and inside recovery.  Endpoints and transfers share them: both
run the one lifecycle of :mod:`ftpbc.exchange.lifecycle`.
"""

from __future__ import annotations

import os
import signal
import threading

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


def crash_point(name: str) -> None:
    """SIGKILL this process if ``FTPBC_CRASH_AT`` names this point (and its count is reached)."""
    if name not in _targets:
        return
    with _lock:
        _seen[name] = _seen.get(name, 0) + 1
        if _seen[name] >= _targets[name]:
            os.kill(os.getpid(), signal.SIGKILL)
