"""The figures in plain Python, in this process: the engine for small archives, and the reference.

``ftpbc aggregate --engine plain`` (and ``auto`` below its threshold, :mod:`ftpbc.analytics.job`)
computes here what :mod:`ftpbc.analytics.figures` computes with Spark, from the same inputs
(:class:`~ftpbc.analytics.listing.Input`: local folders listed by
:func:`~ftpbc.analytics.listing.scan_chunks`, mirror parts, compacted parts), with the reference
name parser (:func:`ftpbc.analytics.records.parse_record`) and the same definitions written out as
loops over dicts: requests and replies folded per (endpoint, uuid) (a reply in the endpoint its
reply-to names, when it went through a request's ``reply_to``), then per endpoint and bucket,
and per node; the provenance table in the same pass (:class:`Provenance`).  Percentiles use
Spark's own formula (``lower + (pos - floor(pos)) * (higher - lower)``), so that both engines
agree to the last bit, not only to a tolerance; the tests compare every output of the two.

Guaranteed: the same rows as the Spark job for the same inputs, window and de-duplication.
Not guaranteed: scaling.  It runs on one core and holds one small object per (endpoint, uuid)
of the archive (and, when records may repeat, one per file), so its memory grows with the
archive; a Spark start costs seconds, which is why small archives are computed here.

No pyspark import: this engine runs where Spark and Java are not installed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ftpbc.analytics.listing import Input, scan_chunks
from ftpbc.analytics.records import IN_FOLDERS, RAW_FIELDS, REQUEST_SIDE, UNCOLLECTED, parse_record
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource

PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
_EPOCH_NAIVE = datetime(1970, 1, 1)
_RAW_NAMES = tuple(n for n, _ in RAW_FIELDS)
#: the raw columns a compacted part is read for (never ``body``)
_COMPACTED_COLUMNS = [n for n in _RAW_NAMES if n != "endpoint"]
#: the longest mirror line read (a mirror line is one listed name with its size and time)
MAX_MIRROR_LINE = 64 * 1024


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


@dataclass(frozen=True)
class Window:
    """The time bucket and the submit-time range (``--bucket``, ``--since``, ``--until``), in
    microseconds: what both engines compute over."""

    bucket_us: int = 3_600_000_000
    since_us: int | None = None
    until_us: int | None = None


@dataclass(slots=True)
class _Pair:
    """One (endpoint, uuid): its requests and replies folded as ``figures.pairs`` folds them."""

    has_request: bool = False
    t0_us: int | None = None
    t0_prec_us: int | None = None
    t0_from_name: bool = False
    failed: bool = False
    served: tuple[int, str | None] | None = None  # (stamp, node) of the earliest stamped request
    request_bytes: int | None = None  # None while no request had a size, as Spark's sum
    name: str | None = None  # the least request name (the unanswered list names it)
    replied: bool = False
    has_response: bool = False
    has_error_reply: bool = False
    unreadable: bool = False
    swept: bool = False
    collected: tuple[int, str | None] | None = None
    response_bytes: int = 0


def _fold(p: _Pair, r: Mapping[str, Any]) -> None:
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
        if r["size"] is not None:
            p.request_bytes = (p.request_bytes or 0) + r["size"]
        if p.name is None or r["name"] < p.name:
            p.name = r["name"]
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
    #: the records folded (:func:`compute`: the requests and replies read)
    records: int = 0


def _timestamp(us: int) -> datetime:
    # As Spark hands a TIMESTAMP to Python in a UTC session: naive, UTC.
    return _EPOCH_NAIVE + timedelta(microseconds=us)


# ----------------------------------------------------------------------------- inputs

def _mirror_records(path: str, endpoint: str) -> Iterator[dict[str, Any]]:
    """A mirror part's records of ``endpoint``, as Spark reads them with the raw schema: a line
    that is not a JSON object, or of another endpoint, is skipped; a value of the wrong type is
    null.  A line longer than :data:`MAX_MIRROR_LINE` is skipped (the mirror writes none)."""
    with open(path, "rb") as fh:
        while line := fh.readline(MAX_MIRROR_LINE + 1):
            if len(line) > MAX_MIRROR_LINE and not line.endswith(b"\n"):
                while (rest := fh.readline(MAX_MIRROR_LINE + 1)) and not rest.endswith(b"\n"):
                    pass
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict) or obj.get("endpoint") != endpoint:
                continue
            rec: dict[str, Any] = {}
            for key, kind in RAW_FIELDS:
                v = obj.get(key)
                number = isinstance(v, int) and not isinstance(v, bool)
                rec[key] = v if (isinstance(v, str) if kind == "string" else number) else None
            if isinstance(rec["folder"], str) and isinstance(rec["name"], str):
                yield rec


def _compacted_records(path: str, endpoint: str) -> Iterator[dict[str, Any]]:
    """A compacted part's metadata columns (never ``body``), a row group at a time."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    for i in range(pf.num_row_groups):
        for row in pf.read_row_group(i, columns=_COMPACTED_COLUMNS).to_pylist():
            yield {"endpoint": endpoint, **row}


def raw_records(inputs: Iterable[Input]) -> Iterator[dict[str, Any]]:
    """The raw records (:data:`~ftpbc.analytics.records.RAW_FIELDS`) of every input, one at a time."""
    for inp in inputs:
        if inp.kind == "dir":
            for c in scan_chunks(inp.path):
                for name, size, mtime in zip(c.names, c.sizes, c.mtimes_us, strict=True):
                    yield {"endpoint": inp.endpoint, "folder": inp.folder, "name": name, "size": size,
                           "mtime_us": mtime, "mtime_prec_us": c.precision_us}
        elif inp.kind == "mirror":
            yield from _mirror_records(inp.path, inp.endpoint)
        else:
            yield from _compacted_records(inp.path, inp.endpoint)


def _relevant(r: Mapping[str, Any]) -> bool:
    """A request (expired and dead-lettered ones too: listed for the provenance table only, and
    not counted by :func:`figures`, which looks at ``IN_FOLDERS``) or a reply."""
    kind, folder = r["kind"], r["folder"]
    return ((kind == "request" and folder in REQUEST_SIDE)
            or (kind in ("response", "error_reply") and folder in ("outarchive", "outerror")))


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def parsed_records(inputs: Iterable[Input], namings: Mapping[str, Mapping[str, str]], *,
                   dedupe: bool) -> Iterator[dict[str, Any]]:
    """Requests and replies of ``inputs``, parsed with their endpoint's naming.

    ``dedupe`` merges records of one (endpoint, folder, name) as the Spark job's ``relevant``
    does (largest size, earliest mtime, coarsest precision, earliest stamp and name time): it
    holds every such file once before the first is handed on.
    """
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for raw in raw_records(inputs):
        naming = namings.get(raw["endpoint"])
        if naming is None:
            continue
        r = parse_record(raw, naming)
        if not _relevant(r):
            continue
        if not dedupe:
            yield r
            continue
        key = (r["endpoint"], r["folder"], r["name"])
        seen = merged.get(key)
        if seen is None:
            merged[key] = r
            continue
        seen["size"] = _most(seen["size"], r["size"])
        seen["mtime_us"] = _least(seen["mtime_us"], r["mtime_us"])
        seen["mtime_prec_us"] = _most(seen["mtime_prec_us"], r["mtime_prec_us"])
        seen["stamp_us"] = _least(seen["stamp_us"], r["stamp_us"])
        seen["name_time_us"] = _least(seen["name_time_us"], r["name_time_us"])
        seen["name_prec_us"] = _most(seen["name_prec_us"], r["name_prec_us"])
    yield from merged.values()


def list_records(sources: Sequence[ArchiveSource]) -> list[dict[str, Any]]:
    """Every parsed record (of every kind) of these local (``file://``) areas."""
    out: list[dict[str, Any]] = []
    for s in sources:
        naming = s.naming()
        for folder in ARCHIVE_FOLDERS:
            path = Path(s.server.base) / s.folder_path(folder).lstrip("/")
            if path.is_dir():
                out.extend(parse_record(raw, naming)
                           for raw in raw_records([Input("dir", str(path), s.endpoint, folder)]))
    return out


# ----------------------------------------------------------------------------- figures

def figures(records: Iterable[Mapping[str, Any]], bucket_us: int = 3_600_000_000,
            since_us: int | None = None, until_us: int | None = None) -> PlainResult:
    """Figures per endpoint and bucket, per node, and the unanswered requests, of parsed records.

    Records are folded one at a time: only one object per (endpoint, uuid) is held.
    """
    pairs: dict[tuple[str, str], _Pair] = {}
    n = 0
    for r in records:
        n += 1
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
            "unreadable": 0, "request_bytes": None, "response_bytes": 0, "lat": [], "svc": [],
            "all_named": True, "any_named": False, "prec": None})
        latency = (p.collected[0] - t0) / 1000.0 if p.collected is not None and t0 is not None else None
        service = (p.served[0] - t0) / 1000.0 if p.served is not None and t0 is not None else None
        g["requests"] += 1
        g["responses"] += p.has_response
        g["errors"] += p.failed or p.has_error_reply
        g["unanswered"] += not p.replied
        g["uncollected"] += p.swept
        g["unreadable"] += p.unreadable
        if p.request_bytes is not None:
            g["request_bytes"] = (g["request_bytes"] or 0) + p.request_bytes
        g["response_bytes"] += p.response_bytes
        g["all_named"] &= p.t0_from_name
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
                               "name": p.name, "uuid": uuid,
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

    unanswered.sort(key=unanswered_order)
    return PlainResult(sorted(rows, key=sort_key), sorted(nodes, key=sort_key), unanswered, n)


def unanswered_order(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """The unanswered list's order, Spark's (nulls first): endpoint, submit time, name, uuid."""
    return (r["endpoint"], r["submitted"] is not None, r["submitted"], r["name"] is not None,
            r["name"] or "", r["uuid"])


def compute(inputs: Sequence[Input], namings: Mapping[str, Mapping[str, str]], *, bucket_us: int,
            since_us: int | None = None, until_us: int | None = None, dedupe: bool = False,
            provenance: Provenance | None = None) -> PlainResult:
    """The job's computation on these inputs (``dedupe`` as :func:`parsed_records`); every
    record also folded into ``provenance`` when given, in the same pass."""
    records: Iterable[Mapping[str, Any]] = parsed_records(inputs, namings, dedupe=dedupe)
    if provenance is not None:
        records = provenance.watch(records)
    return figures(records, bucket_us, since_us, until_us)


def run(sources: Sequence[ArchiveSource], bucket_us: int = 3_600_000_000) -> PlainResult:
    """List, parse and compute these local areas' archives, all in this process."""
    inputs = [Input("dir", str(path), s.endpoint, folder) for s in sources for folder in ARCHIVE_FOLDERS
              if (path := Path(s.server.base) / s.folder_path(folder).lstrip("/")).is_dir()]
    return compute(inputs, {s.endpoint: s.naming() for s in sources}, bucket_us=bucket_us)


# ----------------------------------------------------------------------------- outputs

#: Spark's column order and Parquet types of the unanswered list (``figures.unanswered``)
UNANSWERED_COLUMNS = ("endpoint", "bucket", "name", "uuid", "submitted", "node", "failed")


def _csv_cell(v: Any) -> str:
    """A value as Spark's CSV writer puts it with its defaults: times in ISO 8601 to the ms
    with the zone (UTC: ``Z``), booleans in lower case, null empty, an empty string ``""``, and
    a value holding a comma, quote or line break, or starting or ending with a space, quoted
    (quotes escaped by ``\\``; a name holding a backslash is not checked against Spark)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime):
        return f"{v:%Y-%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}Z"
    text = str(v)
    if text == "":
        return '""'
    if any(c in text for c in ',"\\\n\r') or text != text.strip():
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def write_unanswered(rows: Sequence[Mapping[str, Any]], parquet_dir: Path, csv_dir: Path) -> None:
    """The unanswered list as the Spark job writes it: a Parquet dataset of one part (times as
    Spark's INT96) and a CSV dataset of one part with a header, each with its ``_SUCCESS``."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("endpoint", pa.string()), ("bucket", pa.timestamp("us")), ("name", pa.string()),
                        ("uuid", pa.string()), ("submitted", pa.timestamp("us")), ("node", pa.string()),
                        ("failed", pa.bool_())])
    for d in (parquet_dir, csv_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    table = pa.Table.from_pylist([{k: r[k] for k in UNANSWERED_COLUMNS} for r in rows], schema=schema)
    pq.write_table(table, parquet_dir / "part-00000.snappy.parquet", compression="snappy",
                   use_deprecated_int96_timestamps=True)
    with open(csv_dir / "part-00000.csv", "w", encoding="utf-8", newline="") as fh:
        fh.write(",".join(UNANSWERED_COLUMNS) + "\n")
        for r in rows:
            fh.write(",".join(_csv_cell(r[k]) for k in UNANSWERED_COLUMNS) + "\n")
    for d in (parquet_dir, csv_dir):
        (d / "_SUCCESS").touch()


# ----------------------------------------------------------------------------- provenance

#: the provenance table's columns and Parquet types (``figures.provenance``'s, in its order)
PROVENANCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("endpoint", "string"), ("id", "string"), ("kind", "string"), ("name", "string"),
    ("sent_at", "timestamp"), ("modified_at", "timestamp"), ("archived_at", "timestamp"),
    ("archived_by", "string"), ("response_at", "timestamp"), ("response_by", "string"),
    ("response_endpoint", "string"), ("outcome", "string"), ("correlation_id", "string"),
    ("reply_to", "string"))


def _earliest_by(best: tuple[int, str | None] | None, stamp: int | None,
                 node: str | None) -> tuple[int, str | None] | None:
    """Spark's ``min_by(node, stamp)``: the node of the earliest stamp (null stamps skipped); a
    tie goes to the smaller node, where Spark takes whichever it met first."""
    if stamp is None:
        return best
    if best is None or (stamp, node or "") < (best[0], best[1] or ""):
        return (stamp, node)
    return best


class Provenance:
    """``figures.provenance`` in plain Python: records folded one by one (:meth:`watch`), then
    one row per request (:meth:`rows`), the same rows as Spark's (the tests compare them).

    Holds one small dict per (endpoint, id) of the archive, as :func:`figures` does.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], dict[str, Any]] = {}

    def watch(self, records: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        """``records``, each folded here on its way through."""
        for r in records:
            self.fold(r)
            yield r

    def fold(self, r: Mapping[str, Any]) -> None:
        kind, folder, uid = r["kind"], r["folder"], r["uuid"]
        req = kind == "request" and folder in REQUEST_SIDE
        rep = kind in ("response", "error_reply") and folder in ("outarchive", "outerror")
        if not (req or rep) or uid is None:
            return
        pair = r["reply_to"] if rep and r["reply_to"] is not None else r["endpoint"]
        g = self._groups.get((pair, uid))
        if g is None:
            g = self._groups[(pair, uid)] = {
                "request": False, "name": None, "sent": None, "modified": None, "archived": None,
                "by": None, "correlation_id": None, "reply_to": None, "dead": False, "expired": False,
                "failed": False, "error_reply": False, "replied": False, "response": None,
                "response_by": None, "response_endpoint": None}
        if req:
            g["request"] = True
            g["name"] = _least_text(g["name"], r["name"])
            g["sent"] = _least(g["sent"], r["name_time_us"])
            g["modified"] = _least(g["modified"], r["mtime_us"])
            g["archived"] = _least(g["archived"], r["stamp_us"])
            g["by"] = _earliest_by(g["by"], r["stamp_us"], r["node"])
            g["correlation_id"] = _least_text(g["correlation_id"], r["correlation_id"])
            g["reply_to"] = _least_text(g["reply_to"], r["reply_to"])
            g["dead"] |= folder == "indead"
            g["expired"] |= folder == "inexpired"
            g["failed"] |= folder == "inerror"
        else:
            g["replied"] = True
            g["error_reply"] |= kind == "error_reply"
            g["response"] = _least(g["response"], r["stamp_us"])
            g["response_by"] = _earliest_by(g["response_by"], r["stamp_us"], r["node"])
            g["response_endpoint"] = _least_text(g["response_endpoint"], r["endpoint"])

    def rows(self, since_us: int | None = None, until_us: int | None = None) -> list[dict[str, Any]]:
        out = []
        for (endpoint, uid), g in self._groups.items():
            if not g["request"]:
                continue
            t0 = g["sent"] if g["sent"] is not None else g["modified"]
            if since_us is not None and (t0 is None or t0 < since_us):
                continue
            if until_us is not None and (t0 is None or t0 >= until_us):
                continue
            outcome = ("dead-lettered" if g["dead"] else "expired" if g["expired"]
                       else "error" if g["failed"] or g["error_reply"] else "answered" if g["replied"]
                       else "unanswered")

            def when(us: int | None) -> datetime | None:
                return None if us is None else _timestamp(us)

            out.append({
                "endpoint": endpoint, "id": uid, "kind": "request", "name": g["name"],
                "sent_at": when(g["sent"]), "modified_at": when(g["modified"]),
                "archived_at": when(g["archived"]), "archived_by": g["by"][1] if g["by"] else None,
                "response_at": when(g["response"]),
                "response_by": g["response_by"][1] if g["response_by"] else None,
                "response_endpoint": g["response_endpoint"], "outcome": outcome,
                "correlation_id": g["correlation_id"], "reply_to": g["reply_to"]})
        out.sort(key=lambda r: (r["endpoint"], r["id"]))
        return out


def _least_text(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else min(a, b)


def write_provenance(rows: Sequence[Mapping[str, Any]], directory: Path) -> None:
    """The provenance table as a Parquet dataset of one part (times as Spark's INT96)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "timestamp": pa.timestamp("us")}
    schema = pa.schema([(n, types[t]) for n, t in PROVENANCE_COLUMNS])
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), directory / "part-00000.snappy.parquet",
                   compression="snappy", use_deprecated_int96_timestamps=True)
    (directory / "_SUCCESS").touch()


__all__ = ["PROVENANCE_COLUMNS", "PlainResult", "Provenance", "Window", "compute", "figures", "list_records",
           "parsed_records", "percentile", "raw_records", "run", "unanswered_order", "write_provenance",
           "write_unanswered"]
