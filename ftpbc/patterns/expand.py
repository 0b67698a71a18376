"""Turn a parsed pattern into a concrete name.

One expansion draws one UUID (unless the context supplies one: a response reuses its request's),
one time stamp and one value per distinct counter, however often each occurs in the pattern.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ftpbc.errors import ConfigError, PatternError
from ftpbc.patterns.datefmt import format_field
from ftpbc.patterns.grammar import Counter, DateField, DirName, FileName, Literal, Token, Uuid, Wildcard
from ftpbc.sequences import SequenceStore

Value = str | int


@dataclass(frozen=True)
class ExpandContext:
    """What an expansion may need; only the parts the pattern uses must be set.

    ``now`` defaults to the current time; a naive ``now`` is taken as UTC.  ``tz`` is an IANA
    name or a tzinfo (default UTC).  ``uuid`` forces the value of ``%u``.  ``file``/``directory``
    feed ``%f``/``%p``.  ``store`` and ``endpoint`` serve the counters.
    """

    endpoint: str = ""
    store: SequenceStore | None = None
    now: datetime | None = None
    tz: str | tzinfo | None = None
    uuid: str | uuidlib.UUID | None = None
    file: str | None = None
    directory: str | None = None


@dataclass(frozen=True)
class Expansion:
    """A concrete name and the values used to build it.

    ``values`` keys: ``%u``; each date run as SimpleDateFormat spells it (``yyyy``, ``MM``); each
    counter's token (``%3``, ``%{3}``, ``%{name}``, ``%{#}``); ``%f`` and ``%p``.
    """

    name: str
    uuid: str | None = None
    values: dict[str, Value] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


@lru_cache(maxsize=64)
def _zone(name: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"unknown time zone {name!r} (expected an IANA name like Europe/Paris)") from None


def _local_time(ctx: ExpandContext) -> datetime:
    now = ctx.now or datetime.now(UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    tz = ctx.tz if ctx.tz is not None else UTC
    if isinstance(tz, str):
        tz = _zone(tz)
    return now.astimezone(tz)


def expand(pattern: str, tokens: tuple[Token, ...], ctx: ExpandContext) -> Expansion:
    """The name ``tokens`` (parsed from ``pattern``) give in ``ctx``."""
    parts: list[str] = []
    values: dict[str, Value] = {}
    when: datetime | None = None
    for tok in tokens:
        if isinstance(tok, Literal):
            parts.append(tok.text)
        elif isinstance(tok, Uuid):
            if "%u" not in values:
                values["%u"] = str(ctx.uuid if ctx.uuid is not None else uuidlib.uuid4())
            parts.append(str(values["%u"]))
        elif isinstance(tok, DateField):
            if when is None:
                when = _local_time(ctx)
            text = format_field(tok.letter, tok.count, when)
            values[tok.key] = text
            parts.append(text)
        elif isinstance(tok, Counter):
            if tok.token not in values:
                values[tok.token] = _draw(pattern, tok, ctx)
            parts.append(f"{values[tok.token]:0{tok.width}d}")
        elif isinstance(tok, FileName):
            parts.append(_required(pattern, "%f", ctx.file, "the working file's name"))
            values["%f"] = parts[-1]
        elif isinstance(tok, DirName):
            parts.append(_required(pattern, "%p", ctx.directory, "the working file's directory"))
            values["%p"] = parts[-1]
        elif isinstance(tok, Wildcard):
            raise PatternError(pattern, pattern.find("%*") + 1,
                               "the wildcard %* only selects files: it cannot make a name")
    uid = values.get("%u")
    return Expansion("".join(parts), str(uid) if uid is not None else None, values)


def _required(pattern: str, token: str, value: str | None, what: str) -> str:
    if value is None:
        raise ConfigError(f"pattern {pattern!r}: {token} needs {what}, and none was given here")
    return value


def _draw(pattern: str, tok: Counter, ctx: ExpandContext) -> int:
    if ctx.store is None:
        raise ConfigError(f"pattern {pattern!r}: {tok.token} needs a sequence store (node.state_dir)")
    endpoint = ctx.endpoint if tok.kind != "global" else None
    if tok.kind != "global" and not ctx.endpoint:
        raise ConfigError(f"pattern {pattern!r}: {tok.token} is per endpoint and no endpoint was given")
    return ctx.store.next(tok.kind, endpoint, tok.key)
