"""Listing records: their schemas, and the per-name parser that Spark and the plain pass share.

A *raw* record is one directory entry of an archive folder, as any source gives it::

    endpoint, folder, name, size, mtime_us, mtime_prec_us

``mtime_us`` is microseconds since the epoch (UTC); ``mtime_prec_us`` says how precise it is
(1 on a local disk read by ftpbc, 1,000 when read by Spark's local file listing, 1,000,000 from
FTP MLSD or SFTP, 60,000,000 from an FTP ``LIST`` that shows minutes).

A *parsed* record adds what the name says (``ftpbc.exchange.parse_archive_name`` and the
endpoint's message_name, see :mod:`ftpbc.analytics.nametime`)::

    kind     request | response | error_reply | reason | other
    uuid     correlation id (requests, responses, error replies, reasons)
    node     node that served (in) / collected (out) it; ``uncollected`` for a provider's sweep
    stamp_us when that node archived it (millisecond precision, from the name)
    name_time_us, name_prec_us   submit time written in a request's name, when there is one

Schemas are explicit everywhere: Spark never infers one (inference costs a listing job and,
on 10,000 JSON files, 8x the read time).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ftpbc.exchange.area import ERROR_REPLY_SUFFIX, REASON_SUFFIX, parse_archive_name

RAW_FIELDS: tuple[tuple[str, str], ...] = (
    ("endpoint", "string"), ("folder", "string"), ("name", "string"),
    ("size", "long"), ("mtime_us", "long"), ("mtime_prec_us", "long"),
)
PARSED_FIELDS: tuple[tuple[str, str], ...] = (*RAW_FIELDS,
    ("kind", "string"), ("uuid", "string"), ("node", "string"), ("stamp_us", "long"),
    ("name_time_us", "long"), ("name_prec_us", "long"),
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)

#: node id of responses archived by a provider's sweep, never collected (see ftpbc.exchange)
UNCOLLECTED = "uncollected"


def ddl(fields: Iterable[tuple[str, str]]) -> str:
    """Spark DDL schema string, e.g. ``endpoint string, size long``."""
    return ", ".join(f"{n} {t}" for n, t in fields)


def arrow_schema(fields: Iterable[tuple[str, str]]) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "long": pa.int64(), "binary": pa.binary()}
    return pa.schema([(n, types[t]) for n, t in fields])


def parse_record(raw: Mapping[str, Any], naming: Mapping[str, str]) -> dict[str, Any]:
    """One parsed record from one raw record and its endpoint's naming facts."""
    from ftpbc.analytics.nametime import reader_for

    archived: str = raw["name"]
    is_reason = archived.endswith(REASON_SUFFIX)
    if is_reason:
        archived = archived[: -len(REASON_SUFFIX)]
    name, node, when = parse_archive_name(archived)
    kind, uuid, name_time, name_prec = "other", None, None, None
    req, resp = naming["request_prefix"], naming["response_prefix"]
    # The longer prefix first, so that "r." never shadows "resp." when both are configured.
    order = sorted(((req, "request"), (resp, "response")), key=lambda p: -len(p[0]))
    for prefix, what in order:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if what == "response":
            kind = "response"
            if rest.endswith(ERROR_REPLY_SUFFIX):
                kind, rest = "error_reply", rest[: -len(ERROR_REPLY_SUFFIX)]
            uuid = rest
        else:
            facts = reader_for(naming["message_name"], naming["timezone"]).read(rest)
            kind, uuid, name_time, name_prec = "request", facts.uuid, facts.time_us, facts.precision_us
        break
    if is_reason:
        kind = "reason"
    stamp_us = (when - EPOCH) // US if when is not None else None
    return {**raw, "kind": kind, "uuid": uuid, "node": node, "stamp_us": stamp_us,
            "name_time_us": name_time, "name_prec_us": name_prec}


def parse_rows(rows: Iterable[Mapping[str, Any]], namings: Mapping[str, Mapping[str, str]]
               ) -> Iterator[tuple[Any, ...]]:
    """Raw records -> parsed records as tuples in :data:`PARSED_FIELDS` order (for ``mapPartitions``)."""
    names = [n for n, _ in PARSED_FIELDS]
    for r in rows:
        parsed = parse_record(r, namings[r["endpoint"]])
        yield tuple(parsed[n] for n in names)
