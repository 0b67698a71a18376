"""Listing records: their schemas, and the reference per-name parser (Spark's SQL one follows it).

A *raw* record is one directory entry of an archive folder, as any source gives it::

    endpoint, folder, name, size, mtime_us, mtime_prec_us

``mtime_us`` is microseconds since the epoch (UTC); ``mtime_prec_us`` says how precise it is
(1 on a local disk read by ftpbc, 1,000 when read by Spark's local file listing, 1,000,000 from
FTP MLSD or SFTP, 60,000,000 from an FTP ``LIST`` that shows minutes).

A *parsed* record adds what the name says (:func:`parse_record`: the archive suffix, the
endpoint's naming, ftpbc or dropboxmq, and its message_name, see :mod:`ftpbc.analytics.nametime`)::

    kind     request | response | error_reply | reason | other (skipped by the figures)
    uuid     the id requests and replies pair on (requests, responses, error replies)
    node     node that served (in) / collected (out) it; ``uncollected`` for a provider's sweep
    stamp_us when that node archived it (millisecond precision, from the name)
    name_time_us, name_prec_us   submit time written in a request's name, when there is one
    reply_to the name's reply-to header (percent-decoded): for a request, the endpoint whose
             outbox gets its reply; for a reply, the endpoint whose request it answers, when
             that is not the endpoint it was archived in (the reply went through ``reply_to``)
    correlation_id  the name's correlation id header (percent-decoded), when it carries one

Schemas are explicit everywhere: Spark never infers one (inference costs a listing job and
several times the read itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote_to_bytes

from ftpbc.exchange.area import ERROR_REPLY_SUFFIX, REASON_SUFFIX

RAW_FIELDS: tuple[tuple[str, str], ...] = (
    ("endpoint", "string"), ("folder", "string"), ("name", "string"),
    ("size", "long"), ("mtime_us", "long"), ("mtime_prec_us", "long"),
)
PARSED_FIELDS: tuple[tuple[str, str], ...] = (*RAW_FIELDS,
    ("kind", "string"), ("uuid", "string"), ("node", "string"), ("stamp_us", "long"),
    ("name_time_us", "long"), ("name_prec_us", "long"), ("reply_to", "string"),
    ("correlation_id", "string"),
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


#: an archive stamp exactly as ftpbc writes it (``ftpbc.exchange.area.stamp``): ASCII digits
STAMP_RE = r"[0-9]{8}T[0-9]{6}\.[0-9]{3}Z"
_STAMP = re.compile(STAMP_RE)
#: a ``%`` that does not start a two-digit hex escape: the value is badly encoded
BAD_ESCAPE_RE = r"%(?![0-9A-Fa-f]{2})"
_BAD_ESCAPE = re.compile(BAD_ESCAPE_RE)
#: DropboxMQ's first field (the priority): any integer
PRIORITY_RE = r"[+-]?[0-9]+"
_PRIORITY = re.compile(PRIORITY_RE)
#: DropboxMQ's message classes (empty: B) and expiration (milliseconds, empty: none)
CLASS_RE = r"[MBSPOT]?"
EXPIRATION_RE = r"([+-]?[0-9]{1,19})?"
_CLASS, _EXPIRATION = re.compile(CLASS_RE), re.compile(EXPIRATION_RE)
#: the type of an error reply in dropboxmq naming (``ftpbc.model.envelope.ERROR_TYPE``)
ERROR_TYPE = "ftpbc.error"
#: folders of the request side ("in") the figures count requests in
IN_FOLDERS = ("inarchive", "inerror")
#: every request-side folder a listing may hold (expired and dead letters: the provenance table);
#: a name in any other is on the response side ("out")
REQUEST_SIDE = (*IN_FOLDERS, "inexpired", "indead")
#: the kinds that carry headers (reply-to, correlation id): a request or a reply
MESSAGE_KINDS = ("request", "response", "error_reply")
#: ftpbc naming's keys of the headers read here (``model/headers.py``; ``docs/naming.md``)
REPLY_TO_KEY = "r"
CORRELATION_KEY = "c"


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (no range check).

    Plain integer arithmetic (H. Hinnant's algorithm), so that Spark computes the very same
    numbers with column arithmetic (:mod:`ftpbc.analytics.sqlnames`).
    """
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def valid_date(year: int, month: int, day: int) -> bool:
    """What ``datetime(year, month, day)`` accepts."""
    return 1 <= year <= 9999 and 1 <= month <= 12 and 1 <= day <= days_in_month(year, month)


def stamp_us(text: str) -> int | None:
    """Microseconds since the epoch of an archive stamp (``20261122T013045.123Z``), or None.

    Strict: exactly the form ftpbc writes (ASCII digits, milliseconds, ``Z``) and a real
    calendar time; anything else is not a stamp.
    """
    if _STAMP.fullmatch(text) is None:
        return None
    y, mo, d = int(text[0:4]), int(text[4:6]), int(text[6:8])
    h, mi, s, ms = int(text[9:11]), int(text[11:13]), int(text[13:15]), int(text[16:19])
    if not valid_date(y, mo, d) or h > 23 or mi > 59 or s > 59:
        return None
    return ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s) * 1000 + ms) * 1000


def split_archived(archived: str) -> tuple[str, str | None, int | None]:
    """``(name, node, stamp_us)`` of ``<name>~<node>~<stamp>``; missing parts are None.

    As :func:`ftpbc.exchange.area.parse_archive_name`, with the strict :func:`stamp_us`: the
    last ``~`` part is the stamp when it is one (then the part before it, after the previous
    ``~``, is the node), else it is the node and there is no stamp.
    """
    rest, sep, last = archived.rpartition("~")
    if not sep:
        return archived, None, None
    when = stamp_us(last)
    if when is None:
        return rest, last, None
    name, sep2, node = rest.rpartition("~")
    if not sep2:
        return rest, None, when
    return name, node, when


def unescape(text: str) -> str | None:
    """DropboxMQ's percent-decoding (``+`` is a space), or None when ``text`` is not decodable.

    Not decodable: a ``%`` without two hex digits after it, escapes that are not UTF-8, or a
    result holding U+FFFD (Java's decoder puts it where the bytes are not UTF-8, so Spark can
    only tell a bad value by it; a real U+FFFD in an id is refused too, on both sides).
    """
    text = text.replace("+", " ")
    if "%" in text:
        if _BAD_ESCAPE.search(text):
            return None
        try:
            text = unquote_to_bytes(text).decode("utf-8")
        except (UnicodeError, ValueError):
            return None
    return None if "\ufffd" in text else text


def decode_field(text: str, *, plus: bool) -> str | None:
    """A header value as the name carries it, percent-decoded; None when empty or not decodable.

    ``plus``: ``+`` stands for a space (DropboxMQ); in ftpbc names it is itself.  Not decodable
    as :func:`unescape` says (a broken escape, bytes that are not UTF-8, a U+FFFD).
    """
    if not plus and "+" in text:
        text = text.replace("+", "%2B")
    value = unescape(text)
    return value or None


def ftpbc_field(name: str, key: str) -> str | None:
    """The value of the first ``;<key>=`` field of an ftpbc name (percent-decoded), or None.

    Read as the figures need it, not validated as the codec would: the first field whose key is
    ``key`` wins, and other fields (even ones the codec refuses) are not looked at.  Spark finds
    the same field with one regular expression (``;<key>=([^;]*)``, leftmost).
    """
    semi = name.find(";")
    if semi < 0:
        return None
    for token in name[semi + 1:].split(";"):
        if token.startswith(key + "="):
            return decode_field(token[len(key) + 1:], plus=False)
    return None


def _ftpbc_kind(name: str, folder: str, naming: Mapping[str, str]) -> tuple[str, str | None, int | None,
                                                                           int | None]:
    """(kind, uuid, name_time_us, name_prec_us) of a name in ftpbc naming (``docs/naming.md``)."""
    from ftpbc.analytics.nametime import reader_for

    base = name.partition(";")[0]  # the header and property fields say nothing the figures use
    req, resp = naming["request_prefix"], naming["response_prefix"]
    # The longer prefix first, so that "r." never shadows "resp." when both are configured.
    order = sorted(((req, "request"), (resp, "response")), key=lambda p: -len(p[0]))
    for prefix, what in order:
        if not base.startswith(prefix):
            continue
        rest = base[len(prefix):]
        if what == "response":
            kind = "response"
            if rest.endswith(ERROR_REPLY_SUFFIX):
                kind, rest = "error_reply", rest[: -len(ERROR_REPLY_SUFFIX)]
            return (kind, rest, None, None) if rest else ("other", None, None, None)
        facts = reader_for(naming["message_name"], naming["timezone"]).read(rest)
        if facts.uuid is None:
            return "other", None, None, None
        return "request", facts.uuid, facts.time_us, facts.precision_us
    return "other", None, None, None


def _dropboxmq_kind(name: str, folder: str) -> tuple[str, str | None]:
    """(kind, pairing id) of a name in dropboxmq naming (``docs/naming.md``).

    A request (request side, with a reply-to) pairs on its id; a response (response side) on its
    correlation id, else its id; an error reply is a response of type ``ftpbc.error``.  A name
    that is not DropboxMQ's (under 3 fields, or a first field that is no integer) is, as the
    engine reads it, a one-way message on the request side and a response whose id is the whole
    name on the response side.
    """
    inbound = folder in REQUEST_SIDE
    if name in ("", ".", ".."):
        return "other", None
    fields = name.split(".")
    if len(fields) < 3 or _PRIORITY.fullmatch(fields[0]) is None:
        return ("other", None) if inbound else ("response", name)
    if len(fields) > 8 or _CLASS.fullmatch(fields[2]) is None:
        return "other", None
    fields += [""] * (8 - len(fields))
    if _EXPIRATION.fullmatch(fields[3]) is None:
        return "other", None
    decoded = [unescape(fields[i]) for i in (1, 4, 5, 6)]
    if any(d is None for d in decoded):
        return "other", None
    uid, corr, _reply, typ = decoded
    uid = uid or name
    if inbound:
        return ("request", uid) if fields[5] else ("other", None)
    return ("error_reply" if typ == ERROR_TYPE else "response"), (corr if fields[4] else uid)


def _dropboxmq_headers(name: str) -> tuple[str | None, str | None]:
    """(reply_to, correlation_id) of a DropboxMQ name :func:`_dropboxmq_kind` accepts as a
    request or a reply: fields 6 and 5, percent-decoded (``+`` a space), None when empty."""
    fields = name.split(".")
    if len(fields) < 3 or _PRIORITY.fullmatch(fields[0]) is None:
        return None, None  # not DropboxMQ's: a foreign reply has no header fields
    fields += [""] * (8 - len(fields))
    return decode_field(fields[5], plus=True), decode_field(fields[4], plus=True)


def parse_record(raw: Mapping[str, Any], naming: Mapping[str, str]) -> dict[str, Any]:
    """One parsed record from one raw record and its endpoint's naming facts.

    This is the reference: Spark computes the same columns with SQL functions
    (:mod:`ftpbc.analytics.sqlnames`), and tests check the two agree name by name.  A name that
    is neither a request nor a reply of this endpoint (foreign, garbled, hostile) gets kind
    ``other`` and is skipped by the figures; a ``.reason`` file gets kind ``reason``.
    """
    archived: str = raw["name"]
    is_reason = archived.endswith(REASON_SUFFIX)
    if is_reason:
        archived = archived[: -len(REASON_SUFFIX)]
    name, node, stamp = split_archived(archived)
    kind, uuid, name_time, name_prec = "other", None, None, None
    reply_to = correlation = None
    dropboxmq = naming.get("naming", "ftpbc") == "dropboxmq"
    if is_reason:
        kind = "reason"
    elif dropboxmq:
        kind, uuid = _dropboxmq_kind(name, raw["folder"])
    else:
        kind, uuid, name_time, name_prec = _ftpbc_kind(name, raw["folder"], naming)
    if kind in MESSAGE_KINDS:
        if dropboxmq:
            reply_to, correlation = _dropboxmq_headers(name)
        else:
            reply_to = ftpbc_field(name, REPLY_TO_KEY)
            correlation = ftpbc_field(name, CORRELATION_KEY)
    return {**raw, "kind": kind, "uuid": uuid, "node": node, "stamp_us": stamp,
            "name_time_us": name_time, "name_prec_us": name_prec, "reply_to": reply_to,
            "correlation_id": correlation}
