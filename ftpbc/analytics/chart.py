"""The PNG chart: requests per bucket and round-trip latency percentiles, one line per endpoint.

The x range is set from the buckets themselves (first bucket start to last bucket end, half a
bucket of margin each side): left to matplotlib, a single date point gets a range of years.
Every point carries a marker, so a series of one bucket is visible; a latency panel without any
latency (no collected reply in range) says so in words rather than staying blank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

_LATENCY = {"latency_p50_ms": "-", "latency_p95_ms": "--", "latency_p99_ms": ":"}
NO_LATENCY = "no collected reply in this range: no round-trip latency"


def x_range(buckets: Sequence[datetime], bucket_us: int) -> tuple[datetime, datetime]:
    """The chart's x limits: every bucket whole (start to start + bucket), half a bucket of margin."""
    width = timedelta(microseconds=bucket_us)
    return min(buckets) - width / 2, max(buckets) + width + width / 2


def figure(rows: Sequence[Mapping[str, Any]], *, bucket_label: str = "1h",
           bucket_us: int = 3_600_000_000) -> Figure:
    """The chart of ``rows`` (figures per endpoint and bucket) as a figure not yet written anywhere.

    Built on :class:`matplotlib.figure.Figure` directly (no pyplot): no global figure registry,
    no display backend, nothing left open when the caller drops it.
    """
    import matplotlib.dates as mdates

    endpoints = sorted({r["endpoint"] for r in rows})
    fig = Figure(figsize=(11, 7))
    top, bottom = fig.subplots(2, 1, sharex=True)
    any_latency = False
    for ep in endpoints:
        mine = sorted((r for r in rows if r["endpoint"] == ep), key=lambda r: r["bucket"])
        xs = [r["bucket"] for r in mine]
        (line,) = top.plot(xs, [r["requests"] for r in mine], marker="o", ms=3, label=ep)
        for col, style in _LATENCY.items():
            ys = [float(r[col]) if r.get(col) is not None else math.nan for r in mine]
            if all(math.isnan(y) for y in ys):
                continue
            any_latency = True
            bottom.plot(xs, ys, style, marker="o", ms=3, color=line.get_color(),
                        label=f"{ep} {col.split('_')[1]}")
    if rows:
        top.set_xlim(*x_range([r["bucket"] for r in rows], bucket_us))
        locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
        bottom.xaxis.set_major_locator(locator)
        bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    top.set_ylim(bottom=0)
    top.set_ylabel(f"requests per {bucket_label}")
    top.set_title("ftpbc archives: requests and round-trip latency (UTC)")
    if endpoints:
        top.legend(loc="upper right", fontsize="small")
    top.grid(alpha=0.3)
    bottom.set_ylabel("round-trip latency, ms")
    bottom.set_xlabel("submit time (bucket start, UTC)")
    if any_latency:
        bottom.set_ylim(bottom=0)
        bottom.legend(loc="upper right", fontsize="x-small", ncol=max(1, len(endpoints)))
    else:
        bottom.text(0.5, 0.5, NO_LATENCY, transform=bottom.transAxes, ha="center", va="center")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def draw(rows: Sequence[Mapping[str, Any]], path: Path, *, bucket_label: str = "1h",
         bucket_us: int = 3_600_000_000) -> Path:
    """Write the chart of ``rows`` (see :func:`figure`) to ``path`` as a PNG."""
    fig = figure(rows, bucket_label=bucket_label, bucket_us=bucket_us)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
