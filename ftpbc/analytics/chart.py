"""The PNG chart: requests per bucket and round-trip latency percentiles, one line per endpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def draw(rows: Sequence[Mapping[str, Any]], path: Path, *, bucket_label: str = "1h") -> Path:
    """Write the chart of ``rows`` (figures per endpoint and bucket) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    endpoints = sorted({r["endpoint"] for r in rows})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    styles = {"latency_p50_ms": "-", "latency_p95_ms": "--", "latency_p99_ms": ":"}
    for ep in endpoints:
        mine = sorted((r for r in rows if r["endpoint"] == ep), key=lambda r: r["bucket"])
        xs = [r["bucket"] for r in mine]
        (line,) = top.plot(xs, [r["requests"] for r in mine], marker="o", ms=3, label=ep)
        for col, style in styles.items():
            bottom.plot(xs, [r[col] if r[col] is not None else float("nan") for r in mine], style,
                        color=line.get_color(), label=f"{ep} {col.split('_')[1]}")
    top.set_ylabel(f"requests per {bucket_label}")
    top.set_title("ftpbc archives: requests and round-trip latency (UTC)")
    top.legend(loc="upper right", fontsize="small")
    top.grid(alpha=0.3)
    bottom.set_ylabel("round-trip latency, ms")
    bottom.set_xlabel("submit time (bucket start, UTC)")
    bottom.legend(loc="upper right", fontsize="x-small", ncol=max(1, len(endpoints)))
    bottom.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
