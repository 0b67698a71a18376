"""DropboxMQ's default file names (``docs/naming.md``).

``<priority>.<id>.<class>.<expiration>.<correlation id>.<reply-to>.<type>.<properties>``, e.g.
``4.1140429201295000-9262574723.T.1140429211295.corr1283.TestQueue1.XYZType.prop1S=hello``.
The eight positions are DropboxMQ's grammar and fixed; every other header of the table
(``Headers.table``, its ``dropboxmq`` column naming a property) travels as a reserved property,
as the delivery count does in ``JMSXDeliveryCount``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from ftpbc.model.headers import Headers, Kind, PropertyValue, ms_of, time_of_ms
from ftpbc.model.names import (
    INT_RE,
    NAME_LIMIT,
    NO_PROPERTIES,
    BadName,
    DecodeCache,
    Envelope,
    UnusableName,
    check_limit,
    make_headers,
    pct,
    property_piece,
    property_value,
    unpct,
)

__all__ = ["DELIVERY_COUNT_PROPERTY", "TIMESTAMP_PROPERTY", "DropboxmqCodec"]

_CLASSES = frozenset("MBSPOT")  # Message Bytes Stream maP Object Text
#: the headers DropboxMQ's eight positions carry (the 8th holds the properties), by position
_POSITIONS = {1: "priority", 2: "id", 3: "message_class", 4: "expiration", 5: "correlation_id",
              6: "reply_to", 7: "type"}


def _check_table(headers: type[Headers]) -> None:
    """ValueError unless the table puts every header where this codec carries it: one of the
    fixed positions (as DropboxMQ has them) or a property; otherwise it would be lost."""
    for spec in headers.table.specs:
        where = spec.dropboxmq
        if spec.name == "kind" or isinstance(where, str):
            continue  # the box and the reply-to say the kind
        if where is None or _POSITIONS.get(where) != spec.name:
            raise ValueError(f"header {spec.name!r}: dropboxmq={where!r}, but DropboxMQ names carry it "
                             "only as a property (give dropboxmq='<property name>')")
#: the reserved properties that carry the delivery count and a timestamp (the table's)
DELIVERY_COUNT_PROPERTY = str(Headers.table.by_name["delivery_count"].dropboxmq)
TIMESTAMP_PROPERTY = str(Headers.table.by_name["timestamp"].dropboxmq)
_PRIORITY_RE = re.compile(r"[+-]?[0-9]+")


def _id_stamp(uid: str) -> int | None:
    """Milliseconds embedded in a DropboxMQ id ``<13-digit ms><3-digit counter>-<random>``."""
    head = uid.partition("-")[0]
    if len(head) == 16 and head.isascii() and head.isdigit():
        return int(head[:13])
    return None


def _dpct(text: str) -> str:
    """Percent-encoding for dropboxmq fields: ``.`` too, since it separates the fields."""
    return pct(text).replace(".", "%2E")


class DropboxmqCodec(DecodeCache):
    """DropboxMQ's default file names (see ``docs/naming.md``).

    The name is built from the headers and properties alone: ``encode`` ignores ``base``, and a
    decoded envelope's ``base`` is the whole name.  The delivery count travels as the property
    ``JMSXDeliveryCount`` (I); a timestamp that the id does not already carry (DropboxMQ ids
    begin with the 13-digit millisecond time) as ``JMS_ftpbcTimestamp`` (L); any other header
    whose table row names a property, as that property.  ``headers`` is the class whose table
    decoding reads (Headers, or a subclass adding headers).
    """

    name: str = "dropboxmq"

    def __init__(self, *, limit: int = NAME_LIMIT, headers: type[Headers] = Headers) -> None:
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self._limit = limit
        self._headers = headers
        _check_table(headers)
        self._reserved = headers.table.dropboxmq_properties
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
            ms = ms_of(h.expiration)
            if ms == 0:
                raise ValueError("an expiration at the epoch cannot be written (0 means none)")
            exp = str(ms)
        pieces: list[tuple[str, str]] = []  # (the field it counts for in NameTooLong, text)
        reserved = type(h).table.dropboxmq_properties  # the headers' own table
        for pname, value in properties.items():
            if pname in reserved:
                raise ValueError(f"property name {pname!r} is reserved by dropboxmq naming")
            key, text = property_piece(pname, value)
            pieces.append(("properties", f"{_dpct(key)}={_dpct(text)}"))
        values = h.__dict__
        for pname, spec in reserved.items():
            value = values[spec.name]
            if value is None or value == spec.default:
                continue
            carried = spec.kind.to_property(value)
            if spec.name == "timestamp" and _id_stamp(h.id) == carried:
                continue  # the id already says it
            key, text = property_piece(pname, carried)
            pieces.append((spec.name, f"{_dpct(key)}={_dpct(text)}"))
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
        return check_limit(name, self._limit, parts)

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
            return Envelope(self._headers(filename, kind, message_class="B"), NO_PROPERTIES, filename)
        try:
            return self._decode_fields(filename, fields, direction)
        except BadName as bad:
            raise UnusableName(filename, str(bad)) from None

    def _decode_fields(self, filename: str, fields: list[str], direction: str) -> Envelope:
        if len(fields) > 8:
            raise BadName(f"{len(fields)} dot-separated fields, at most 8")
        fields += [""] * (8 - len(fields))
        ptext, idtext, cls, exptext, corrtext, replytext, typetext, proptext = fields
        if len(ptext.lstrip("+-")) > 9:
            priority = 0 if ptext.startswith("-") else 9
        else:
            priority = min(9, max(0, int(ptext)))
        uid = unpct(idtext, plus=True) or filename
        if not cls:
            cls = "B"
        elif cls not in _CLASSES:
            raise BadName(f"message class {cls!r} is not one of M B S P O T")
        expiration = None
        if exptext:
            if not INT_RE.fullmatch(exptext):
                raise BadName(f"expiration {exptext!r} is not milliseconds since the epoch")
            ms = int(exptext)
            if ms:
                try:
                    expiration = time_of_ms(ms)
                except ValueError as err:
                    raise BadName(str(err)) from None
        corr = unpct(corrtext, plus=True) if corrtext else None
        reply = unpct(replytext, plus=True) if replytext else None
        typ = unpct(typetext, plus=True) if typetext else None
        props: dict[str, PropertyValue] = {}
        seen: set[str] = set()
        kind: Kind = "response" if direction == "out" else "request" if reply is not None else "oneway"
        values: dict[str, Any] = {"id": uid, "kind": kind, "priority": priority, "expiration": expiration,
                                  "correlation_id": corr, "reply_to": reply, "type": typ,
                                  "message_class": cls}
        reserved = self._reserved
        if proptext:
            for pair in proptext.split("&"):
                if not pair:
                    continue  # a stray '&'
                key, eq, raw = pair.partition("=")
                if not eq:
                    raise BadName(f"property {pair!r} has no '='")
                typed = unpct(key, plus=True)
                if not typed:
                    raise BadName(f"property {pair!r} has no type letter")
                pname, letter = typed[:-1], typed[-1]
                if pname in seen:
                    raise BadName(f"property {pname!r} given twice")
                seen.add(pname)
                value = property_value(pname, letter, unpct(raw, plus=True))
                spec = reserved.get(pname)
                if spec is None:
                    props[pname] = value
                    continue
                if letter not in spec.kind.property_letters:
                    raise BadName(f"property {pname!r} must be {spec.kind.what_property}")
                try:
                    values[spec.name] = spec.kind.from_property(value, pname)
                except (ValueError, TypeError) as err:
                    raise BadName(str(err)) from None
        if values.get("timestamp") is None:
            stamp = _id_stamp(uid)
            if stamp is not None:
                try:
                    values["timestamp"] = time_of_ms(stamp)
                except ValueError as err:
                    raise BadName(str(err)) from None
        headers = make_headers(self._headers, values)
        return Envelope(headers, props, filename)


