"""File-name patterns: make names for outgoing files, select and decode incoming ones.

Public API (the grammar is in docs/patterns.md)::

    p = Pattern.parse("req.%u.%{myseq}")       # PatternError (with column) if malformed; cached
    p.has_uuid, p.uses_sequences, p.has_wildcard, p.is_literal
    e = p.expand(ExpandContext(endpoint="quote", store=store, tz="Europe/Paris"))
    e.name   -> "req.4d4f6177-f085-456b-94d1-1ed22baae814.41"
    e.uuid, e.values -> {"%u": "4d4f...", "%{myseq}": 41}
    m = p.match("req.4d4f6177-f085-456b-94d1-1ed22baae814.41")   # None if it does not match
    m.uuid, m.values                                                  # the same values back

Guarantees: ``parse`` accepts exactly the grammar and rejects everything else when the
configuration loads; ``p.match(p.expand(ctx).name)`` always matches, and gives back the values
used whenever no two variable-width tokens touch (see :mod:`ftpbc.patterns.match`).  Each
``expand`` draws one value per distinct counter (one increment), one UUID and one time stamp.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

from ftpbc.errors import PatternError
from ftpbc.patterns.expand import ExpandContext, Expansion, expand
from ftpbc.patterns.grammar import Counter, DateField, Token, Uuid, Wildcard, parse
from ftpbc.patterns.match import UUID_RE, Match, Matcher

__all__ = ["UUID_RE", "ExpandContext", "Expansion", "Match", "Pattern", "PatternError"]


class Pattern:
    """A parsed, immutable name pattern.  Build it with :meth:`Pattern.parse`."""

    __slots__ = ("__dict__", "text", "tokens")

    def __init__(self, text: str, tokens: tuple[Token, ...]) -> None:
        self.text = text
        self.tokens = tokens

    @staticmethod
    @lru_cache(maxsize=1024)
    def parse(text: str) -> Pattern:
        """The pattern ``text``; :class:`PatternError` names the column of the first mistake."""
        return Pattern(text, parse(text))

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    # ------------------------------------------------------------------------------ properties

    @cached_property
    def has_uuid(self) -> bool:
        return any(isinstance(t, Uuid) for t in self.tokens)

    @cached_property
    def uses_sequences(self) -> bool:
        """True when expanding draws from a counter (and so needs a SequenceStore)."""
        return any(isinstance(t, Counter) for t in self.tokens)

    @cached_property
    def has_wildcard(self) -> bool:
        """True when the pattern can only select files (``%*``): ``expand`` would refuse it."""
        return any(isinstance(t, Wildcard) for t in self.tokens)

    @cached_property
    def has_date(self) -> bool:
        return any(isinstance(t, DateField) for t in self.tokens)

    @cached_property
    def is_literal(self) -> bool:
        """True when the pattern is a plain name (after ``%%`` became ``%``)."""
        return self._matcher.literal is not None

    # ------------------------------------------------------------------------------ operations

    def expand(self, ctx: ExpandContext | None = None) -> Expansion:
        """A concrete name and the values used (draws sequence values: call once per file)."""
        return expand(self.text, self.tokens, ctx or ExpandContext())

    def match(self, name: str) -> Match | None:
        """The values ``name`` carries if the whole name matches, else None."""
        return self._matcher.match(name)

    @cached_property
    def regex(self) -> str:
        """The anchored regular expression used by :meth:`match` (for logs and docs)."""
        return self._matcher.regex.pattern

    @cached_property
    def _matcher(self) -> Matcher:
        return Matcher(self.tokens)
