"""One progress display over every phase of an aggregation, and when to draw bars.

A run goes through phases (:data:`PHASES`: the listing, the engine chosen, the Spark start, the
parsing, the figures, the outputs, and the provenance table when asked for); each ends with a
:class:`Phase`: its name, the seconds since the run started, and its counts.  The
:class:`Display` hands every finished phase to a ``report`` callable (the command writes it on
stderr: a text line, or a JSON object under ``--log-format json``), and, given a terminal,
keeps one live line below the finished ones: the running phase, the seconds so far, and what it
is at (the folder being mirrored, Spark's tasks done of the running stages).  Off a terminal
there is no live line: a log file or a pipe would keep every redraw, so it gets the phase lines
only.

Guaranteed: every phase a run goes through is reported once, in order, with its counts, on a
terminal or not; the live line is erased before a phase line is written and when the display
closes, so that it never mixes with them.  Not guaranteed: how often the live line is redrawn
(about twice a second), nor that it shows a status at all (a status that fails is left out).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

log = logging.getLogger(__name__)

#: the phases of a run, in order (``provenance`` only with ``--provenance``; the plain engine
#: has no ``spark`` nor ``parsing``: it reads and parses as it folds, in ``figures``)
PHASES = ("listing", "engine", "spark", "parsing", "figures", "outputs", "provenance")
#: erase the terminal line the cursor is on, from its start
_ERASE = "\r\x1b[K"


def bar_wanted(progress: bool) -> bool:
    """True when a bar was asked for (``progress``) and stderr, where tqdm draws, is a terminal.

    tqdm redraws its bar with carriage returns; written to a log file or a pipe, every frame
    stays there and the file fills with them, so a bar is drawn on a terminal only.
    """
    return progress and sys.stderr.isatty()


@dataclass(frozen=True)
class Phase:
    """A finished phase: ``text`` says its counts in words, ``counts`` as numbers."""

    name: str
    elapsed_s: float
    text: str
    counts: Mapping[str, int] = field(default_factory=dict)

    def line(self) -> str:
        """``[  12.3 s] parsing: 40,400 records (20,000 requests, 20,200 replies)``"""
        return f"[{self.elapsed_s:6.1f} s] {self.name}: {self.text}"


class Display:
    """The phases of one run, reported as they end; a live line on ``live`` (a terminal) if given.

    Use as a context manager: the live line's redrawing thread stops, and the line is erased,
    when the block ends, also when it raises.
    """

    def __init__(self, report: Callable[[Phase], None] | None, *, live: TextIO | None = None,
                 interval: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self._report = report
        self._live = live
        self._interval = interval
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._phase: str | None = None
        self._status: Callable[[], str] | None = None
        self._text = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status_failed = False

    def __enter__(self) -> Display:
        if self._live is not None:
            self._thread = threading.Thread(target=self._redraw_loop, name="aggregate-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def elapsed(self) -> float:
        return self._clock() - self._started

    def begin(self, name: str, status: Callable[[], str] | None = None) -> None:
        """``name`` is running; ``status`` (called from the redrawing thread) says what it is at."""
        with self._lock:
            self._phase, self._status, self._text = name, status, ""
        self._draw()

    def status(self, text: str) -> None:
        """What the running phase is at, for the live line (nothing off a terminal)."""
        with self._lock:
            self._text = text
        self._draw()

    def end(self, name: str, text: str, **counts: int) -> Phase:
        """``name`` is done: reported with its counts, the live line erased first."""
        phase = Phase(name, round(self.elapsed(), 1), text, dict(counts))
        with self._lock:
            self._phase, self._status, self._text = None, None, ""
            self._erase()
            if self._report is not None:
                self._report(phase)
        return phase

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._erase()

    # -------------------------------------------------------------- the live line

    def _erase(self) -> None:
        if self._live is not None:
            self._live.write(_ERASE)
            self._live.flush()

    def _draw(self) -> None:
        if self._live is None:
            return
        with self._lock:
            if self._phase is None:
                return
            status = self._text
            if self._status is not None and not self._status_failed:
                try:
                    status = self._status() or status
                except Exception as exc:  # a status is a nicety: the phase goes on without it
                    self._status_failed = True
                    log.debug("progress status of %s failed: %s", self._phase, exc)
            line = f"aggregate [{self.elapsed():6.1f} s] {self._phase}..." + (f" {status}" if status else "")
            self._live.write(_ERASE + line)
            self._live.flush()

    def _redraw_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._draw()
            except Exception:  # the terminal went away: keep going without the line, say why once
                log.warning("progress line stopped", exc_info=True)
                return
