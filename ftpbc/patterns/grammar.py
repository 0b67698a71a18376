"""Parse a name pattern into tokens; every mistake is a PatternError with its column (1-based).

Tokens (see docs/patterns.md)::

    %u            UUID                      %%        a literal '%'
    %y %M %d ...  SimpleDateFormat letter   %f %p     working file's name / directory
    %0 .. %9      node-local counter        %*        wildcard (matching only)
    %{0}..%{9}    cluster-shared counter    %{name}   global named sequence
    %{#}          transient in-memory counter (the spec's "transient %d")

A run of the same date letter is one field (``%y%y%y%y`` is ``yyyy``); a run of the same counter
token sets its zero-padded width (``%1%1%1`` gives ``007``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ftpbc.errors import PatternError
from ftpbc.patterns.datefmt import LETTERS
from ftpbc.sequences import SEQUENCE_NAME_RE, SequenceKind

TRANSIENT_KEY = "#"


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Uuid:
    pass


@dataclass(frozen=True)
class DateField:
    letter: str
    count: int

    @property
    def key(self) -> str:
        """``yyyy``: the SimpleDateFormat spelling, used as the key of extracted values."""
        return self.letter * self.count


@dataclass(frozen=True)
class Counter:
    kind: SequenceKind
    key: str
    width: int

    @property
    def token(self) -> str:
        """``%3``, ``%{3}``, ``%{name}`` or ``%{#}``: the key of extracted values."""
        return f"%{self.key}" if self.kind == "local" else f"%{{{self.key}}}"


@dataclass(frozen=True)
class FileName:
    pass


@dataclass(frozen=True)
class DirName:
    pass


@dataclass(frozen=True)
class Wildcard:
    pass


Token = Literal | Uuid | DateField | Counter | FileName | DirName | Wildcard

_SIMPLE: dict[str, Token] = {"u": Uuid(), "f": FileName(), "p": DirName(), "*": Wildcard()}
_EXPECTED_LETTER = ("expected one of u, f, p, *, %, 0-9, {, or a date letter "
                    + " ".join(LETTERS))


def _brace(pattern: str, start: int) -> tuple[Counter, int]:
    """The ``%{...}`` token whose ``{`` is at index ``start``; returns it and the index after ``}``."""
    close = pattern.find("}", start + 1)
    if close < 0:
        # Point at the first character that cannot belong to a name, else at the end.
        for i in range(start + 1, len(pattern)):
            if not SEQUENCE_NAME_RE.fullmatch(pattern[i]) and pattern[i] != TRANSIENT_KEY:
                raise PatternError(pattern, i + 1,
                                   f"expected a sequence name character [0-9A-Za-z._-] or '}}' "
                                   f"closing '%{{' of column {start}, found {pattern[i]!r}")
        raise PatternError(pattern, len(pattern) + 1,
                           f"expected '}}' closing '%{{' of column {start}")
    name = pattern[start + 1:close]
    if name == TRANSIENT_KEY:
        return Counter("transient", TRANSIENT_KEY, 1), close + 1
    if not name:
        raise PatternError(pattern, close + 1, "expected a sequence name [0-9A-Za-z._-]+ or # inside %{}")
    for offset, ch in enumerate(name):
        if not SEQUENCE_NAME_RE.fullmatch(ch):
            raise PatternError(pattern, start + 2 + offset,
                               f"expected a sequence name character [0-9A-Za-z._-], found {ch!r}")
    if name in (".", ".."):
        raise PatternError(pattern, start + 2, f"sequence name {name!r} is not allowed")
    if len(name) == 1 and name.isdigit():
        return Counter("shared", name, 1), close + 1
    return Counter("global", name, 1), close + 1


def _scan(pattern: str) -> list[Token]:
    """Tokens one by one, before runs are merged."""
    tokens: list[Token] = []
    i = 0
    n = len(pattern)
    while i < n:
        pct = pattern.find("%", i)
        if pct < 0:
            tokens.append(Literal(pattern[i:]))
            break
        if pct > i:
            tokens.append(Literal(pattern[i:pct]))
        if pct + 1 >= n:
            raise PatternError(pattern, pct + 2, f"expected a token after '%' ({_EXPECTED_LETTER})")
        ch = pattern[pct + 1]
        i = pct + 2
        if ch == "%":
            tokens.append(Literal("%"))
        elif ch in _SIMPLE:
            tokens.append(_SIMPLE[ch])
        elif ch.isascii() and ch.isdigit():
            tokens.append(Counter("local", ch, 1))
        elif ch in LETTERS:
            tokens.append(DateField(ch, 1))
        elif ch == "{":
            token, i = _brace(pattern, pct + 1)
            tokens.append(token)
        else:
            raise PatternError(pattern, pct + 2, f"unknown token '%{ch}': {_EXPECTED_LETTER}")
    return tokens


def _merge(tokens: list[Token]) -> tuple[Token, ...]:
    """Join runs: adjacent literals, same date letter (count), same counter (width)."""
    out: list[Token] = []
    for tok in tokens:
        prev = out[-1] if out else None
        if isinstance(tok, Literal) and isinstance(prev, Literal):
            out[-1] = Literal(prev.text + tok.text)
        elif isinstance(tok, DateField) and isinstance(prev, DateField) and prev.letter == tok.letter:
            out[-1] = DateField(tok.letter, prev.count + 1)
        elif (isinstance(tok, Counter) and isinstance(prev, Counter)
              and (prev.kind, prev.key) == (tok.kind, tok.key)):
            out[-1] = Counter(tok.kind, tok.key, prev.width + 1)
        else:
            out.append(tok)
    return tuple(out)


def parse(pattern: str) -> tuple[Token, ...]:
    """The tokens of ``pattern``; :class:`PatternError` names the column of the first mistake."""
    return _merge(_scan(pattern))
