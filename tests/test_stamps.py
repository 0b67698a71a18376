"""Time stamps in archived names and journal records: each whole second formatted once, and
never the text of another second (the cache must follow the clock, also back and across zones)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from ftpbc.exchange.area import STAMP_FORMAT, parse_stamp, stamp
from ftpbc.journal import store
from ftpbc.stamps import WholeSeconds


def test_a_stamp_is_the_utc_time_to_the_millisecond_whatever_came_before() -> None:
    start = datetime(2026, 11, 26, 23, 59, 58, 998_765, tzinfo=UTC)
    # forward across seconds, a day and a year's end, then back in time, then in other zones
    steps = [timedelta(microseconds=n * 333_331) for n in range(12)]
    times = [start + s for s in steps] + [start - s for s in steps]
    times += [t.astimezone(ZoneInfo(z)) for t in times[:6] for z in ("Asia/Kolkata", "America/St_Johns")]
    times += [datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)]
    for when in times:
        utc = when.astimezone(UTC)
        expected = f"{utc.strftime(STAMP_FORMAT)}.{utc.microsecond // 1000:03d}Z"
        assert stamp(when) == expected, when
        assert parse_stamp(stamp(when)) == utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def test_whole_seconds_follow_any_order_of_seconds() -> None:
    texts = WholeSeconds("%Y-%m-%d %H:%M:%S")
    for second in (0, 1, 1, 86_399, 86_400, 1, 1_790_000_000, 1_789_999_999):
        assert texts.text(second) == datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_a_journal_record_carries_the_time_it_was_written() -> None:
    before = time.time()
    text = store._now()
    after = time.time()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text), text
    written = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert int(before * 1000) / 1000 <= written <= after
