"""ftpbc file names: ``<base>`` plus ``;key=value`` fields for what differs from the defaults.

``req.<uuid>;p=9;r=audit;.regionS=emea`` (``docs/naming.md``).  Which header a key stands
for, and how its value is written, is the header table's (``Headers.table``): this module knows
only the grammar and what the base says (the kind, the id, ``.error``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ftpbc.model.headers import ERROR_TYPE, Headers, Kind, PropertyValue
from ftpbc.model.names import (
    NAME_LIMIT,
    BadName,
    DecodeCache,
    Envelope,
    UnusableName,
    check_limit,
    field_text,
    make_headers,
    parse_field,
    pct,
    plain_envelope,
    property_piece,
    property_value,
    unpct,
)

__all__ = ["FtpbcCodec"]

_BAD_BASE_RE = re.compile("[/\\\\~;\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_ERROR_SUFFIX = ".error"


class FtpbcCodec(DecodeCache):
    """ftpbc names: ``<base>`` plus ``;key=value`` fields for what is not a default.

    Grammar (``docs/naming.md``)::

        name     = base *( ";" field )
        field    = key "=" value | "." pname type "=" value
        key      = a header's ``ftpbc`` key in the table: "p" priority (one digit)
                 | "n" delivery count (decimal) | "s" timestamp | "e" expiration
                 (YYYYmmddTHHMMSS.mmmZ, UTC) | "c" correlation id | "r" reply-to | "t" type
                 | "k" message class
        type     = B boolean | Y byte | H short | I int | L long | F float | D double | S string

    Values and property names are percent-encoded (UTF-8; only ``A-Z a-z 0-9 - _ .`` are left as
    they are).  ``base`` is ``<request_prefix>...``, ``<oneway_prefix>...``,
    ``<response_prefix><uuid>`` or ``<response_prefix><uuid>.error`` (an error reply).

    ``uuid_of(base)`` gives the id of a request or one-way base (None: not this endpoint's
    name); without it the id is the text after the prefix.  A response's id is always the text
    after its prefix (less ``.error``).  ``uuid_of`` must be a pure function of the name: decoded
    names are cached (up to 16384 per direction), which makes decoding a name listed before one
    dict lookup.  ``headers`` is the class whose table gives the keys (Headers, or a subclass
    adding headers).
    """

    name: str = "ftpbc"

    def __init__(self, *, request_prefix: str = "req.", response_prefix: str = "resp.",
                 oneway_prefix: str = "msg.", uuid_of: Callable[[str], str | None] | None = None,
                 limit: int = NAME_LIMIT, headers: type[Headers] = Headers) -> None:
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
        self._headers = headers
        self._table = headers.table
        for spec in self._table.specs:
            if spec.ftpbc is None and spec.name not in ("id", "kind"):  # the base gives those two
                raise ValueError(f"header {spec.name!r} has no ftpbc key: ftpbc names could not carry it")
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
                check_limit(base, self._limit, [("base", base)])
            return base
        return self._encode_suffix(base, headers, properties)

    def _encode_suffix(self, base: str, h: Headers, properties: Mapping[str, PropertyValue]) -> str:
        parts: list[tuple[str, str]] = [("base", base)]
        add = parts.append
        values = h.__dict__
        response = h.kind == "response"
        for spec in type(h).table.ftpbc:  # the headers' own table: a subclass's are written too
            name = spec.name
            value = values[name]
            if value is None or value == spec.default:
                continue
            # What the base already says is not written again.
            if response and ((name == "correlation_id" and value == h.id)
                             or (name == "type" and value == ERROR_TYPE)):
                continue
            add((name, f";{spec.ftpbc}={field_text(spec, value)}"))
        for pname, value in properties.items():
            key, text = property_piece(pname, value)
            add(("properties", f";.{pct(key)}={pct(text)}"))
        return check_limit("".join(p for _, p in parts), self._limit, parts)

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
            return plain_envelope(self._headers._unchecked(uid, kind, typ), base)
        try:
            return self._decode_suffix(filename, base, semi, uid, kind, typ)
        except BadName as bad:
            raise UnusableName(filename, str(bad)) from None

    def _decode_suffix(self, filename: str, base: str, semi: int, uid: str, kind: Kind,
                       typ: str | None) -> Envelope:
        keys = self._table.ftpbc_keys
        values: dict[str, Any] = {"id": uid, "kind": kind}
        props: dict[str, PropertyValue] = {}
        for token in filename[semi + 1:].split(";"):
            key, eq, raw = token.partition("=")
            if not eq:
                raise BadName(f"field {token!r} has no '='")
            if "=" in raw:
                raise BadName(f"field {token!r} has a second '='")
            if key.startswith("."):
                typed = unpct(key[1:])
                if not typed:
                    raise BadName(f"property field {token!r} has no type letter")
                pname, letter = typed[:-1], typed[-1]
                if pname in props:
                    raise BadName(f"property {pname!r} given twice")
                props[pname] = property_value(pname, letter, unpct(raw))
                continue
            spec = keys.get(key)
            if spec is None:
                raise BadName(f"unknown field {key!r}")
            if spec.name in values:
                raise BadName(f"field {key!r} given twice")
            values[spec.name] = raw
        for name, raw in values.items():
            if name != "id" and name != "kind":
                values[name] = parse_field(self._table.by_name[name], raw)
        if typ is not None:
            if "type" in values:
                raise BadName("an error reply (.error) has no type field")
            values["type"] = typ
        headers = make_headers(self._headers, values)
        return Envelope(headers, props, base)


