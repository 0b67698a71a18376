"""JMS message selectors (ftpbc.model.selector): the specification's examples, three-valued
logic, errors naming the column, and a hypothesis property: generated selectors, rendered as
text and compiled, agree with a small reference evaluator walking the same tree."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftpbc.errors import ConfigError, SelectorError
from ftpbc.model.envelope import Headers
from ftpbc.model.selector import compile_selector

CAR = Headers(id="m1", type="car", priority=7, correlation_id="c-9",
              timestamp=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), delivery_count=2)


def ev(text: str, props: dict[str, Any] | None = None, headers: Headers = CAR) -> bool | None:
    return compile_selector(text).evaluate(headers, props or {})


# --------------------------------------------------------------------------- the spec's examples


def test_spec_example_car_colour_weight() -> None:
    text = "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    assert ev(text, {"color": "blue", "weight": 3000}) is True
    assert ev(text, {"color": "blue", "weight": 2500}) is False
    assert ev(text, {"color": "red", "weight": 3000}) is False
    assert ev(text, {"color": "blue", "weight": 3000}, Headers(id="m", type="bike")) is False
    assert ev(text, {"color": "blue"}) is None  # weight NULL: unknown, not selected
    assert not compile_selector(text).matches(CAR, {"color": "blue"})


@pytest.mark.parametrize(("age", "want"), [(15, True), (17, True), (19, True), (14, False), (20, False),
                                            (19.5, False), (None, None)])
def test_spec_example_between(age: Any, want: bool | None) -> None:
    props = {} if age is None else {"age": age}
    assert ev("age BETWEEN 15 AND 19", props) is want
    assert ev("age NOT BETWEEN 15 AND 19", props) is (None if want is None else not want)


@pytest.mark.parametrize(("country", "want"), [("UK", True), ("France", True), ("Peru", False),
                                                ("uk", False), (None, None)])
def test_spec_example_in(country: str | None, want: bool | None) -> None:
    props = {} if country is None else {"Country": country}
    assert ev("Country IN ('UK','US','France')", props) is want
    assert ev("Country NOT IN ('UK','US','France')", props) is (None if want is None else not want)


@pytest.mark.parametrize(("text", "value", "want"), [
    ("phone LIKE '12%3'", "123", True), ("phone LIKE '12%3'", "12993", True),
    ("phone LIKE '12%3'", "1234", False), ("phone NOT LIKE '12%3'", "1234", True),
    ("word LIKE 'l_se'", "lose", True), ("word LIKE 'l_se'", "loose", False),
    ("word NOT LIKE 'l_se'", "loose", True),
    ("underscored LIKE '\\_%' ESCAPE '\\'", "_foo", True),
    ("underscored LIKE '\\_%' ESCAPE '\\'", "bar", False),
    ("underscored NOT LIKE '\\_%' ESCAPE '\\'", "bar", True),
    ("word LIKE 'a.c'", "abc", False),  # a regular expression character is itself
    ("word LIKE '%'", "line\nbreak", True),
])
def test_spec_examples_like(text: str, value: str, want: bool) -> None:
    prop = text.split()[0]
    assert ev(text, {prop: value}) is want
    assert ev(text, {}) is None


def test_spec_example_is_null() -> None:
    assert ev("prop_name IS NULL") is True
    assert ev("prop_name IS NULL", {"prop_name": "x"}) is False
    assert ev("prop_name IS NOT NULL", {"prop_name": "x"}) is True
    assert ev("JMSType IS NULL", headers=Headers(id="m")) is True


# --------------------------------------------------------------------------- semantics


def test_header_identifiers() -> None:
    assert ev("JMSPriority = 7 AND JMSMessageID = 'm1' AND JMSCorrelationID = 'c-9'") is True
    assert ev("JMSTimestamp = 1767323045000") is True
    assert ev("JMSExpiration = 0") is True  # no expiration: 0, as JMS has it
    assert ev("JMSDeliveryMode = 'PERSISTENT' AND JMSRedelivered AND JMSXDeliveryCount = 3") is True
    assert ev("JMS_ftpbcKind = 'oneway'") is True
    assert ev("JMSTimestamp IS NULL", headers=Headers(id="m")) is True
    assert ev("JMSXGroupID = 'g'", {"JMSXGroupID": "g"}) is True  # other JMSX names are properties


def test_three_valued_logic() -> None:
    # missing is NULL: unknown
    assert ev("missing = 1") is None
    assert ev("NOT missing = 1") is None
    assert ev("missing = 1 AND FALSE") is False
    assert ev("missing = 1 AND TRUE") is None
    assert ev("missing = 1 OR TRUE") is True
    assert ev("missing = 1 OR FALSE") is None
    assert ev("missing + 1 > 0") is None


def test_types_compare_only_alike() -> None:
    assert ev("a = 1", {"a": "1"}) is False
    assert ev("a <> 1", {"a": "1"}) is False  # unlike types: false either way
    assert ev("a = 1", {"a": 1.0}) is True  # exact and approximate numbers compare
    assert ev("a = TRUE", {"a": True}) is True
    assert ev("a = 1", {"a": True}) is False  # a boolean is not a number
    assert ev("a > 1", {"a": "zz"}) is False
    assert ev("a", {"a": True}) is True and ev("a", {"a": 1}) is None
    assert ev("a IN ('x')", {"a": 5}) is False and ev("a LIKE 'x'", {"a": 5}) is False


def test_arithmetic() -> None:
    assert ev("2 + 3 * 4 = 14 AND (2 + 3) * 4 = 20 AND 10 - 4 - 3 = 3") is True
    assert ev("-7 / 2 = -3 AND 7 / 2 = 3 AND 7.0 / 2 = 3.5") is True  # Java's long division
    assert ev("a / 0 = 1", {"a": 3}) is None
    assert ev("a / 0 > 1", {"a": 3.0}) is True  # IEEE: +Infinity
    assert ev("-a = -5 AND +a = 5", {"a": 5}) is True
    assert ev("a * 2 > 1", {"a": "x"}) is None
    assert ev("7E3 = 7000 AND -57.9E2 = -5790 AND 7. = 7 AND .5 = 0.5") is True


def test_keywords_are_case_insensitive_identifiers_are_not() -> None:
    assert ev("color = 'blue' and NOT weight between 1 And 2", {"color": "blue", "weight": 5}) is True
    assert ev("Color = 'blue'", {"color": "blue"}) is None
    assert ev("s = 'it''s'", {"s": "it's"}) is True


def test_precedence_not_and_or() -> None:
    assert ev("TRUE OR FALSE AND FALSE") is True  # AND binds tighter
    assert ev("NOT FALSE AND FALSE") is False  # NOT binds tighter than AND
    assert ev("NOT a = 1", {"a": 2}) is True


def test_compiled_once_and_cached() -> None:
    assert compile_selector("a = 1") is compile_selector("a = 1")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("text", "column", "words"), [
    ("a =", 4, "expected a value"),
    ("a = 'open", 5, "not closed"),
    ("a != 1", 3, "<>"),
    ("5", 1, "must be a condition"),
    ("'a' < 'b'", 5, "compares numbers only"),
    ("a LIKE 5", 8, "string pattern"),
    ("1 IN ('a')", 1, "identifier"),
    ("JMSFoo = 1", 1, "unknown header"),
    ("a = NULL", 5, "IS NULL"),
    ("a = 1 = 2", 7, "do not chain"),
    ("x LIKE 'a\\b' ESCAPE '\\'", 8, "escape character"),
    ("x LIKE 'a' ESCAPE 'ab'", 19, "exactly one character"),
    ("a BETWEEN 'x' AND 2", 11, "numbers only"),
    ("a = 9223372036854775808", 5, "64 bits"),
    ("(a = 1", 7, "expected )"),
    ("a NOT = 1", 3, "found NOT"),
    ("a + 'x' = 1", 5, "needs numbers"),
    ("a = 1 b", 7, "found 'b'"),
    ("a = #", 5, "unexpected character"),
])
def test_invalid_selectors_are_one_line_naming_the_column(text: str, column: int, words: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    err = caught.value
    assert isinstance(err, ConfigError)
    assert err.column == column, str(err)
    assert words in str(err) and f"column {column}" in str(err) and "\n" not in str(err)


# --------------------------------------------------------------------------- property: a reference


PROPS = ["a", "b", "color", "n"]
NUMERIC_HEADERS = ["JMSPriority", "JMSXDeliveryCount"]
TEXT_HEADERS = ["JMSType", "JMSCorrelationID"]
HEADER_OF = {"JMSPriority": lambda h: h.priority, "JMSXDeliveryCount": lambda h: h.delivery_count + 1,
             "JMSType": lambda h: h.type, "JMSCorrelationID": lambda h: h.correlation_id}

Node = tuple[Any, ...]

ints = st.integers(-1000, 1000) | st.integers(-(2**62), 2**62)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
strings = st.text(alphabet="ab_%'xZ", max_size=4)
literal_values = ints | floats | strings | st.booleans()
identifiers = st.sampled_from(PROPS + NUMERIC_HEADERS + TEXT_HEADERS)


def numeric() -> st.SearchStrategy[Node]:
    leaves = (ints.map(lambda v: ("lit", v)) | floats.map(lambda v: ("lit", v))
              | identifiers.map(lambda n: ("id", n)))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.tuples(st.just("arith"), st.sampled_from("+-*/"), inner, inner),
        st.tuples(st.just("neg"), inner)), max_leaves=4)


def value() -> st.SearchStrategy[Node]:
    return numeric() | strings.map(lambda v: ("lit", v)) | st.booleans().map(lambda v: ("lit", v))


def conditions() -> st.SearchStrategy[Node]:
    ident = identifiers.map(lambda n: ("id", n))
    leaves = st.one_of(
        st.tuples(st.just("cmp"), st.sampled_from(["=", "<>"]), value(), value()),
        st.tuples(st.just("cmp"), st.sampled_from(["<", "<=", ">", ">="]), numeric(), numeric()),
        st.tuples(st.just("between"), numeric(), numeric(), numeric(), st.booleans()),
        st.tuples(st.just("in"), ident, st.lists(literal_values, min_size=1, max_size=3), st.booleans()),
        st.tuples(st.just("like"), ident, strings, st.sampled_from([None, "\\", "x"]), st.booleans()),
        st.tuples(st.just("isnull"), ident, st.booleans()),
        identifiers.map(lambda n: ("truth", n)),
        st.booleans().map(lambda v: ("lit", v)),
    )
    return st.recursive(leaves, lambda inner: st.one_of(
        st.tuples(st.just("and"), inner, inner),
        st.tuples(st.just("or"), inner, inner),
        st.tuples(st.just("not"), inner)), max_leaves=5)


def fix_escapes(node: Node) -> Node:
    """A LIKE pattern whose escape character is followed by something else is an error, not a
    case to compare: escape every escape character that is not already a valid escape."""
    if node[0] == "like" and node[3] is not None:
        esc, out, i, pat = node[3], [], 0, node[2]
        while i < len(pat):
            if pat[i] == esc:
                nxt = pat[i + 1] if i + 1 < len(pat) else ""
                if nxt in ("_", "%", esc):
                    out.append(pat[i:i + 2])
                    i += 2
                    continue
                out.append(esc + esc)
            else:
                out.append(pat[i])
            i += 1
        return (*node[:2], "".join(out), *node[3:])
    if node[0] in ("and", "or"):
        return (node[0], fix_escapes(node[1]), fix_escapes(node[2]))
    if node[0] == "not":
        return ("not", fix_escapes(node[1]))
    return node


# rendering with as few parentheses as the precedence allows (so it is tested too)

LEVEL = {"or": 1, "and": 2, "not": 3, "cmp": 4, "between": 4, "in": 4, "like": 4, "isnull": 4,
         "arith+": 5, "arith-": 5, "arith*": 6, "arith/": 6, "neg": 7}


def level(node: Node) -> int:
    if node[0] == "lit":
        v = node[1]
        return 7 if isinstance(v, int | float) and not isinstance(v, bool) and (
            v < 0 or math.copysign(1, v) < 0) else 8
    if node[0] in ("id", "truth"):
        return 8
    if node[0] == "arith":
        return LEVEL["arith" + node[1]]
    return LEVEL[node[0]]


def lit_text(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def render(node: Node, need: int = 0) -> str:
    text = _render(node)
    return f"({text})" if level(node) < need else text


def _render(node: Node) -> str:
    kind = node[0]
    if kind == "lit":
        return lit_text(node[1])
    if kind in ("id", "truth"):
        return str(node[1])
    if kind == "neg":
        return "-" + render(node[1], 7)
    if kind == "arith":
        own = LEVEL["arith" + node[1]]
        return f"{render(node[2], own)} {node[1]} {render(node[3], own + 1)}"
    if kind == "cmp":
        return f"{render(node[2], 5)} {node[1]} {render(node[3], 5)}"
    if kind == "between":
        neg = "NOT " if node[4] else ""
        return f"{render(node[1], 5)} {neg}BETWEEN {render(node[2], 5)} AND {render(node[3], 5)}"
    if kind == "in":
        return f"{node[1][1]} {'NOT ' if node[3] else ''}IN ({', '.join(lit_text(v) for v in node[2])})"
    if kind == "like":
        esc = "" if node[3] is None else f" ESCAPE {lit_text(node[3])}"
        return f"{node[1][1]} {'NOT ' if node[4] else ''}LIKE {lit_text(node[2])}{esc}"
    if kind == "isnull":
        return f"{node[1][1]} IS {'NOT ' if node[2] else ''}NULL"
    if kind == "not":
        return "NOT " + render(node[1], 3)
    if kind == "and":
        return f"{render(node[1], 2)} AND {render(node[2], 3)}"
    if kind == "or":
        return f"{render(node[1], 1)} OR {render(node[2], 2)}"
    raise AssertionError(node)


# the reference: a plain recursive interpreter of the same rules


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def alike(a: Any, b: Any) -> bool:
    return (is_num(a) and is_num(b)) or type(a) is type(b)


def like_match(s: str, pattern: str, esc: str | None) -> bool:
    """LIKE by dynamic programming over (string position, pattern position)."""
    tokens: list[tuple[str, str]] = []  # ("any", "") "%", ("one", "") "_", ("ch", c)
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if esc is not None and c == esc:
            tokens.append(("ch", pattern[i + 1]))
            i += 2
            continue
        tokens.append(("any", "") if c == "%" else ("one", "") if c == "_" else ("ch", c))
        i += 1
    reach = {0}
    for ch in s:
        nxt = set()
        for k in _closure(reach, tokens):
            if k < len(tokens) and (tokens[k][0] == "one" or tokens[k] == ("ch", ch)):
                nxt.add(k + 1)
            if k < len(tokens) and tokens[k][0] == "any":
                nxt.add(k)
        reach = nxt
    return len(tokens) in _closure(reach, tokens)


def _closure(reach: set[int], tokens: list[tuple[str, str]]) -> set[int]:
    out = set(reach)
    for k in sorted(reach):
        while k < len(tokens) and tokens[k][0] == "any":
            k += 1
            out.add(k)
    return out


def ref(node: Node, h: Headers, p: dict[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "id":
        name = node[1]
        return HEADER_OF[name](h) if name in HEADER_OF else p.get(name)
    if kind == "truth":
        v = ref(("id", node[1]), h, p)
        return v if isinstance(v, bool) else None
    if kind == "neg":
        v = ref(node[1], h, p)
        return -v if is_num(v) else None
    if kind == "arith":
        a, b = ref(node[2], h, p), ref(node[3], h, p)
        if not (is_num(a) and is_num(b)):
            return None
        op = node[1]
        if op == "/":
            if isinstance(a, int) and isinstance(b, int):
                if b == 0:
                    return None
                q = abs(a) // abs(b)
                return q if (a < 0) == (b < 0) else -q
            if b == 0:
                return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)
            return a / b
        if op == "+":
            return a + b
        return a - b if op == "-" else a * b
    if kind == "cmp":
        a, b = ref(node[2], h, p), ref(node[3], h, p)
        if a is None or b is None:
            return None
        op = node[1]
        if op in ("=", "<>"):
            if not alike(a, b):
                return False
            return (a == b) if op == "=" else (a != b)
        if not (is_num(a) and is_num(b)):
            return False
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if kind == "between":
        lo = ref(("cmp", ">=", node[1], node[2]), h, p)
        hi = ref(("cmp", "<=", node[1], node[3]), h, p)
        r = and3(lo, hi)
        return not3(r) if node[4] else r
    if kind == "in":
        x = ref(node[1], h, p)
        if x is None:
            return None
        r = any(alike(x, v) and x == v for v in node[2])
        return (not r) if node[3] else r
    if kind == "like":
        x = ref(node[1], h, p)
        if x is None:
            return None
        r = isinstance(x, str) and like_match(x, node[2], node[3])
        return (not r) if node[4] else r
    if kind == "isnull":
        x = ref(node[1], h, p)
        return (x is not None) if node[2] else (x is None)
    if kind == "not":
        return not3(ref(node[1], h, p))
    if kind == "and":
        return and3(ref(node[1], h, p), ref(node[2], h, p))
    if kind == "or":
        return not3(and3(not3(ref(node[1], h, p)), not3(ref(node[2], h, p))))
    raise AssertionError(node)


def not3(v: Any) -> Any:
    return None if v is None else not v


def and3(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


prop_values = st.none() | ints | floats | strings | st.booleans()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=conditions(), values=st.fixed_dictionaries({k: prop_values for k in PROPS}),
       priority=st.integers(0, 9), count=st.integers(0, 3), typ=st.none() | strings)
def test_compiled_selector_agrees_with_the_reference(tree: Node, values: dict[str, Any], priority: int,
                                                     count: int, typ: str | None) -> None:
    tree = fix_escapes(tree)
    text = render(tree)
    props = {k: v for k, v in values.items() if v is not None}
    headers = Headers(id="m", priority=priority, delivery_count=count, type=typ)
    want = ref(tree, headers, props)
    want = want if want is True or want is False else None
    got = compile_selector(text).evaluate(headers, props)
    assert got is want, (text, props)
