"""Rulesets: which messages a route sends where.  Pure: no I/O, no clock.

A ruleset selects a message when

* it has no ``properties`` groups, or ANY of them matches: a group (property name -> regular
  expression) matches when EVERY one of its properties is present and its pattern is found in
  the value (``re.search``; anchor with ``^...$`` for a whole value);
* it has no ``body`` groups, or ANY of them matches: a group (a list of regular expressions)
  matches when every pattern is found in the body's first bytes (the caller bounds the read);
* no ``exclude`` group (as ``properties``) and no ``exclude_body`` group (as ``body``) matches.

Rulesets are tried in their order; the first that selects a message wins (:func:`first_match`).
Values are looked up through a :data:`Lookup` the caller builds from a message's properties and
headers; a value is text (``true``/``false`` for booleans, ``str()`` for numbers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ftpbc.routing.templates import Lookup, TemplateError, UriTemplate

#: the longest regular expression a ruleset may hold (a configuration, but bounded all the same)
MAX_PATTERN = 4096

PropertyGroup = Mapping[str, re.Pattern[str]]
BodyGroup = tuple[re.Pattern[str], ...]
Scalar = bool | int | float | str


class RuleError(ValueError):
    """A ruleset that cannot be compiled; ``str()`` is one line naming the key and why."""


def compile_pattern(key: str, text: object) -> re.Pattern[str]:
    if not isinstance(text, str):
        raise RuleError(f"{key}: expected a regular expression (text), got {type(text).__name__}")
    if len(text) > MAX_PATTERN:
        raise RuleError(f"{key}: the pattern is longer than {MAX_PATTERN} characters")
    try:
        return re.compile(text)
    except re.error as exc:
        raise RuleError(f"{key}: bad regular expression {text!r}: {exc}") from None


@dataclass(frozen=True)
class Ruleset:
    """One compiled ruleset (see the module's docstring)."""

    name: str
    template: UriTemplate
    properties: tuple[PropertyGroup, ...] = ()
    exclude: tuple[PropertyGroup, ...] = ()
    body: tuple[BodyGroup, ...] = ()
    exclude_body: tuple[BodyGroup, ...] = ()
    #: properties the routed message gets when it lacks them (and templates see)
    defaults: Mapping[str, Scalar] = field(default_factory=dict)

    @classmethod
    def compile(cls, name: str, *, uri_template: Sequence[str | None],
                uri_substitution: Sequence[str | None] = (),
                properties: Sequence[Mapping[str, str]] = (), exclude: Sequence[Mapping[str, str]] = (),
                body: Sequence[Sequence[str]] = (), exclude_body: Sequence[Sequence[str]] = (),
                defaults: Mapping[str, Scalar] | None = None) -> Ruleset:
        """RuleError naming the key (``properties[0].asset``...) when something does not compile."""
        def groups(key: str, raw: Sequence[Mapping[str, str]]) -> tuple[PropertyGroup, ...]:
            out = []
            for i, g in enumerate(raw):
                if not g:
                    raise RuleError(f"{key}[{i}]: an empty group would match every message")
                out.append({p: compile_pattern(f"{key}[{i}].{p}", text) for p, text in g.items()})
            return tuple(out)

        def body_groups(key: str, raw: Sequence[Sequence[str]]) -> tuple[BodyGroup, ...]:
            out = []
            for i, g in enumerate(raw):
                if not g:
                    raise RuleError(f"{key}[{i}]: an empty group would match every message")
                out.append(tuple(compile_pattern(f"{key}[{i}][{j}]", t) for j, t in enumerate(g)))
            return tuple(out)

        try:
            template = UriTemplate.parse(uri_template, uri_substitution)
        except TemplateError as exc:
            raise RuleError(f"uri_template: {exc}") from None
        return cls(name, template, groups("properties", properties), groups("exclude", exclude),
                   body_groups("body", body), body_groups("exclude_body", exclude_body), dict(defaults or {}))

    @property
    def reads_body(self) -> bool:
        """Whether deciding needs the message's body."""
        return bool(self.body or self.exclude_body)

    def selects(self, lookup: Lookup, body: Callable[[], str]) -> bool:
        """Whether this ruleset takes the message; ``body`` is called only when needed."""
        if self.properties and not any(_group_matches(g, lookup) for g in self.properties):
            return False
        if any(_group_matches(g, lookup) for g in self.exclude):
            return False
        if self.body or self.exclude_body:
            text = body()
            if self.body and not any(all(p.search(text) for p in g) for g in self.body):
                return False
            if any(all(p.search(text) for p in g) for g in self.exclude_body):
                return False
        return True

    def uri(self, lookup: Lookup) -> str:
        """The destination URI for a message this ruleset selected; TemplateError if it cannot
        be built.  ``lookup`` should already see the ruleset's defaults (:func:`with_defaults`)."""
        return self.template.render(lookup)


def _group_matches(group: PropertyGroup, lookup: Lookup) -> bool:
    for name, pattern in group.items():
        value = lookup(name)
        if value is None or pattern.search(value) is None:
            return False
    return True


def first_match(rulesets: Sequence[Ruleset], lookup: Lookup, body: Callable[[], str]) -> Ruleset | None:
    """The first ruleset that selects the message; None: no hit.  ``body`` is read at most once."""
    cache: list[str] = []

    def once() -> str:
        if not cache:
            cache.append(body())
        return cache[0]

    for rs in rulesets:
        if rs.selects(lookup, once):
            return rs
    return None


def text_of(value: Scalar) -> str:
    """A property value as rules and templates see it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def with_defaults(lookup: Lookup, defaults: Mapping[str, Scalar]) -> Lookup:
    """``lookup``, falling back to ``defaults`` for what it lacks."""
    if not defaults:
        return lookup

    def find(name: str) -> str | None:
        value = lookup(name)
        if value is None and name in defaults:
            return text_of(defaults[name])
        return value

    return find
