"""A message's metadata (headers and properties) and the file names that carry it.

Nothing but the name of a file travels with its body, so a message's headers and properties are
written into its name.  This module is the one place that encodes and decodes them.  Two
grammars exist, chosen per endpoint with ``naming:`` (see ``docs/naming.md``):

``ftpbc``
    The name ftpbc has always used (``req.<uuid>``, ``msg.<uuid>``, ``resp.<uuid>``,
    ``resp.<uuid>.error``), followed by ``;key=value`` fields only for what differs from the
    defaults: ``req.<uuid>;p=9;r=audit;.regionS=emea``.  A plain name is a message with default
    headers, so files from producers that know nothing of the suffix are messages too.

``dropboxmq``
    DropboxMQ's default transcoder: ``<priority>.<id>.<class>.<expiration>.<correlation id>.
    <reply-to>.<type>.<properties>``, e.g.
    ``4.1140429201295000-9262574723.T.1140429211295.corr1283.TestQueue1.XYZType.prop1S=hello``.

Both are pure functions of their input: no I/O, no clock, no randomness.  Decoding never raises
anything but :class:`UnusableName` for a name, however hostile: callers log it once and skip the
file.  ``decode`` returning None means "not a message of this endpoint" (another prefix, a
foreign file): callers skip it quietly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol
from urllib.parse import quote, unquote_to_bytes

from ftpbc.errors import FtpbcError

__all__ = [
    "DEFAULT_PRIORITY",
    "DELIVERY_COUNT_PROPERTY",
    "ERROR_TYPE",
    "EXPIRED_TYPE",
    "NAME_LIMIT",
    "RESERVED_TYPE_PREFIX",
    "TIMESTAMP_PROPERTY",
    "Direction",
    "DropboxmqCodec",
    "Envelope",
    "FtpbcCodec",
    "Headers",
    "Kind",
    "NameCodec",
    "NameTooLong",
    "PropertyValue",
    "UnusableName",
    "codec_for",
]

Kind = Literal["request", "response", "oneway"]
Direction = Literal["in", "out"]
PropertyValue = bool | int | float | str

DEFAULT_PRIORITY = 4
ERROR_TYPE = "ftpbc.error"  # headers.type of an error reply (a handler that failed)
EXPIRED_TYPE = "ftpbc.expired"  # headers.type of the reply to a request that expired unserved
RESERVED_TYPE_PREFIX = "ftpbc."  # types ftpbc's own replies use; applications may not send them
NAME_LIMIT = 255  # bytes (UTF-8): most servers' limit for one path segment

_KINDS = frozenset(("request", "response", "oneway"))
_INT32 = 2**31
_INT64 = 2**63
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


# --------------------------------------------------------------------------- errors


class UnusableName(FtpbcError):
    """A file name that cannot be decoded.  ``str()`` is one line: the name (repr) and why."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"unusable message name {name!r}: {reason}")


class NameTooLong(FtpbcError):
    """An encoded name is longer than the codec's limit (UTF-8 bytes).

    ``limit``, ``length`` and ``fields`` (the names of the fields that made it long, largest
    first) are attributes; the message names all three.
    """

    def __init__(self, limit: int, length: int, sizes: Mapping[str, int]) -> None:
        ranked = sorted(sizes.items(), key=lambda kv: -kv[1])
        # The largest field always; then every other field that takes a fifth of the name or more.
        chosen = [kv for i, kv in enumerate(ranked) if i == 0 or kv[1] * 5 >= length]
        self.limit = limit
        self.length = length
        self.sizes = dict(sizes)
        self.fields = tuple(name for name, _ in chosen)
        listed = ", ".join(f"{name} ({size} bytes)" for name, size in chosen)
        super().__init__(f"encoded message name is {length} bytes, over the limit of {limit} bytes; "
                         f"made long by {listed}")


class _Bad(Exception):
    """Internal: why a name does not decode (turned into UnusableName with the name)."""


# --------------------------------------------------------------------------- headers, envelope


def _utc(value: object, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime or None, got {type(value).__name__}")
    if value.tzinfo is UTC:
        return value
    if value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{what} {value.isoformat()} is out of range in UTC") from None


@dataclass(frozen=True)
class Headers:
    """A message's headers.

    ``priority`` 0-9 (higher first), ``delivery_count`` from 0 (below 2**63); datetimes must be
    timezone-aware and are converted to UTC (names carry them at millisecond precision).
    A response's ``correlation_id`` defaults to its ``id``: with ftpbc names a response's id
    *is* the request's id.
    """

    id: str
    kind: Kind = "oneway"
    priority: int = DEFAULT_PRIORITY
    timestamp: datetime | None = None
    expiration: datetime | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    type: str | None = None
    message_class: str | None = None
    delivery_count: int = 0

    #: True when nothing but id and kind differs from the defaults (set per instance)
    _plain: ClassVar[bool]

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"id must be a str, got {type(self.id).__name__}")
        kind = self.kind
        if kind not in _KINDS:
            raise ValueError(f"kind must be 'request', 'response' or 'oneway', got {kind!r}")
        plain = True
        p = self.priority
        if p != DEFAULT_PRIORITY or type(p) is not int:
            if type(p) is not int or not 0 <= p <= 9:
                raise ValueError(f"priority must be an int from 0 to 9, got {p!r}")
            plain = False
        n = self.delivery_count
        if n != 0 or type(n) is not int:
            if type(n) is not int or not 0 <= n < _INT64:
                raise ValueError(f"delivery_count must be an int from 0 to 2**63-1, got {n!r}")
            plain = False
        if self.timestamp is not None:
            if self.timestamp.tzinfo is not UTC:
                object.__setattr__(self, "timestamp", _utc(self.timestamp, "timestamp"))
            plain = False
        if self.expiration is not None:
            if self.expiration.tzinfo is not UTC:
                object.__setattr__(self, "expiration", _utc(self.expiration, "expiration"))
            plain = False
        if self.reply_to is not None:
            _check_str(self.reply_to, "reply_to")
            plain = False
        if self.message_class is not None:
            _check_str(self.message_class, "message_class")
            plain = False
        corr, typ = self.correlation_id, self.type
        if corr is not None:
            _check_str(corr, "correlation_id")
        if typ is not None:
            _check_str(typ, "type")
        if kind == "response":
            if corr is None:
                object.__setattr__(self, "correlation_id", self.id)
            elif corr != self.id:
                plain = False
            if typ is not None and typ != ERROR_TYPE:
                plain = False
        elif corr is not None or typ is not None:
            plain = False
        object.__setattr__(self, "_plain", plain)


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}")


_PLAIN: dict[tuple[str, str | None], dict[str, Any]] = {}


def _plain_headers(uid: str, kind: Kind, typ: str | None) -> Headers:
    """``Headers(uid, kind, type=typ)`` without the checks: the hot path of decoding a plain name.

    The instance dict is copied from a template built the ordinary way, which keeps it small
    (a dict sharing its keys with every other instance's) and fast to make.
    """
    try:
        template = _PLAIN[kind, typ]
    except KeyError:
        template = _PLAIN.setdefault((kind, typ), Headers("", kind, type=typ).__dict__)
    d = template.copy()
    d["id"] = uid
    if kind == "response":
        d["correlation_id"] = uid
    h = object.__new__(Headers)
    object.__setattr__(h, "__dict__", d)
    return h


_EMPTY: Mapping[str, PropertyValue] = MappingProxyType({})


@dataclass(frozen=True)
class Envelope:
    """A message's headers, properties and base name, as one name carries them.

    ``properties`` is kept as a read-only copy.  ``base`` is, with ftpbc names, the name without
    the metadata suffix (``req.<uuid>``, ``resp.<uuid>.error``); with dropboxmq names, the whole
    name.
    """

    headers: Headers
    properties: Mapping[str, PropertyValue]
    base: str

    def __post_init__(self) -> None:
        props = self.properties
        if props is not _EMPTY:
            object.__setattr__(self, "properties", MappingProxyType(dict(props)) if props else _EMPTY)

    def __reduce__(self) -> tuple[Any, ...]:  # the read-only mapping itself does not pickle
        return (Envelope, (self.headers, dict(self.properties), self.base))

    def replace(self, **header_changes: Any) -> Envelope:
        """A new envelope whose headers have ``header_changes`` (e.g. ``delivery_count=n + 1``)."""
        return Envelope(dataclasses.replace(self.headers, **header_changes), self.properties, self.base)


def _plain_envelope(headers: Headers, base: str) -> Envelope:
    """``Envelope(headers, {}, base)`` without the copy: the hot path of decoding a plain name."""
    e = object.__new__(Envelope)
    object.__setattr__(e, "__dict__", {"headers": headers, "properties": _EMPTY, "base": base})
    return e


# --------------------------------------------------------------------------- the protocol


class NameCodec(Protocol):
    """Encodes headers and properties into a file name and back."""

    name: str  # "ftpbc" or "dropboxmq"

    def encode(self, base: str, headers: Headers, properties: Mapping[str, PropertyValue]) -> str:
        """The file name.  NameTooLong over the limit; ValueError/TypeError for bad input."""
        ...

    def decode(self, filename: str, *, direction: Literal["in", "out"]) -> Envelope | None:
        """The envelope; None when not a message of this endpoint; UnusableName when garbled."""
        ...


# --------------------------------------------------------------------------- shared pieces


def _pct(text: str) -> str:
    """Percent-encode all but ``A-Z a-z 0-9 - _ .`` (UTF-8): never ``/ \\ ~ ; = & % .``-safe."""
    if _SAFE_RE.fullmatch(text):
        return text
    try:
        return quote(text, safe="").replace("~", "%7E")
    except UnicodeEncodeError:
        raise ValueError(f"{text!r} is not encodable as UTF-8 (lone surrogate)") from None


_SAFE_RE = re.compile(r"[A-Za-z0-9_.\-]*")
_BAD_PCT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _unpct(text: str, plus: bool = False) -> str:
    """Strict percent-decoding: malformed escapes and invalid UTF-8 are errors."""
    if plus and "+" in text:
        text = text.replace("+", " ")
    if "%" not in text:
        return text
    if _BAD_PCT_RE.search(text):
        raise _Bad(f"bad percent-encoding in {text!r}")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeError:
        raise _Bad(f"percent-encoding of {text!r} is not UTF-8") from None


def _time_text(dt: datetime) -> str:
    """``YYYYmmddTHHMMSS.mmmZ`` (UTC, microseconds truncated to milliseconds)."""
    return (f"{dt.year:04d}{dt.month:02d}{dt.day:02d}T{dt.hour:02d}{dt.minute:02d}{dt.second:02d}"
            f".{dt.microsecond // 1000:03d}Z")


_TIME_RE = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})\.([0-9]{3})Z")


def _parse_time(text: str) -> datetime:
    m = _TIME_RE.fullmatch(text)
    if m is None:
        raise _Bad(f"{text!r} is not a time like 20261125T120000.000Z")
    y, mo, d, h, mi, s, ms = map(int, m.groups())
    try:
        return datetime(y, mo, d, h, mi, s, ms * 1000, tzinfo=UTC)
    except ValueError:
        raise _Bad(f"{text!r} is not a valid time") from None


def _ms_of(dt: datetime) -> int:
    """Milliseconds since the epoch, rounded toward the past."""
    return (dt - _EPOCH) // _MS


def _time_of_ms(ms: int) -> datetime:
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        raise _Bad(f"{ms} ms since the epoch is out of range") from None


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _property_piece(name: str, value: object) -> tuple[str, str]:
    """``(name + type letter, value text)`` of one property."""
    if not isinstance(name, str):
        raise TypeError(f"property names must be str, got {type(name).__name__} {name!r}")
    if isinstance(value, bool):
        return name + "B", "true" if value else "false"
    if isinstance(value, int):
        if -_INT32 <= value < _INT32:
            return name + "I", str(int(value))
        if -_INT64 <= value < _INT64:
            return name + "L", str(int(value))
        raise ValueError(f"property {name!r}: {value} does not fit 64 bits")
    if isinstance(value, float):
        return name + "D", _float_text(value)
    if isinstance(value, str):
        return name + "S", value
    raise TypeError(f"property {name!r}: expected bool, int, float or str, got {type(value).__name__}")


_INT_RE = re.compile(r"[+-]?[0-9]{1,19}")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")
_FLOAT_WORDS = frozenset(s + w for s in ("", "+", "-") for w in ("nan", "inf", "infinity"))
_INT_RANGES = {"Y": 2**7, "H": 2**15, "I": _INT32, "L": _INT64}


def _property_value(name: str, letter: str, text: str) -> PropertyValue:
    if letter == "S":
        return text
    if letter == "B":
        low = text.lower()
        if low == "true":
            return True
        if low == "false":
            return False
        raise _Bad(f"property {name!r}: {text!r} is not true or false")
    bound = _INT_RANGES.get(letter)
    if bound is not None:
        if _INT_RE.fullmatch(text):
            v = int(text)
            if -bound <= v < bound:
                return v
        raise _Bad(f"property {name!r}: {text!r} is not an integer of type {letter}")
    if letter in ("D", "F"):
        if _FLOAT_RE.fullmatch(text) or text.lower() in _FLOAT_WORDS:
            return float(text)
        raise _Bad(f"property {name!r}: {text!r} is not a number")
    raise _Bad(f"property {name!r}: unknown type letter {letter!r} (expected one of B Y H I L F D S)")


def _check_limit(name: str, limit: int, parts: list[tuple[str, str]]) -> str:
    if len(name) <= limit // 4:  # at most 4 UTF-8 bytes per character: surely short enough
        return name
    length = len(name) if name.isascii() else len(name.encode("utf-8"))
    if length <= limit:
        return name
    sizes: dict[str, int] = {}
    for field, piece in parts:
        sizes[field] = sizes.get(field, 0) + len(piece.encode("utf-8"))
    raise NameTooLong(limit, length, sizes)


def _check_direction(direction: str) -> None:
    if direction != "in" and direction != "out":
        raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")


# --------------------------------------------------------------------------- ftpbc


_BAD_BASE_RE = re.compile("[/\\\\~;\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_HEADER_KEYS = frozenset("pnsectrk")
_ERROR_SUFFIX = ".error"
_CACHE_SIZE = 16384  # decoded names kept per codec and direction


class _DecodeCache:
    """Decoded envelopes (immutable) by name, one dict per direction: a poll lists the same
    backlog again and again, so most decodes are one lookup.  Emptied when full."""

    def __init__(self) -> None:
        self._cache: dict[str, dict[str, Envelope | None]] = {"in": {}, "out": {}}

    def _decode(self, filename: str, direction: str) -> Envelope | None:
        raise NotImplementedError

    def _cached_decode(self, filename: str, direction: str) -> Envelope | None:
        try:
            cache = self._cache[direction]
        except (KeyError, TypeError):
            _check_direction(direction)
            raise
        try:
            return cache[filename]
        except KeyError:
            pass
        env = self._decode(filename, direction)
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        cache[filename] = env
        return env


class FtpbcCodec(_DecodeCache):
    """ftpbc names: ``<base>`` plus ``;key=value`` fields for what is not a default.

    Grammar (``docs/naming.md``)::

        name     = base *( ";" field )
        field    = key "=" value | "." pname type "=" value
        key      = "p" priority (one digit)   | "n" delivery count (decimal)
                 | "s" timestamp | "e" expiration    (YYYYmmddTHHMMSS.mmmZ, UTC)
                 | "c" correlation id | "r" reply-to | "t" type | "k" message class
        type     = B boolean | Y byte | H short | I int | L long | F float | D double | S string

    Values and property names are percent-encoded (UTF-8; only ``A-Z a-z 0-9 - _ .`` are left as
    they are).  ``base`` is ``<request_prefix>...``, ``<oneway_prefix>...``,
    ``<response_prefix><uuid>`` or ``<response_prefix><uuid>.error`` (an error reply).

    ``uuid_of(base)`` gives the id of a request or one-way base (None: not this endpoint's
    name); without it the id is the text after the prefix.  A response's id is always the text
    after its prefix (less ``.error``).  ``uuid_of`` must be a pure function of the name: decoded
    names are cached (up to 16384 per direction), which makes decoding a name listed before one
    dict lookup.
    """

    name: str = "ftpbc"

    def __init__(self, *, request_prefix: str = "req.", response_prefix: str = "resp.",
                 oneway_prefix: str = "msg.", uuid_of: Callable[[str], str | None] | None = None,
                 limit: int = NAME_LIMIT) -> None:
        for what, prefix in (("request_prefix", request_prefix), ("response_prefix", response_prefix),
                             ("oneway_prefix", oneway_prefix)):
            if not isinstance(prefix, str) or not prefix or _BAD_BASE_RE.search(prefix):
                raise ValueError(f"{what} must be a non-empty name part without / \\ ~ ; or control "
                                 f"characters, got {prefix!r}")
        if request_prefix.startswith(oneway_prefix) or oneway_prefix.startswith(request_prefix):
            raise ValueError(f"request_prefix {request_prefix!r} and oneway_prefix {oneway_prefix!r} "
                             "must not be prefixes of one another")
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self._request_prefix = request_prefix
        self._response_prefix = response_prefix
        self._oneway_prefix = oneway_prefix
        self._uuid_of = uuid_of
        self._limit = limit
        self._prefix = {"request": request_prefix, "response": response_prefix, "oneway": oneway_prefix}
        super().__init__()

    # Read-only: decoded names are cached, so what decides them must not change.
    @property
    def request_prefix(self) -> str:
        return self._request_prefix

    @property
    def response_prefix(self) -> str:
        return self._response_prefix

    @property
    def oneway_prefix(self) -> str:
        return self._oneway_prefix

    @property
    def uuid_of(self) -> Callable[[str], str | None] | None:
        return self._uuid_of

    @property
    def limit(self) -> int:
        return self._limit

    def __repr__(self) -> str:
        return (f"FtpbcCodec(request_prefix={self.request_prefix!r}, response_prefix="
                f"{self.response_prefix!r}, oneway_prefix={self.oneway_prefix!r}, limit={self.limit})")

    # ------------------------------------------------------------------ encode

    def encode(self, base: str, headers: Headers, properties: Mapping[str, PropertyValue]) -> str:
        """``base`` plus the suffix for what differs from the defaults (just ``base`` if nothing).

        ``base`` must match ``headers``: its prefix gives the kind, the text after it the id (or
        ``uuid_of``), and a response base ends with ``.error`` exactly when ``headers.type`` is
        ERROR_TYPE.  A mismatch is a ValueError (it would not decode to these headers).
        """
        kind = headers.kind
        prefix = self._prefix[kind]
        if not base.startswith(prefix) or _BAD_BASE_RE.search(base):
            raise ValueError(f"base {base!r} for a {kind} must start with {prefix!r} and contain no "
                             "/ \\ ~ ; or control characters")
        uid: str | None
        if kind == "response":
            uid = base[len(prefix):]
            error = uid.endswith(_ERROR_SUFFIX)
            if error:
                uid = uid[:-len(_ERROR_SUFFIX)]
            if error != (headers.type == ERROR_TYPE):
                raise ValueError(f"response base {base!r}: a base ending {_ERROR_SUFFIX!r} is an error "
                                 f"reply and only an error reply (type {ERROR_TYPE!r}); type is "
                                 f"{headers.type!r}")
        else:
            uid = self._uuid_of(base) if self._uuid_of is not None else base[len(prefix):]
        if not uid or uid != headers.id:
            raise ValueError(f"base {base!r} gives id {uid!r}, the headers say {headers.id!r}")
        if headers._plain and not properties:
            if len(base) > self._limit // 4:
                _check_limit(base, self._limit, [("base", base)])
            return base
        return self._encode_suffix(base, headers, properties)

    def _encode_suffix(self, base: str, h: Headers, properties: Mapping[str, PropertyValue]) -> str:
        parts: list[tuple[str, str]] = [("base", base)]
        add = parts.append
        if h.priority != DEFAULT_PRIORITY:
            add(("priority", f";p={h.priority}"))
        if h.delivery_count:
            add(("delivery_count", f";n={h.delivery_count}"))
        if h.timestamp is not None:
            add(("timestamp", f";s={_time_text(h.timestamp)}"))
        if h.expiration is not None:
            add(("expiration", f";e={_time_text(h.expiration)}"))
        if h.correlation_id is not None and not (h.kind == "response" and h.correlation_id == h.id):
            add(("correlation_id", f";c={_pct(h.correlation_id)}"))
        if h.reply_to is not None:
            add(("reply_to", f";r={_pct(h.reply_to)}"))
        if h.type is not None and not (h.kind == "response" and h.type == ERROR_TYPE):
            add(("type", f";t={_pct(h.type)}"))
        if h.message_class is not None:
            add(("message_class", f";k={_pct(h.message_class)}"))
        for pname, value in properties.items():
            key, text = _property_piece(pname, value)
            add(("properties", f";.{_pct(key)}={_pct(text)}"))
        return _check_limit("".join(p for _, p in parts), self._limit, parts)

    # ------------------------------------------------------------------ decode

    def decode(self, filename: str, *, direction: Literal["in", "out"]) -> Envelope | None:
        """The envelope of ``filename`` (a box name: no ``~<node>`` claim part).

        None when the base has none of this endpoint's prefixes for ``direction`` ("in":
        request and one-way prefixes; "out": the response prefix) or ``uuid_of`` refuses it.
        """
        return self._cached_decode(filename, direction)

    def _decode(self, filename: str, direction: str) -> Envelope | None:
        semi = filename.find(";")
        base = filename if semi < 0 else filename[:semi]
        typ: str | None = None
        kind: Kind
        if direction == "in":
            if base.startswith(self._request_prefix):
                kind, cut = "request", len(self._request_prefix)
            elif base.startswith(self._oneway_prefix):
                kind, cut = "oneway", len(self._oneway_prefix)
            else:
                return None
            if self._uuid_of is not None:
                uid = self._uuid_of(base)
                if uid is None:
                    return None
            else:
                uid = base[cut:]
        elif direction == "out":
            if not base.startswith(self._response_prefix):
                return None
            kind = "response"
            uid = base[len(self._response_prefix):]
            if uid.endswith(_ERROR_SUFFIX):
                uid = uid[:-len(_ERROR_SUFFIX)]
                typ = ERROR_TYPE
        else:
            raise AssertionError(direction)  # checked by decode()
        if not uid:
            raise UnusableName(filename, "no message id after the prefix")
        if semi < 0:
            return _plain_envelope(_plain_headers(uid, kind, typ), base)
        try:
            return self._decode_suffix(filename, base, semi, uid, kind, typ)
        except _Bad as bad:
            raise UnusableName(filename, str(bad)) from None

    def _decode_suffix(self, filename: str, base: str, semi: int, uid: str, kind: Kind,
                       typ: str | None) -> Envelope:
        fields: dict[str, str] = {}
        props: dict[str, PropertyValue] = {}
        for token in filename[semi + 1:].split(";"):
            key, eq, raw = token.partition("=")
            if not eq:
                raise _Bad(f"field {token!r} has no '='")
            if "=" in raw:
                raise _Bad(f"field {token!r} has a second '='")
            if key.startswith("."):
                typed = _unpct(key[1:])
                if not typed:
                    raise _Bad(f"property field {token!r} has no type letter")
                pname, letter = typed[:-1], typed[-1]
                if pname in props:
                    raise _Bad(f"property {pname!r} given twice")
                props[pname] = _property_value(pname, letter, _unpct(raw))
            elif key in _HEADER_KEYS and len(key) == 1:
                if key in fields:
                    raise _Bad(f"field {key!r} given twice")
                fields[key] = raw
            else:
                raise _Bad(f"unknown field {key!r}")
        priority = DEFAULT_PRIORITY
        count = 0
        timestamp = expiration = None
        if "p" in fields:
            p = fields["p"]
            if len(p) != 1 or p not in "0123456789":
                raise _Bad(f"priority {p!r} is not a digit 0-9")
            priority = int(p)
        if "n" in fields:
            n = fields["n"]
            if not (n.isascii() and n.isdigit() and len(n) <= 19) or int(n) >= _INT64:
                raise _Bad(f"delivery count {n!r} is not a number")
            count = int(n)
        if "s" in fields:
            timestamp = _parse_time(fields["s"])
        if "e" in fields:
            expiration = _parse_time(fields["e"])
        corr = _unpct(fields["c"]) if "c" in fields else None
        reply = _unpct(fields["r"]) if "r" in fields else None
        if "t" in fields:
            if typ is not None:
                raise _Bad("an error reply (.error) has no type field")
            typ = _unpct(fields["t"])
        cls = _unpct(fields["k"]) if "k" in fields else None
        try:
            headers = Headers(uid, kind, priority, timestamp, expiration, corr, reply, typ, cls, count)
        except ValueError as err:
            raise _Bad(str(err)) from None
        return Envelope(headers, props, base)


# --------------------------------------------------------------------------- dropboxmq


_CLASSES = frozenset("MBSPOT")  # Message Bytes Stream maP Object Text
DELIVERY_COUNT_PROPERTY = "JMSXDeliveryCount"
TIMESTAMP_PROPERTY = "JMS_ftpbcTimestamp"
_RESERVED = frozenset((DELIVERY_COUNT_PROPERTY, TIMESTAMP_PROPERTY))
_PRIORITY_RE = re.compile(r"[+-]?[0-9]+")


def _id_stamp(uid: str) -> int | None:
    """Milliseconds embedded in a DropboxMQ id ``<13-digit ms><3-digit counter>-<random>``."""
    head = uid.partition("-")[0]
    if len(head) == 16 and head.isascii() and head.isdigit():
        return int(head[:13])
    return None


def _dpct(text: str) -> str:
    """Percent-encoding for dropboxmq fields: ``.`` too, since it separates the fields."""
    return _pct(text).replace(".", "%2E")


class DropboxmqCodec(_DecodeCache):
    """DropboxMQ's default file names (see ``docs/naming.md``).

    The name is built from the headers and properties alone: ``encode`` ignores ``base``, and a
    decoded envelope's ``base`` is the whole name.  The delivery count travels as the property
    ``JMSXDeliveryCount`` (I); a timestamp that the id does not already carry (DropboxMQ ids
    begin with the 13-digit millisecond time) as ``JMS_ftpbcTimestamp`` (L).
    """

    name: str = "dropboxmq"

    def __init__(self, *, limit: int = NAME_LIMIT) -> None:
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self._limit = limit
        super().__init__()

    @property
    def limit(self) -> int:
        return self._limit

    def __repr__(self) -> str:
        return f"DropboxmqCodec(limit={self._limit})"

    def encode(self, base: str, headers: Headers, properties: Mapping[str, PropertyValue]) -> str:
        """``<priority>.<id>.<class>[.<expiration>[.<corr>[.<reply-to>[.<type>[.<props>]]]]]``.

        A request needs a reply-to and a one-way message must not have one (that is how a
        reader tells them apart); empty strings cannot be told from missing fields and are
        refused, as is an expiration at exactly the epoch (0 means none).
        """
        h = headers
        if not h.id:
            raise ValueError("dropboxmq names need a non-empty message id")
        if h.kind == "request" and h.reply_to is None:
            raise ValueError("a request in dropboxmq naming needs reply_to (it marks a request)")
        if h.kind == "oneway" and h.reply_to is not None:
            raise ValueError("a one-way message in dropboxmq naming cannot have reply_to "
                             "(it would read back as a request)")
        for what, v in (("correlation_id", h.correlation_id), ("reply_to", h.reply_to),
                        ("type", h.type)):
            if v == "":
                raise ValueError(f"{what} cannot be empty in dropboxmq naming (empty means none)")
        cls = "B" if h.message_class is None else h.message_class
        if cls not in _CLASSES:
            raise ValueError(f"message_class must be one of M B S P O T in dropboxmq naming, "
                             f"got {h.message_class!r}")
        exp = ""
        if h.expiration is not None:
            ms = _ms_of(h.expiration)
            if ms == 0:
                raise ValueError("an expiration at the epoch cannot be written (0 means none)")
            exp = str(ms)
        pieces: list[tuple[str, str]] = []  # (the field it counts for in NameTooLong, text)
        for pname, value in properties.items():
            if pname in _RESERVED:
                raise ValueError(f"property name {pname!r} is reserved by dropboxmq naming")
            key, text = _property_piece(pname, value)
            pieces.append(("properties", f"{_dpct(key)}={_dpct(text)}"))
        if h.delivery_count:
            key, text = _property_piece(DELIVERY_COUNT_PROPERTY, h.delivery_count)
            pieces.append(("delivery_count", f"{key}={text}"))
        if h.timestamp is not None:
            ms = _ms_of(h.timestamp)
            if _id_stamp(h.id) != ms:
                key, text = _property_piece(TIMESTAMP_PROPERTY, ms)
                pieces.append(("timestamp", f"{key}={_dpct(text)}"))
        fields = [
            ("priority", str(h.priority)),
            ("id", _dpct(h.id)),
            ("message_class", cls),
            ("expiration", exp),
            ("correlation_id", "" if h.correlation_id is None else _dpct(h.correlation_id)),
            ("reply_to", "" if h.reply_to is None else _dpct(h.reply_to)),
            ("type", "" if h.type is None else _dpct(h.type)),
            ("properties", "&".join(text for _, text in pieces)),
        ]
        while len(fields) > 3 and not fields[-1][1]:
            fields.pop()
        name = ".".join(text for _, text in fields)
        if len(name) <= self._limit // 4:
            return name
        parts = [(f, t + ".") for f, t in fields if f != "properties"]
        parts.extend((f, t + "&") for f, t in pieces)
        return _check_limit(name, self._limit, parts)

    def decode(self, filename: str, *, direction: Literal["in", "out"]) -> Envelope | None:
        """The envelope of ``filename``; None only for ``""``, ``.`` and ``..``.

        A name that does not look like DropboxMQ's (fewer than three fields, or a first field
        that is not an integer) is a message whose id is the whole name, with default headers.
        """
        return self._cached_decode(filename, direction)

    def _decode(self, filename: str, direction: str) -> Envelope | None:
        if filename in ("", ".", ".."):
            return None
        fields = filename.split(".")
        if len(fields) < 3 or not _PRIORITY_RE.fullmatch(fields[0]):
            kind: Kind = "response" if direction == "out" else "oneway"
            return Envelope(Headers(filename, kind, message_class="B"), _EMPTY, filename)
        try:
            return self._decode_fields(filename, fields, direction)
        except _Bad as bad:
            raise UnusableName(filename, str(bad)) from None

    def _decode_fields(self, filename: str, fields: list[str], direction: str) -> Envelope:
        if len(fields) > 8:
            raise _Bad(f"{len(fields)} dot-separated fields, at most 8")
        fields += [""] * (8 - len(fields))
        ptext, idtext, cls, exptext, corrtext, replytext, typetext, proptext = fields
        if len(ptext.lstrip("+-")) > 9:
            priority = 0 if ptext.startswith("-") else 9
        else:
            priority = min(9, max(0, int(ptext)))
        uid = _unpct(idtext, plus=True) or filename
        if not cls:
            cls = "B"
        elif cls not in _CLASSES:
            raise _Bad(f"message class {cls!r} is not one of M B S P O T")
        expiration = None
        if exptext:
            if not _INT_RE.fullmatch(exptext):
                raise _Bad(f"expiration {exptext!r} is not milliseconds since the epoch")
            ms = int(exptext)
            if ms:
                expiration = _time_of_ms(ms)
        corr = _unpct(corrtext, plus=True) if corrtext else None
        reply = _unpct(replytext, plus=True) if replytext else None
        typ = _unpct(typetext, plus=True) if typetext else None
        props: dict[str, PropertyValue] = {}
        seen: set[str] = set()
        count = 0
        stamp: int | None = None
        if proptext:
            for pair in proptext.split("&"):
                if not pair:
                    continue  # a stray '&'
                key, eq, raw = pair.partition("=")
                if not eq:
                    raise _Bad(f"property {pair!r} has no '='")
                typed = _unpct(key, plus=True)
                if not typed:
                    raise _Bad(f"property {pair!r} has no type letter")
                pname, letter = typed[:-1], typed[-1]
                if pname in seen:
                    raise _Bad(f"property {pname!r} given twice")
                seen.add(pname)
                value = _property_value(pname, letter, _unpct(raw, plus=True))
                if pname in _RESERVED:
                    if letter not in _INT_RANGES or not isinstance(value, int):
                        raise _Bad(f"property {pname!r} must be an integer (type I or L)")
                    if pname == DELIVERY_COUNT_PROPERTY:
                        if value < 0:
                            raise _Bad(f"{pname} {value} is negative")
                        count = value
                    else:
                        stamp = value
                else:
                    props[pname] = value
        if stamp is None:
            stamp = _id_stamp(uid)
        timestamp = None if stamp is None else _time_of_ms(stamp)
        kind: Kind = "response" if direction == "out" else "request" if reply is not None else "oneway"
        try:
            headers = Headers(uid, kind, priority, timestamp, expiration, corr, reply, typ, cls, count)
        except ValueError as err:
            raise _Bad(str(err)) from None
        return Envelope(headers, props, filename)


# --------------------------------------------------------------------------- selection


_FTPBC_ONLY = ("request_prefix", "response_prefix", "oneway_prefix", "uuid_of")


def codec_for(naming: str, **kw: Any) -> NameCodec:
    """The codec for an endpoint's ``naming:`` (``ftpbc`` or ``dropboxmq``).

    ``kw`` are the codec's keyword arguments; the ftpbc-only ones (prefixes, ``uuid_of``) are
    accepted and ignored for ``dropboxmq``, so callers can pass one set for either.
    """
    if naming == "ftpbc":
        return FtpbcCodec(**kw)
    if naming == "dropboxmq":
        for key in _FTPBC_ONLY:
            kw.pop(key, None)
        return DropboxmqCodec(**kw)
    raise ValueError(f"unknown naming {naming!r}: expected 'ftpbc' or 'dropboxmq'")
