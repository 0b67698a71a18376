"""Completion markers ("done files"): the name of the empty file a partner puts beside a data
file once that file is whole (a transfer's ``done_file``, docs/transfers.md).

A marker pattern is a name (no directory: the marker lies beside its data file) made of
literal text and these tokens only:

``%f``  the data file's whole name (``%f.done`` -> ``ORD_1.xml.done``)
``%*``  what the n-th ``%*`` of ``receive_from`` matched in the data file's name
        (``receive_from: /out/ORD_%*.xml`` with ``done_file: ORD_%*.ok`` -> ``ORD_1.ok``)
``%%``  a literal ``%``

Guaranteed: :meth:`MarkerPattern.parse` refuses anything else, and a pattern whose marker can
be the data file's own name (no literal text); :meth:`MarkerPattern.is_marker` is true of every
name :meth:`MarkerPattern.name_for` can give.  Not guaranteed: that a name of the marker's shape
is a marker rather than data (a receiver treats every such name as a marker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ftpbc.errors import PatternError
from ftpbc.patterns import Pattern
from ftpbc.patterns.grammar import FileName, Literal, Token, Wildcard

_ALLOWED = "%f (the data file's name), %* (what receive_from's n-th %* matched) or %%"


@dataclass(frozen=True)
class MarkerPattern:
    """A parsed ``done_file`` pattern.  Build it with :meth:`parse`."""

    text: str
    tokens: tuple[Token, ...]

    @classmethod
    def parse(cls, text: str) -> MarkerPattern:
        """The marker pattern ``text``; PatternError (with the column) for a token other than
        ``%f``, ``%*`` or ``%%``, a ``/``, or a pattern with no literal text."""
        i = 0
        while i < len(text):
            if text[i] == "/":
                raise PatternError(text, i + 1, "a marker lies beside its data file: no '/'")
            if text[i] == "%":
                token = text[i:i + 2]
                if token not in ("%f", "%*", "%%"):
                    raise PatternError(text, i + 1, f"unknown token {token!r} in a marker name: "
                                                    f"expected {_ALLOWED}")
                i += 2
                continue
            i += 1
        pattern = Pattern.parse(text)
        if not any(isinstance(t, FileName | Wildcard) for t in pattern.tokens):
            raise PatternError(text, 1, "a marker names the file it marks: use %f or %*")
        if not any(isinstance(t, Literal) and t.text for t in pattern.tokens):
            raise PatternError(text, 1, "a marker needs literal text (e.g. '%f.done'), or it "
                                        "could be the data file itself")
        return cls(text, pattern.tokens)

    @property
    def wildcards(self) -> int:
        """How many ``%*`` the pattern uses (receive_from must have at least as many)."""
        return sum(isinstance(t, Wildcard) for t in self.tokens)

    def name_for(self, file: str, wildcards: Sequence[str]) -> str:
        """The marker of data file ``file``, whose receive pattern's ``%*`` matched
        ``wildcards`` (in order; one too few is a ValueError)."""
        parts: list[str] = []
        n = 0
        for tok in self.tokens:
            if isinstance(tok, Literal):
                parts.append(tok.text)
            elif isinstance(tok, FileName):
                parts.append(file)
            else:
                if n >= len(wildcards):
                    raise ValueError(f"done_file {self.text!r} uses {self.wildcards} %* but "
                                     f"{file!r} matched {len(wildcards)}")
                parts.append(wildcards[n])
                n += 1
        return "".join(parts)

    def is_marker(self, name: str) -> bool:
        """Whether ``name`` has the shape of a marker (of some data file)."""
        return Pattern.parse(self.text).match(name) is not None


__all__ = ["MarkerPattern"]
