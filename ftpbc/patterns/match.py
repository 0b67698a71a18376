"""Select file names with a pattern and extract the values they carry.

The pattern compiles once to an anchored regular expression:

* ``%u`` matches exactly a canonical UUID (lower-case hex, 8-4-4-4-12), as ``str(uuid4())`` and
  Java's ``UUID.toString()`` write it;
* a date run matches the digits or English names it can produce (``%M%M`` two digits, ``%E`` a
  short day name);
* a counter of width ``w`` matches ``w`` or more digits;
* ``%f`` matches one or more characters other than ``/``, ``%p`` and the wildcard ``%*`` any run;
* literals match themselves.

Repeated ``%u``, date runs, ``%f`` and ``%p`` must repeat the same text (back-references); a counter
repeated with different widths must hold the same number, checked after the regex matched.

Not guaranteed: when two variable-width tokens touch (``%0%1``, ``%d%H``), a name can split more
than one way; the regex then takes the leftmost-longest split, which may not be the one that made
the name.  Put a literal between them when their values matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ftpbc.patterns.datefmt import field_regex
from ftpbc.patterns.grammar import Counter, DateField, DirName, FileName, Literal, Token, Uuid, Wildcard

UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

Value = str | int


@dataclass(frozen=True)
class Match:
    """The values a matching name carries; keys as in :class:`ftpbc.patterns.Expansion`."""

    name: str
    values: dict[str, Value] = field(default_factory=dict)
    #: what each ``%*`` matched, in order
    wildcards: tuple[str, ...] = ()

    @property
    def uuid(self) -> str | None:
        value = self.values.get("%u")
        return str(value) if value is not None else None


@dataclass(frozen=True)
class Group:
    name: str
    key: str | None  # None for a wildcard
    numeric: bool


class Matcher:
    """A compiled pattern: ``matcher.match(name)`` -> :class:`Match` or None."""

    def __init__(self, tokens: tuple[Token, ...]) -> None:
        parts: list[str] = []
        self.groups: list[Group] = []
        # key -> (group name, regex of its first occurrence) to back-reference identical repeats
        seen: dict[str, tuple[str, str]] = {}
        self.literal: str | None = None
        if all(isinstance(t, Literal) for t in tokens):
            self.literal = "".join(t.text for t in tokens if isinstance(t, Literal))
        for tok in tokens:
            if isinstance(tok, Literal):
                parts.append(re.escape(tok.text))
                continue
            if isinstance(tok, Wildcard):
                name = f"g{len(self.groups)}"
                self.groups.append(Group(name, None, False))
                parts.append(f"(?P<{name}>.*)")
                continue
            key, regex, numeric = _describe(tok)
            previous = seen.get(key)
            if previous is not None and previous[1] == regex:
                parts.append(f"(?P={previous[0]})")
                continue
            name = f"g{len(self.groups)}"
            self.groups.append(Group(name, key, numeric))
            seen.setdefault(key, (name, regex))
            parts.append(f"(?P<{name}>{regex})")
        self.regex = re.compile("".join(parts), re.DOTALL)

    def match(self, name: str) -> Match | None:
        if self.literal is not None:
            return Match(name) if name == self.literal else None
        found = self.regex.fullmatch(name)
        if found is None:
            return None
        values: dict[str, Value] = {}
        wildcards: list[str] = []
        for group in self.groups:
            text = found.group(group.name)
            if group.key is None:
                wildcards.append(text)
                continue
            value: Value = int(text) if group.numeric else text
            if values.setdefault(group.key, value) != value:
                return None  # one counter, two different numbers
        return Match(name, values, tuple(wildcards))


def _describe(tok: Token) -> tuple[str, str, bool]:
    """(key, regex, numeric) of a value-bearing token."""
    if isinstance(tok, Uuid):
        return "%u", UUID_RE, False
    if isinstance(tok, DateField):
        return tok.key, field_regex(tok.letter, tok.count), False
    if isinstance(tok, Counter):
        return tok.token, f"[0-9]{{{tok.width},}}", True
    if isinstance(tok, FileName):
        return "%f", "[^/]+", False
    if isinstance(tok, DirName):
        return "%p", ".*", False
    raise TypeError(f"unexpected token {tok!r}")  # pragma: no cover - exhaustive above
