"""The submit time and UUID a request's name carries, read with the endpoint's message_name.

A request is named ``<request_prefix><expansion of message_name>``.  When the pattern has date
fields (``%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S``...) the name says when the client created it, in
the endpoint's time zone; that is the best submit time there is.  Its precision is the finest
field present: ``S`` 1 ms, ``s`` 1 s, ``m`` 1 min, an hour letter 1 h, a day letter 1 day.
A pattern without a year, month or day (``%H%m%s`` alone) does not say *which* day, so it is not
used: the caller falls back to the file's modification time.

Parsing itself is ``ftpbc.patterns`` (its grammar and matcher); this module only turns the
extracted fields into an instant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from ftpbc.patterns.grammar import DateField, parse
from ftpbc.patterns.match import UUID_RE, Matcher

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UUID = re.compile(UUID_RE, re.IGNORECASE)

#: precision in microseconds of each date letter (the finest present wins)
_PRECISION_US = {"S": 1_000, "s": 1_000_000, "m": 60_000_000,
                 "H": 3_600_000_000, "k": 3_600_000_000, "K": 3_600_000_000, "h": 3_600_000_000,
                 "d": 86_400_000_000, "D": 86_400_000_000}


@dataclass(frozen=True)
class NameFacts:
    uuid: str | None
    #: microseconds since the epoch (UTC), or None when the name carries no usable time
    time_us: int | None
    precision_us: int | None


class NameReader:
    """Reads one endpoint's request names (the part after the request prefix)."""

    def __init__(self, message_name: str, timezone: str = "UTC") -> None:
        tokens = parse(message_name)
        self.matcher = Matcher(tokens)
        self.zone = ZoneInfo(timezone)
        letters = {t.letter for t in tokens if isinstance(t, DateField)}
        has_day = "y" in letters and ({"M", "d"} <= letters or "D" in letters)
        finest = [p for letter, p in _PRECISION_US.items() if letter in letters]
        self.precision_us: int | None = min(finest) if has_day and finest else None

    def read(self, expansion: str) -> NameFacts:
        match = self.matcher.match(expansion)
        if match is None:
            found = _UUID.search(expansion)  # a foreign name: still pair it if it has a UUID
            return NameFacts(found.group(0).lower() if found else None, None, None)
        when = self._instant(match.values) if self.precision_us is not None else None
        us = (when - EPOCH) // timedelta(microseconds=1) if when is not None else None
        return NameFacts(match.uuid, us, self.precision_us if us is not None else None)

    def _instant(self, values: dict[str, Any]) -> datetime | None:
        def num(*keys: str) -> int | None:
            for k in keys:
                if k in values:
                    return int(values[k])
            return None

        year = num("yyyy", "yyy", "y")
        if year is None:
            two = num("yy")
            year = 2000 + two if two is not None else None
        month, day = num("MM", "M"), num("dd", "d")
        doy = num("DDD", "DD", "D")
        hour = num("HH", "H")
        if hour is None:
            k = num("kk", "k")
            hour = (k % 24) if k is not None else None
        if hour is None:
            h12, ampm = num("hh", "h", "KK", "K"), values.get("a")
            if h12 is not None:
                hour = (h12 % 12) + (12 if str(ampm).upper() == "PM" else 0)
        try:
            if year is None:
                return None
            if month is not None and day is not None:
                base = datetime(year, month, day, tzinfo=self.zone)
            elif doy is not None:
                base = datetime.fromordinal(datetime(year, 1, 1).toordinal() + doy - 1).replace(
                    tzinfo=self.zone)
            else:
                return None
            return base.replace(hour=hour or 0, minute=num("mm", "m") or 0, second=num("ss", "s") or 0,
                                microsecond=(num("SSS", "SS", "S") or 0) * 1000)
        except ValueError:
            return None


@lru_cache(maxsize=256)
def reader_for(message_name: str, timezone: str) -> NameReader:
    """One reader per (pattern, zone) per process: Spark's Python workers build each once."""
    return NameReader(message_name, timezone)
