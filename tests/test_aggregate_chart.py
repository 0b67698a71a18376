"""The aggregate chart's axes fit the figures it is given (inspected on the figure, not in pixels)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates

from ftpbc.analytics.chart import NO_LATENCY, draw, figure

HOUR_US = 3_600_000_000
T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def row(bucket: datetime, requests: int, p50: float | None, endpoint: str = "quote") -> dict[str, Any]:
    return {"endpoint": endpoint, "bucket": bucket, "requests": requests,
            "latency_p50_ms": p50, "latency_p95_ms": None if p50 is None else p50 * 2,
            "latency_p99_ms": None if p50 is None else p50 * 3}


def x_limits(fig: Any) -> tuple[datetime, datetime]:
    lo, hi = fig.axes[0].get_xlim()
    return mdates.num2date(lo), mdates.num2date(hi)


def test_one_bucket_gets_an_x_range_around_it_and_its_latency_is_drawn(tmp_path: Path) -> None:
    fig = figure([row(T, 7, 40.0)], bucket_us=HOUR_US)
    lo, hi = x_limits(fig)
    assert lo <= T and hi >= T + timedelta(hours=1)
    assert hi - lo <= timedelta(hours=3)  # hours around the bucket, not years
    latency = fig.axes[1]
    drawn = [line.get_ydata() for line in latency.get_lines()]
    assert sorted(float(y[0]) for y in drawn) == [40.0, 80.0, 120.0]
    assert all(line.get_marker() == "o" for line in latency.get_lines())  # one point is visible
    lo_y, hi_y = latency.get_ylim()
    assert lo_y <= 40.0 and hi_y >= 120.0
    assert draw([row(T, 7, 40.0)], tmp_path / "c.png", bucket_us=HOUR_US).read_bytes()[:4] == b"\x89PNG"


def test_x_range_spans_every_bucket_of_every_endpoint() -> None:
    rows = [row(T + timedelta(minutes=15 * i), i + 1, 10.0 + i) for i in range(8)]
    rows.append(row(T + timedelta(hours=5), 3, None, endpoint="stock"))
    fig = figure(rows, bucket_us=15 * 60_000_000, bucket_label="15m")
    lo, hi = x_limits(fig)
    assert lo <= T < T + timedelta(minutes=15) and hi >= T + timedelta(hours=5, minutes=15)
    assert hi - lo <= timedelta(hours=6)
    assert {line.get_label() for line in fig.axes[0].get_lines()} == {"quote", "stock"}
    # stock has no latency: no empty series for it, quote's series carry its eight buckets
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert labels == ["quote p50", "quote p95", "quote p99"]
    p50 = fig.axes[1].get_lines()[0].get_ydata()
    assert [float(y) for y in p50] == [10.0 + i for i in range(8)]


def test_no_latency_at_all_is_said_in_the_panel() -> None:
    fig = figure([row(T, 2, None)], bucket_us=HOUR_US)
    assert fig.axes[1].get_lines() == []
    assert [t.get_text() for t in fig.axes[1].texts] == [NO_LATENCY]
    assert not any(math.isnan(v) for v in fig.axes[0].get_xlim())
