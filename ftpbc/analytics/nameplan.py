"""A request name pattern (``message_name``) as a Java regular expression, for Spark's SQL functions.

:class:`ftpbc.analytics.nametime.NameReader` reads a request's UUID and submit time with
:class:`ftpbc.patterns.match.Matcher`, a Python regular expression built from the pattern's
tokens.  Spark's ``rlike`` and ``regexp_replace`` run Java's ``java.util.regex`` in the JVM; this
module builds the same expression for it, token by token, with the same capturing groups in
the same order, so that both engines take the same match (both are backtracking engines with
leftmost-first alternation, and the expression uses nothing whose meaning differs between
them):

* literals as ``\\x{hex}`` escapes (letters and digits as they are), so no character of a
  pattern is ever read as regex syntax by Java;
* date fields, ``%u``, ``%f``, ``%p``, ``%*`` and counters through the very regexes ``Matcher`` uses
  (``[0-9]{2}``, ``(?:Jan|Feb...)``, ``[^/]+``...), whose syntax is the same in both;
* a repeated token as a named back-reference (``\\k<g1>``, Python's ``(?P=g1)``);
* anchored with ``\\A`` and ``\\z`` (Java's ``$`` would also match before a final line break)
  and ``(?s)``, as ``Matcher`` compiles with ``re.DOTALL`` and calls ``fullmatch``.

The :class:`NamePlan` also says, statically, which group gives the year, month, day... the way
``NameReader._instant`` looks them up in the match's values: the pattern decides which keys a
match has, so the choice never depends on the name.

No pyspark here: :mod:`ftpbc.analytics.sqlnames` turns a plan into Spark columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ftpbc.patterns.grammar import Literal, Token, Wildcard, parse
from ftpbc.patterns.match import Matcher, _describe

#: the lookups of ``NameReader._instant``: the first key the pattern has wins
_YEAR = ("yyyy", "yyy", "y")
_YEAR2 = ("yy",)
_MONTH = ("MM", "M")
_DAY = ("dd", "d")
_DOY = ("DDD", "DD", "D")
_HOUR = ("HH", "H")
_HOUR_K = ("kk", "k")
_HOUR_12 = ("hh", "h", "KK", "K")
_MINUTE = ("mm", "m")
_SECOND = ("ss", "s")
_MILLI = ("SSS", "SS", "S")


def java_literal(text: str) -> str:
    """``text`` as a Java regex matching exactly it: ASCII letters and digits as they are,
    every other character as ``\\x{hex}``."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


@dataclass(frozen=True)
class NamePlan:
    """What Spark needs to read one ``message_name``: its regex and where each value is.

    Group numbers are 1-based, as Java numbers them; None where the pattern has no such field.
    """

    regex: str
    #: groups that must hold the same number (one counter written with two widths)
    same_number: tuple[tuple[int, int], ...] = ()
    uuid: int | None = None
    #: (group, offset): the year is the group's number plus offset (2000 for ``yy``)
    year: tuple[int, int] | None = None
    month: int | None = None
    day: int | None = None
    day_of_year: int | None = None
    hour: int | None = None
    hour_k: int | None = None
    hour_12: int | None = None
    am_pm: int | None = None
    minute: int | None = None
    second: int | None = None
    milli: int | None = None
    #: precision of the time in the name; None when the name carries no usable time
    precision_us: int | None = None
    #: every group whose value the plan reads (the ones Spark extracts)
    used: tuple[int, ...] = field(default=())


def plan(message_name: str, precision_us: int | None) -> NamePlan:
    """The plan of ``message_name``; ``precision_us`` is ``NameReader.precision_us`` (None:
    the pattern has no year and day, so the name's time is never used)."""
    tokens: tuple[Token, ...] = parse(message_name)
    matcher = Matcher(tokens)  # the Python side: its groups are the ones numbered here
    parts: list[str] = []
    first: dict[str, tuple[int, str]] = {}  # key -> (group number, regex) of its first occurrence
    numeric_groups: dict[str, list[int]] = {}
    group = 0
    for tok in tokens:
        if isinstance(tok, Literal):
            parts.append(java_literal(tok.text))
            continue
        if isinstance(tok, Wildcard):
            group += 1
            parts.append(f"(?<g{group}>.*)")
            continue
        key, regex, numeric = _describe(tok)
        previous = first.get(key)
        if previous is not None and previous[1] == regex:
            parts.append(f"\\k<g{previous[0]}>")
            continue
        group += 1
        first.setdefault(key, (group, regex))
        if numeric:
            numeric_groups.setdefault(key, []).append(group)
        parts.append(f"(?<g{group}>{regex})")
    if group != len(matcher.groups):  # pragma: no cover - the two walks are the same walk
        raise AssertionError(f"{message_name!r}: {group} Java groups for {len(matcher.groups)} Python groups")
    same = tuple((gs[0], g) for gs in numeric_groups.values() for g in gs[1:])

    def pick(keys: tuple[str, ...]) -> int | None:
        for k in keys:
            if k in first:
                return first[k][0]
        return None

    year: tuple[int, int] | None = None
    if precision_us is not None:
        y = pick(_YEAR)
        if y is not None:
            year = (y, 0)
        else:
            y2 = pick(_YEAR2)
            year = (y2, 2000) if y2 is not None else None
    if not ((pick(_MONTH) is not None and pick(_DAY) is not None) or pick(_DOY) is not None):
        year = None  # NameReader._instant: no month and day, no day of year -> no time
    hour = pick(_HOUR)
    hour_k = pick(_HOUR_K) if hour is None else None
    hour_12 = pick(_HOUR_12) if hour is None and hour_k is None else None
    p = NamePlan(
        regex="(?s)\\A" + "".join(parts) + "\\z", same_number=same, uuid=first.get("%u", (None,))[0],
        year=year, month=pick(_MONTH), day=pick(_DAY), day_of_year=pick(_DOY), hour=hour,
        hour_k=hour_k, hour_12=hour_12, am_pm=first["a"][0] if "a" in first and hour_12 else None,
        minute=pick(_MINUTE), second=pick(_SECOND), milli=pick(_MILLI),
        precision_us=precision_us if year is not None else None)
    used = {g for pair in same for g in pair}
    for g in (p.uuid, p.month, p.day, p.day_of_year, p.hour, p.hour_k, p.hour_12, p.am_pm, p.minute,
              p.second, p.milli, year[0] if year else None):
        if g is not None:
            used.add(g)
    return NamePlan(**{**p.__dict__, "used": tuple(sorted(used))})
