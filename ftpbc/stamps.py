"""Whole UTC seconds as text, each second formatted once.

Journal records and archived names carry a time to the millisecond, thousands of times a
second on a busy node; ``strftime`` of the seconds part costs more than the rest of such a
name, and it changes once a second.  Callers add their own fraction.
"""

from __future__ import annotations

import time

__all__ = ["WholeSeconds"]


class WholeSeconds:
    """``time.strftime(fmt)`` of whole UTC seconds since the epoch, the last second's text kept.

    Thread-safe without a lock: the cache is one tuple, replaced whole, so a reader sees a
    second with its own text; two threads that meet a new second at once both format it.
    """

    __slots__ = ("_format", "_last")

    def __init__(self, fmt: str) -> None:
        self._format = fmt
        self._last: tuple[int | None, str] = (None, "")

    def text(self, second: int) -> str:
        """The text of UTC second ``second`` (an integer count since the epoch)."""
        last = self._last
        if last[0] != second:
            last = (second, time.strftime(self._format, time.gmtime(second)))
            self._last = last
        return last[1]
