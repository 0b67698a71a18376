"""The figures in plain Python, one process, no Spark: the reference the Spark job is checked against.

Same inputs as the job's ``file://`` route (:func:`ftpbc.analytics.listing.scan_chunks`), same
per-name parser (:func:`ftpbc.analytics.records.parse_record`), and the definitions of
:mod:`ftpbc.analytics.figures` written out as loops over dicts: requests and replies grouped by
(endpoint, uuid), then per endpoint and bucket, and per node.  Percentiles use Spark's own
formula (pyspark 4.x: ``lower + (pos - floor(pos)) * (higher - lower)``, checked on 900 cases), so
that the two sides agree to the last bit, not only to a tolerance.

Used by ``bench/bench_aggregate.py`` (the "plain Python" column) and the aggregate tests; not part
of the package.  Not
guaranteed to scale: it holds every request of the archive in memory.  Local folders only (no
mirror, no compacted dataset, hence no de-duplication).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ftpbc.analytics.listing import scan_chunks
from ftpbc.analytics.records import IN_FOLDERS, UNCOLLECTED, parse_record
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource

PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
_EPOCH_NAIVE = datetime(1970, 1, 1)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Spark's ``percentile`` (exact, linear interpolation) of already sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lower, higher = math.floor(pos), math.ceil(pos)
    lo, hi = sorted_values[lower], sorted_values[higher]
    if higher == lower or lo == hi:
        return float(lo)
    return lo + (pos - lower) * (hi - lo)


@dataclass
class _Pair:
    """One (endpoint, uuid): its requests and replies folded as ``figures.pairs`` folds them."""

    has_request: bool = False
    t0_us: int | None = None
    t0_prec_us: int | None = None
    t0_from_name: bool = False
    failed: bool = False
    served: tuple[int, str | None] | None = None  # (stamp, node) of the earliest stamped request
    request_bytes: int = 0
    names: list[str] = field(default_factory=list)
    replied: bool = False
    has_response: bool = False
    has_error_reply: bool = False
    unreadable: bool = False
    swept: bool = False
    collected: tuple[int, str | None] | None = None
    response_bytes: int = 0


def _fold(p: _Pair, r: dict[str, Any]) -> None:
    folder, kind = r["folder"], r["kind"]
    if kind == "request" and folder in IN_FOLDERS:
        p.has_request = True
        t0 = r["name_time_us"] if r["name_time_us"] is not None else r["mtime_us"]
        prec = r["name_prec_us"] if r["name_time_us"] is not None else r["mtime_prec_us"]
        if t0 is not None:
            p.t0_us = t0 if p.t0_us is None else min(p.t0_us, t0)
        if prec is not None:
            p.t0_prec_us = prec if p.t0_prec_us is None else max(p.t0_prec_us, prec)
        p.t0_from_name |= r["name_time_us"] is not None
        p.failed |= folder == "inerror"
        if r["stamp_us"] is not None and (p.served is None or r["stamp_us"] < p.served[0]):
            p.served = (r["stamp_us"], r["node"])
        p.request_bytes += r["size"] or 0
        p.names.append(r["name"])
    elif kind in ("response", "error_reply") and folder in ("outarchive", "outerror"):
        p.replied = True
        p.has_response |= kind == "response" and folder == "outarchive"
        p.has_error_reply |= kind == "error_reply"
        p.unreadable |= folder == "outerror"
        p.swept |= r["node"] == UNCOLLECTED
        if (folder == "outarchive" and r["node"] is not None and r["node"] != UNCOLLECTED
                and r["stamp_us"] is not None
                and (p.collected is None or r["stamp_us"] < p.collected[0])):
            p.collected = (r["stamp_us"], r["node"])
        p.response_bytes += r["size"] or 0


@dataclass
class PlainResult:
    figures: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    unanswered: list[dict[str, Any]]


def _timestamp(us: int) -> datetime:
    # As Spark hands a TIMESTAMP to Python in a UTC session: naive, UTC.
    return _EPOCH_NAIVE + timedelta(microseconds=us)


def list_records(sources: Sequence[ArchiveSource]) -> list[dict[str, Any]]:
    """Every parsed record of these local (``file://``) areas."""
    out: list[dict[str, Any]] = []
    for s in sources:
        naming = s.naming()
        for folder in ARCHIVE_FOLDERS:
            path = Path(s.server.base) / s.folder_path(folder).lstrip("/")
            if not path.is_dir():
                continue
            for c in scan_chunks(str(path)):
                for name, size, mtime in zip(c.names, c.sizes, c.mtimes_us, strict=True):
                    out.append(parse_record({"endpoint": s.endpoint, "folder": folder, "name": name,
                                             "size": size, "mtime_us": mtime,
                                             "mtime_prec_us": c.precision_us}, naming))
    return out


def figures(records: Sequence[dict[str, Any]], bucket_us: int = 3_600_000_000,
            since_us: int | None = None, until_us: int | None = None) -> PlainResult:
    """Figures per endpoint and bucket, per node, and the unanswered requests, of parsed records."""
    pairs: dict[tuple[str, str], _Pair] = {}
    for r in records:
        if r["uuid"] is None:
            continue
        # figures.pairing_endpoint: a reply sent through a request's reply_to pairs there
        reply = r["kind"] in ("response", "error_reply") and r["folder"] in ("outarchive", "outerror")
        key = (r["reply_to"] if reply and r["reply_to"] is not None else r["endpoint"], r["uuid"])
        p = pairs.get(key)
        if p is None:
            p = pairs[key] = _Pair()
        _fold(p, r)
    groups: dict[tuple[str, int | None], dict[str, Any]] = {}
    served: dict[tuple[str, int | None, str | None], dict[str, Any]] = {}
    collected: dict[tuple[str, int | None, str | None], dict[str, Any]] = {}
    unanswered = []
    for (endpoint, uuid), p in pairs.items():
        if not p.has_request:
            continue
        t0 = p.t0_us
        if since_us is not None and (t0 is None or t0 < since_us):
            continue
        if until_us is not None and (t0 is None or t0 >= until_us):
            continue
        bucket = None if t0 is None else t0 - t0 % bucket_us
        g = groups.setdefault((endpoint, bucket), {
            "requests": 0, "responses": 0, "errors": 0, "unanswered": 0, "uncollected": 0,
            "unreadable": 0, "request_bytes": 0, "response_bytes": 0, "lat": [], "svc": [],
            "all_named": True, "prec": None})
        latency = (p.collected[0] - t0) / 1000.0 if p.collected is not None and t0 is not None else None
        service = (p.served[0] - t0) / 1000.0 if p.served is not None and t0 is not None else None
        g["requests"] += 1
        g["responses"] += p.has_response
        g["errors"] += p.failed or p.has_error_reply
        g["unanswered"] += not p.replied
        g["uncollected"] += p.swept
        g["unreadable"] += p.unreadable
        g["request_bytes"] += p.request_bytes
        g["response_bytes"] += p.response_bytes
        g["all_named"] &= p.t0_from_name
        g.setdefault("any_named", False)
        g["any_named"] |= p.t0_from_name
        if p.t0_prec_us is not None:
            g["prec"] = p.t0_prec_us if g["prec"] is None else max(g["prec"], p.t0_prec_us)
        if latency is not None:
            g["lat"].append(latency)
        if service is not None:
            g["svc"].append(service)
        server = p.served[1] if p.served is not None else None
        s = served.setdefault((endpoint, bucket, server), {"served": 0, "failed": 0, "svc": []})
        s["failed" if p.failed else "served"] += 1
        if service is not None:
            s["svc"].append(service)
        if p.collected is not None and p.collected[1] is not None:
            c = collected.setdefault((endpoint, bucket, p.collected[1]), {"collected": 0, "lat": []})
            c["collected"] += 1
            if latency is not None:
                c["lat"].append(latency)
        if not p.replied:
            unanswered.append({"endpoint": endpoint, "bucket": None if bucket is None else _timestamp(bucket),
                               "name": min(p.names), "uuid": uuid,
                               "submitted": None if t0 is None else _timestamp(t0), "node": server,
                               "failed": p.failed})
    rows = []
    for (endpoint, bucket), g in groups.items():
        lat, svc = sorted(g["lat"]), sorted(g["svc"])
        rows.append({
            "endpoint": endpoint, "bucket": None if bucket is None else _timestamp(bucket),
            **{k: g[k] for k in ("requests", "responses", "errors", "unanswered", "uncollected",
                                 "unreadable", "request_bytes", "response_bytes")},
            **{f"latency_{n}_ms": percentile(lat, q) for n, q in PERCENTILES},
            "latency_max_ms": lat[-1] if lat else None,
            **{f"service_{n}_ms": percentile(svc, q) for n, q in PERCENTILES},
            "service_max_ms": svc[-1] if svc else None,
            "t0_source": "name" if g["all_named"] else "name+mtime" if g["any_named"] else "mtime",
            "t0_precision_ms": None if g["prec"] is None else g["prec"] / 1000.0})
    nodes = []
    for nkey in set(served) | set(collected):
        s, c = served.get(nkey, {}), collected.get(nkey, {})
        svc, lat = sorted(s.get("svc", [])), sorted(c.get("lat", []))
        nodes.append({"endpoint": nkey[0], "bucket": None if nkey[1] is None else _timestamp(nkey[1]),
                      "node": nkey[2], "served": s.get("served", 0), "failed": s.get("failed", 0),
                      "collected": c.get("collected", 0),
                      "service_p50_ms": percentile(svc, 0.5), "service_p95_ms": percentile(svc, 0.95),
                      "latency_p50_ms": percentile(lat, 0.5), "latency_p95_ms": percentile(lat, 0.95)})
    order = ("endpoint", "bucket", "node")

    def sort_key(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((r[k] is not None, r[k]) for k in order if k in r)

    unanswered.sort(key=lambda r: (r["endpoint"], r["submitted"] is not None, r["submitted"], r["name"]))
    return PlainResult(sorted(rows, key=sort_key), sorted(nodes, key=sort_key), unanswered)


def run(sources: Sequence[ArchiveSource], bucket_us: int = 3_600_000_000) -> PlainResult:
    """List, parse and compute, all in this process."""
    return figures(list_records(sources), bucket_us)


__all__ = ["PlainResult", "figures", "list_records", "percentile", "run"]
