"""Selectors cost bounded time and never raise anything but SelectorError (docs/security.md).

Selectors arrive from files anyone who can write to the exchange area may plant (subscription
markers), so every input either compiles, within the limits, into a selector whose evaluation is
linear in its size and in the values it reads, or is refused by a SelectorError naming the limit.
The time budgets below bound algorithmic blow-up (the inputs took seconds to minutes, or raised
RecursionError, before the limits): they are generous for a loaded machine, not benchmarks.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftpbc.config.models import EndpointConfig
from ftpbc.errors import SelectorError
from ftpbc.model.envelope import Headers
from ftpbc.model.selector import (
    MAX_DEPTH,
    MAX_IN_LIST,
    MAX_SELECTOR_LENGTH,
    LikeMatcher,
    Selector,
    compile_selector,
)

HEADERS = Headers(id="m", priority=4)
#: CPU seconds one compile and evaluation may take, however hostile the input.  CPU time of the
#: calling thread, not wall time: what the selector itself costs, whatever else the machine runs
#: (a backtracking matcher blows far past it on a loaded machine and an idle one alike).  Not
#: tight: a thread's CPU time still grows several-fold when other processes share its core and
#: its caches, and the costliest accepted input (the longest operator chain) must fit in it then.
BUDGET = 2.0


def timed(text: str, props: dict[str, Any]) -> tuple[bool | SelectorError | None, float]:
    """``Selector(text).evaluate(...)`` (uncached), or the SelectorError; and the CPU seconds it
    took."""
    started = time.thread_time()
    try:
        result: bool | SelectorError | None = Selector(text).evaluate(HEADERS, props)
    except SelectorError as exc:
        result = exc
    return result, time.thread_time() - started


# --------------------------------------------------------------------------- the reported inputs


def test_like_with_many_percent_signs_is_linear() -> None:
    result, seconds = timed("a LIKE '%a%a%a%a%a%a%a%a%b'", {"a": "a" * 60})
    assert result is False and seconds < BUDGET, seconds
    result, seconds = timed("a LIKE '%a%a%a%a%a%a%a%a%b'", {"a": "a" * 60 + "b"})
    assert result is True and seconds < BUDGET, seconds


@pytest.mark.parametrize(("text", "limit"), ids=lambda v: v[:20] if isinstance(v, str) else None, argvalues=[
    ("(" * 3000 + "a = 1" + ")" * 3000, "MAX_DEPTH"),
    ("(" * 50_000 + "a = 1" + ")" * 50_000, "MAX_SELECTOR_LENGTH"),
    ("NOT " * 20_000 + "a = 1", "MAX_SELECTOR_LENGTH"),
    ("a = " + "-" * 30_000 + "1", "MAX_SELECTOR_LENGTH"),
    # the same shapes within the length limit: refused by the depth limit
    ("NOT " * 3000 + "a = 1", "MAX_DEPTH"),
    ("a = " + "-" * 3000 + "1", "MAX_DEPTH"),
    ("a = " + "-" * 3000 + "b", "MAX_DEPTH"),
    ("a = " + "+" * 3000 + "b", "MAX_DEPTH"),
    ("a = " + "(" * 3000 + "1" + ")" * 3000, "MAX_DEPTH"),
    ("a IN (" + ", ".join(["'x'"] * (MAX_IN_LIST + 1)) + ")", "MAX_IN_LIST"),
])
def test_hostile_selectors_are_refused_fast_naming_the_limit(text: str, limit: str) -> None:
    result, seconds = timed(text, {"a": 1})
    assert isinstance(result, SelectorError), result
    assert limit in str(result) and "\n" not in str(result), str(result)[-200:]
    assert seconds < BUDGET, seconds


def test_the_limits_themselves_are_allowed() -> None:
    depth = MAX_DEPTH
    assert Selector("(" * depth + "a = 1" + ")" * depth).matches(HEADERS, {"a": 1})
    assert Selector("NOT " * depth + "a = 1").matches(HEADERS, {"a": 1 + depth % 2})
    assert Selector("a = " + "-" * depth + "1").matches(HEADERS, {"a": (-1) ** depth})
    assert Selector("a IN (" + ", ".join(f"'{n}'" for n in range(MAX_IN_LIST)) + ")").matches(
        HEADERS, {"a": str(MAX_IN_LIST - 1)})
    text = "a = 1 OR " * ((MAX_SELECTOR_LENGTH - 5) // 9) + "a = 2"
    assert len(text) <= MAX_SELECTOR_LENGTH
    assert Selector(text).matches(HEADERS, {"a": 2})
    with pytest.raises(SelectorError, match="MAX_DEPTH"):
        Selector("(" * (depth + 1) + "a = 1" + ")" * (depth + 1))
    with pytest.raises(SelectorError, match="MAX_SELECTOR_LENGTH"):
        Selector(" " * MAX_SELECTOR_LENGTH + "a")


def test_long_operator_chains_do_not_nest() -> None:
    """``a + a + ... + a``: as long as the length limit allows, evaluated in a loop, not by a
    recursion as deep as the chain."""
    terms = (MAX_SELECTOR_LENGTH - 20) // 2
    base = DepthProbe(a=1, x=1)
    Selector("x = a").evaluate(HEADERS, base)
    for op, x in (("+", terms), ("*", 1)):
        text = "x = " + op.join(["a"] * terms)
        result, seconds = timed(text, {"a": 1, "x": x})
        assert result is True and seconds < BUDGET, (op, seconds)
        probe = DepthProbe(a=1, x=x)
        assert Selector(text).evaluate(HEADERS, probe) is True
        assert probe.deepest - base.deepest <= 8, (op, probe.deepest - base.deepest)


class DepthProbe(dict[str, Any]):
    """Properties that record the deepest Python stack any read of them happened at."""

    deepest = 0

    def get(self, key: str, default: Any = None) -> Any:
        depth = 0
        frame = sys._getframe()
        while frame is not None:
            depth += 1
            frame = frame.f_back  # type: ignore[assignment]
        self.deepest = max(self.deepest, depth)
        return super().get(key, default)


def nested(depth: int) -> Iterator[str]:
    """Selectors nested exactly ``depth`` levels by each construct, alone and mixed."""
    yield "(" * depth + "a = 1" + ")" * depth
    yield "NOT " * depth + "a = 1"
    yield "a = " + "-" * depth + "a"
    yield "a = " + "-(" * (depth // 2) + "-" * (depth % 2) + "a" + ")" * (depth // 2)
    text, levels = "a = 1", 0
    while levels < depth:
        if depth - levels >= 3:  # a parenthesis, NOT, a parenthesis: three levels
            text = f"(a + (a * 2) = 3 OR NOT (a BETWEEN 1 AND 2 AND {text}))"
            levels += 3
        else:
            text = f"({text})"
            levels += 1
    yield text


def test_evaluation_recurses_no_deeper_than_a_multiple_of_the_nesting() -> None:
    for text in nested(MAX_DEPTH):
        base = DepthProbe(a=1)
        Selector("a = 1").evaluate(HEADERS, base)
        probe = DepthProbe(a=1)
        Selector(text).evaluate(HEADERS, probe)
        assert probe.deepest - base.deepest <= 8 * MAX_DEPTH, (text, probe.deepest - base.deepest)


def test_compiling_at_the_depth_limit_leaves_room_on_the_stack() -> None:
    """With the stack already a third used, compiling and evaluating the deepest selectors
    still fits within the interpreter's recursion limit."""
    def at_depth(n: int) -> None:
        if n:
            at_depth(n - 1)
            return
        for text in nested(MAX_DEPTH):
            Selector(text).evaluate(HEADERS, {"a": 1})
        for text in nested(MAX_DEPTH + 1):
            with pytest.raises(SelectorError, match="MAX_DEPTH"):
                Selector(text)
    at_depth(sys.getrecursionlimit() // 3)


# --------------------------------------------------------------------------- the empty selector


@pytest.mark.parametrize("text", ["", " ", "\t\n "])
def test_the_empty_selector_selects_every_message(text: str) -> None:
    selector = compile_selector(text)
    assert selector.matches(HEADERS, {}) and selector.evaluate(HEADERS, {"a": "x"}) is True
    assert EndpointConfig._selector_syntax(text) == text  # a configuration's selector: "" loads


# --------------------------------------------------------------------------- LIKE


def like_reference(value: str, pattern: str, escape: str | None) -> bool:
    """The backtracking regular expression LIKE used to be (fine on the short inputs here)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append("." if ch == "_" else ".*" if ch == "%" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


def escaped(pattern: str, escape: str | None) -> str:
    """``pattern`` with every lone escape character doubled, so that it is a valid pattern."""
    if escape is None:
        return pattern
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == escape:
            nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
            if nxt in ("_", "%", escape) and nxt:
                out.append(ch + nxt)
                i += 2
                continue
            out.append(ch + ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


@settings(max_examples=1500, deadline=None)
@given(pattern=st.text(alphabet="ab_%\\\n", max_size=10), value=st.text(alphabet="ab_%\\\n", max_size=12),
       escape=st.none() | st.just("\\"))
def test_like_matcher_agrees_with_the_regular_expression(pattern: str, value: str,
                                                         escape: str | None) -> None:
    pattern = escaped(pattern, escape)
    assert LikeMatcher(pattern, escape)(value) is like_reference(value, pattern, escape), (pattern, value)


hostile_patterns = st.lists(st.sampled_from(["%", "_", "a", "b", "aa", "a_", "%a", "_%"]),
                            max_size=400).map("".join)
hostile_values = st.tuples(st.sampled_from(["a", "ab", "ba", "aab", "_"]), st.integers(0, 2000),
                           st.sampled_from(["", "b", "c", "a"])).map(lambda t: t[0] * t[1] + t[2])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=hostile_patterns, value=hostile_values, negate=st.booleans())
def test_like_costs_bounded_time_on_hostile_patterns_and_values(pattern: str, value: str,
                                                                negate: bool) -> None:
    text = f"v {'NOT ' if negate else ''}LIKE '{pattern}'"
    result, seconds = timed(text, {"v": value})
    assert result in (True, False) and seconds < BUDGET, (text, len(value), seconds)


# --------------------------------------------------------------------------- hostile selectors


atoms = st.sampled_from(["a", "b", "1", "-1", "'x'", "TRUE", "NULL", "a = 1", "a LIKE '%a%_%'",
                         "a IN ('x', 'y')", "a IS NULL", "a BETWEEN 1 AND 2", "(", ")", "NOT", "AND",
                         "OR", "+", "-", "*", "/", "=", "<>", ",", "ESCAPE", "'", ""])


@st.composite
def hostile_selectors(draw: st.DrawFn) -> str:
    """Token soup, or one construct repeated or nested far beyond the limits."""
    kind = draw(st.sampled_from(["soup", "repeat", "nest"]))
    if kind == "soup":
        return " ".join(draw(st.lists(atoms, max_size=60)))
    unit = draw(atoms)
    count = draw(st.integers(1, 40_000))
    if kind == "repeat":
        return " ".join([unit] * count)
    opener = draw(st.sampled_from(["(", "NOT ", "-", "+", "NOT (", "-(", "(a = 1 AND ", "(a + "]))
    closer = ")" if "(" in opener else ""
    return opener * count + draw(st.sampled_from(["a = 1", "a", "1"])) + closer * count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=hostile_selectors(), value=st.none() | st.integers(-3, 3) | st.text(alphabet="ax%_", max_size=50))
def test_hostile_selectors_compile_or_raise_selector_error_within_the_budget(text: str, value: Any) -> None:
    props = {} if value is None else {"a": value, "b": value}
    result, seconds = timed(text, props)  # anything but a SelectorError propagates and fails
    assert result in (True, False, None) or isinstance(result, SelectorError)
    assert seconds < BUDGET, (text[:80], len(text), seconds)
