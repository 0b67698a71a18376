"""What both file-name codecs share: the envelope, the codec protocol, its errors, and the
encoding of text, times and properties in names.

The codecs themselves are ``ftpbc_names`` and ``dropboxmq_names``; ``envelope`` picks one per
endpoint (``codec_for``).  Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol
from urllib.parse import quote, unquote_to_bytes

from ftpbc.errors import FtpbcError
from ftpbc.model.headers import Headers, HeaderSpec, PropertyValue

Direction = Literal["in", "out"]
NAME_LIMIT = 255  # bytes (UTF-8): most servers' limit for one path segment

_INT32 = 2**31
_INT64 = 2**63

#: the properties of a message that has none (shared, read-only)
NO_PROPERTIES: Mapping[str, PropertyValue] = MappingProxyType({})

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


class BadName(Exception):
    """Why a name does not decode: raised inside a codec, turned into UnusableName with the name."""


# --------------------------------------------------------------------------- envelope


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
        if props is not NO_PROPERTIES:
            object.__setattr__(self, "properties", MappingProxyType(dict(props)) if props else NO_PROPERTIES)

    def __reduce__(self) -> tuple[Any, ...]:  # the read-only mapping itself does not pickle
        return (Envelope, (self.headers, dict(self.properties), self.base))

    def replace(self, **header_changes: Any) -> Envelope:
        """A new envelope whose headers have ``header_changes`` (e.g. ``delivery_count=n + 1``)."""
        return Envelope(dataclasses.replace(self.headers, **header_changes), self.properties, self.base)


def plain_envelope(headers: Headers, base: str) -> Envelope:
    """``Envelope(headers, {}, base)`` without the copy: the hot path of decoding a plain name."""
    e = object.__new__(Envelope)
    object.__setattr__(e, "__dict__", {"headers": headers, "properties": NO_PROPERTIES, "base": base})
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


def pct(text: str) -> str:
    """Percent-encode all but ``A-Z a-z 0-9 - _ .`` (UTF-8): never ``/ \\ ~ ; = & % .``-safe."""
    if _SAFE_RE.fullmatch(text):
        return text
    try:
        return quote(text, safe="").replace("~", "%7E")
    except UnicodeEncodeError:
        raise ValueError(f"{text!r} is not encodable as UTF-8 (lone surrogate)") from None


_SAFE_RE = re.compile(r"[A-Za-z0-9_.\-]*")
_BAD_PCT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def unpct(text: str, plus: bool = False) -> str:
    """Strict percent-decoding: malformed escapes and invalid UTF-8 are errors."""
    if plus and "+" in text:
        text = text.replace("+", " ")
    if "%" not in text:
        return text
    if _BAD_PCT_RE.search(text):
        raise BadName(f"bad percent-encoding in {text!r}")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeError:
        raise BadName(f"percent-encoding of {text!r} is not UTF-8") from None


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def property_piece(name: str, value: object) -> tuple[str, str]:
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


INT_RE = re.compile(r"[+-]?[0-9]{1,19}")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")
_FLOAT_WORDS = frozenset(s + w for s in ("", "+", "-") for w in ("nan", "inf", "infinity"))
INT_RANGES = {"Y": 2**7, "H": 2**15, "I": _INT32, "L": _INT64}


def property_value(name: str, letter: str, text: str) -> PropertyValue:
    if letter == "S":
        return text
    if letter == "B":
        low = text.lower()
        if low == "true":
            return True
        if low == "false":
            return False
        raise BadName(f"property {name!r}: {text!r} is not true or false")
    bound = INT_RANGES.get(letter)
    if bound is not None:
        if INT_RE.fullmatch(text):
            v = int(text)
            if -bound <= v < bound:
                return v
        raise BadName(f"property {name!r}: {text!r} is not an integer of type {letter}")
    if letter in ("D", "F"):
        if _FLOAT_RE.fullmatch(text) or text.lower() in _FLOAT_WORDS:
            return float(text)
        raise BadName(f"property {name!r}: {text!r} is not a number")
    raise BadName(f"property {name!r}: unknown type letter {letter!r} (expected one of B Y H I L F D S)")


def check_limit(name: str, limit: int, parts: list[tuple[str, str]]) -> str:
    if len(name) <= limit // 4:  # at most 4 UTF-8 bytes per character: surely short enough
        return name
    length = len(name) if name.isascii() else len(name.encode("utf-8"))
    if length <= limit:
        return name
    sizes: dict[str, int] = {}
    for field, piece in parts:
        sizes[field] = sizes.get(field, 0) + len(piece.encode("utf-8"))
    raise NameTooLong(limit, length, sizes)


def check_direction(direction: str) -> None:
    if direction != "in" and direction != "out":
        raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")


def parse_field(spec: HeaderSpec, text: str) -> Any:
    """The value of header ``spec`` from the text of its field (percent-encoded if its kind is)."""
    if spec.kind.encoded:
        text = unpct(text)
    try:
        return spec.kind.parse(text, spec.name)
    except ValueError as err:
        raise BadName(str(err)) from None


def field_text(spec: HeaderSpec, value: Any) -> str:
    """The text of header ``spec``'s field for ``value`` (percent-encoded if its kind is)."""
    text = spec.kind.text(value)
    return pct(text) if spec.kind.encoded else text


def make_headers(cls: type[Headers], values: dict[str, Any]) -> Headers:
    """``cls(**values)``, a bad value being a reason the name is unusable."""
    try:
        return cls(**values)
    except (ValueError, TypeError) as err:
        raise BadName(str(err)) from None


_CACHE_SIZE = 16384  # decoded names kept per codec and direction


class DecodeCache:
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
            check_direction(direction)
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


