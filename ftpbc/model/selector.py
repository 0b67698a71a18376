"""JMS message selectors: a condition over a message's headers and properties.

The language is JMS's (JMS 1.1 section 3.8.1.1), a subset of SQL-92 conditional expressions::

    JMSType = 'car' AND color = 'blue' AND weight > 2500
    age BETWEEN 15 AND 19          Country IN ('UK', 'US', 'France')
    phone LIKE '12%3'              underscored LIKE '\\_%' ESCAPE '\\'
    prop_name IS NULL              NOT (JMSPriority < 5 OR region <> 'eu')

``compile_selector(text)`` parses a selector once into a :class:`Selector`, whose
``matches(headers, properties)`` is a tree of Python closures built at compile time: no node is
interpreted per message.  A malformed selector raises :class:`~ftpbc.errors.SelectorError`, one
line naming the column.  ``docs/queues.md`` describes the language; in short:

Identifiers
    Header fields by their JMS names (``JMSPriority``, ``JMSMessageID``, ``JMSCorrelationID``,
    ``JMSType``, ``JMSTimestamp``, ``JMSExpiration``, ``JMSDeliveryMode``, ``JMSRedelivered``,
    ``JMSReplyTo``, ``JMSXDeliveryCount``, ``JMS_ftpbcKind``: the ``jms`` column of the header
    table, see :data:`HEADER_FIELDS`), every
    other name a property (case-sensitive).  A property the message does not have is NULL.
    Other names starting ``JMS`` (not ``JMSX`` or ``JMS_``) are refused, as JMS reserves them.
Literals
    strings in single quotes (``''`` is a quote), exact numbers (``57``, ``-957``), approximate
    numbers (``7E3``, ``-57.9E2``, ``7.``, ``.5``), ``TRUE`` and ``FALSE``.  Keywords are
    case-insensitive.
Three-valued logic
    A comparison with a NULL operand is *unknown*; ``NOT`` unknown is unknown; ``AND`` is false
    if either side is false, ``OR`` true if either is true, unknown otherwise.  A message is
    selected only when the whole condition is *true*.
Types
    Only like types compare: a number with a number (exact and approximate alike), a string
    with a string, a boolean with a boolean; comparing unlike types is false (not unknown).
    Strings and booleans compare with ``=`` and ``<>`` only.  Arithmetic with NULL or a
    non-number is NULL; integer division truncates toward zero (Java's ``long``), and an integer
    division by zero is NULL.  ``LIKE`` and ``IN`` of a value that is not a string are false.
The empty selector
    ``""`` (or only white space) is no selector, as in JMS: it selects every message.

Cost
    Selectors come from files anyone who can write to the exchange area may plant (subscription
    markers), so compiling and evaluating one is bounded whatever its text.  Compiling refuses,
    with a :class:`~ftpbc.errors.SelectorError` naming the limit, a selector longer than
    :data:`MAX_SELECTOR_LENGTH` characters, nested deeper than :data:`MAX_DEPTH` (parentheses,
    ``NOT`` and signs), or with an ``IN`` list of more than :data:`MAX_IN_LIST` values; it never
    raises RecursionError.  Evaluation recurses no deeper than a small multiple of the nesting
    depth and takes time linear in the selector's size times the length of the values it reads:
    ``LIKE`` is matched without backtracking (see :class:`LikeMatcher`).  Arithmetic on exact
    numbers is Python's (unbounded), not Java's 64-bit wrap-around, so its cost too is bounded
    by the selector's length, not by a fixed width.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ftpbc.errors import SelectorError
from ftpbc.model.headers import Headers, PropertyValue

__all__ = [
    "HEADER_FIELDS",
    "MAX_DEPTH",
    "MAX_IN_LIST",
    "MAX_SELECTOR_LENGTH",
    "LikeMatcher",
    "Selector",
    "SelectorError",
    "compile_selector",
    "header_fields",
]

#: the longest selector compiled, in characters (white space included)
MAX_SELECTOR_LENGTH = 16 * 1024
#: the deepest nesting compiled: each parenthesis, NOT and sign inside another counts one level
MAX_DEPTH = 32
#: the most values an IN list may have
MAX_IN_LIST = 1000

Value = Any  # bool | int | float | str | None
Fn = Callable[[Headers, Mapping[str, PropertyValue]], Value]



def header_fields(headers: type[Headers] = Headers) -> dict[str, Callable[[Headers], Value]]:
    """The header identifiers of ``headers``' table, each with how it is read from the headers,
    and those no header carries (``JMSDeliveryMode``: every message in a file is persistent)."""
    fields: dict[str, Callable[[Headers], Value]] = dict(headers.table.identifiers)
    fields["JMSDeliveryMode"] = lambda h: "PERSISTENT"
    return fields


#: header identifiers (the header table's, :func:`header_fields`) and how each is read
HEADER_FIELDS: Mapping[str, Callable[[Headers], Value]] = header_fields()


_KEYWORDS = frozenset(("NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE"))
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<name>(?:[^\W\d]|\$)(?:\w|\$)*)
  | (?P<op><>|<=|>=|[=<>+\-*/(),])
""", re.VERBOSE)
_INT_LITERAL = re.compile(r"[0-9]+")


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class _Tok:
    kind: str  # "string" "number" "name" "keyword" "op" "end"
    text: str
    value: Value
    column: int  # 1-based


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            if text.startswith("'", pos):
                raise SelectorError(text, pos + 1, "string literal is not closed (a quote inside is '')")
            hint = " (not equal is <>)" if text.startswith("!=", pos) else ""
            raise SelectorError(text, pos + 1, f"unexpected character {ch!r}{hint}")
        kind = m.lastgroup
        assert kind is not None
        word = m.group()
        col = pos + 1
        pos = m.end()
        if kind == "space":
            continue
        if kind == "string":
            out.append(_Tok("string", word, word[1:-1].replace("''", "'"), col))
        elif kind == "number":
            if pos < len(text) and (text[pos].isalnum() or text[pos] in "_$"):
                raise SelectorError(text, pos + 1, f"unexpected {text[pos]!r} after the number {word}")
            value: Value
            if _INT_LITERAL.fullmatch(word):
                value = int(word)
                if value > 2**63:  # -2**63 is written as - 9223372036854775808
                    raise SelectorError(text, col, f"integer {word} does not fit 64 bits")
            else:
                value = float(word)
            out.append(_Tok("number", word, value, col))
        elif kind == "name":
            upper = word.upper()
            if upper in _KEYWORDS:
                out.append(_Tok("keyword", upper, None, col))
            else:
                out.append(_Tok("name", word, None, col))
        else:
            out.append(_Tok("op", word, None, col))
    out.append(_Tok("end", "", None, len(text) + 1))
    return out


# --------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class _Node:
    """A parsed expression: how to compute it and what it is known to be before any message.

    ``kind``: "bool" (a condition), "num", "str", or "any" (an identifier: its type is the
    message's).  ``const``: the value when the node is a literal (``literal`` True).
    """

    fn: Fn
    kind: str
    column: int
    literal: bool = False
    const: Value = None
    ident: str | None = None


def _const(value: Value) -> Fn:
    return lambda h, p: value


def _identifier(name: str, fields: Mapping[str, Callable[[Headers], Value]]) -> Fn:
    header = fields.get(name)
    if header is not None:
        return lambda h, p: header(h)
    # properties arrive as a mapping proxy or a dict: both have .get
    return lambda h, p: p.get(name)


def _truth(fn: Fn) -> Fn:
    """An identifier used as a condition: its value if boolean, else unknown."""
    def truth(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        v = fn(h, p)
        return v if v is True or v is False else None
    return truth


_NUM = (int, float)


def _is_num(v: Value) -> bool:
    t = type(v)
    return t is int or t is float


# ------------------------------------------------------------------ comparison


def _equal(a: Value, b: Value) -> Value:
    """JMS ``=``: None if either is NULL, False for unlike types."""
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is tb or (ta in _NUM and tb in _NUM):
        return a == b
    return False


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _not_equal(a: Value, b: Value) -> Value:
    """JMS ``<>``: None if either is NULL, False for unlike types (as every comparison of them)."""
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is tb or (ta in _NUM and tb in _NUM):
        return a != b
    return False


def _ordered(op: str) -> Callable[[Value, Value], Value]:
    cmp = _ORDER[op]

    def ordered(a: Value, b: Value) -> Value:
        if a is None or b is None:
            return None
        if type(a) in _NUM and type(b) in _NUM:
            return cmp(a, b)
        return False
    return ordered


def _compare(op: str, left: _Node, right: _Node) -> Fn:
    """The closure of ``left op right``, specialised when one side is a literal."""
    if op in ("=", "<>"):
        negate = op == "<>"
        # identifier = literal: the commonest shape, one call and a type test
        for var, lit in ((left, right), (right, left)):
            if lit.literal and not var.literal:
                return _compare_literal(var.fn, lit.const, negate)
        fa, fb = left.fn, right.fn
        if negate:
            return lambda h, p: _not_equal(fa(h, p), fb(h, p))
        return lambda h, p: _equal(fa(h, p), fb(h, p))
    test = _ordered(op)
    fa, fb = left.fn, right.fn
    if right.literal and _is_num(right.const) and not left.literal:
        c = right.const
        cmp = _ORDER[op]

        def var_vs_number(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
            v = fa(h, p)
            t = type(v)
            if t is int or t is float:
                return cmp(v, c)
            return None if v is None else False
        return var_vs_number
    return lambda h, p: test(fa(h, p), fb(h, p))


def _compare_literal(fn: Fn, c: Value, negate: bool) -> Fn:
    if c is None:
        return _const(None)
    if _is_num(c):
        def num_eq(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
            v = fn(h, p)
            t = type(v)
            if t is int or t is float:
                return (v != c) if negate else (v == c)
            return None if v is None else False
        return num_eq
    ct = type(c)

    def same_type_eq(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        v = fn(h, p)
        if type(v) is ct:
            return (v != c) if negate else (v == c)
        return None if v is None else False
    return same_type_eq


# ------------------------------------------------------------------ logic


def _and(fns: list[Fn]) -> Fn:
    if len(fns) == 2:
        f1, f2 = fns

        def and2(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
            a = f1(h, p)
            if a is False:
                return False
            b = f2(h, p)
            if b is False:
                return False
            return True if a is True and b is True else None
        return and2

    def and_n(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        unknown = False
        for f in fns:
            v = f(h, p)
            if v is False:
                return False
            if v is None:
                unknown = True
        return None if unknown else True
    return and_n


def _or(fns: list[Fn]) -> Fn:
    def or_n(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        unknown = False
        for f in fns:
            v = f(h, p)
            if v is True:
                return True
            if v is None:
                unknown = True
        return None if unknown else False
    return or_n


def _not(fn: Fn) -> Fn:
    def not_(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        v = fn(h, p)
        return None if v is None else not v
    return not_


# ------------------------------------------------------------------ arithmetic


def _int_div(a: int, b: int) -> Value:
    if b == 0:
        return None
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _float_div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _divide(a: Value, b: Value) -> Value:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return _int_div(a, b)
    if ta in _NUM and tb in _NUM:
        return _float_div(float(a), float(b))
    return None


def _operation(op: str) -> Callable[[Value, Value], Value]:
    """JMS arithmetic ``a op b`` on two values: NULL unless both are numbers."""
    if op == "/":
        return _divide
    f = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]

    def operation(a: Value, b: Value) -> Value:
        if type(a) not in _NUM or type(b) not in _NUM:
            return None
        try:
            return f(a, b)
        except OverflowError:
            return None
    return operation


def _binary(op: str, fa: Fn, fb: Fn) -> Fn:
    """``fa op fb``: the commonest shape, its tests inline."""
    if op == "/":
        return lambda h, p: _divide(fa(h, p), fb(h, p))
    f = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]

    def arith(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        a = fa(h, p)
        if type(a) not in _NUM:
            return None
        b = fb(h, p)
        if type(b) not in _NUM:
            return None
        try:
            return f(a, b)
        except OverflowError:
            return None
    return arith


def _arith(first: Fn, rest: list[tuple[str, Fn]]) -> Fn:
    """``first op1 f1 op2 f2 ...`` left to right, in a loop: a long chain of operators costs
    no deeper a recursion than one of them."""
    if len(rest) == 1:
        (op, second), = rest
        return _binary(op, first, second)
    steps = [(_operation(op), fn) for op, fn in rest]

    def chain(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        a = first(h, p)
        for operation, fn in steps:
            a = operation(a, fn(h, p))
        return a
    return chain


def _negate(fn: Fn) -> Fn:
    def neg(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        v = fn(h, p)
        return -v if type(v) in _NUM else None
    return neg


def _plus(fn: Fn) -> Fn:
    def pos(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        v = fn(h, p)
        return v if type(v) in _NUM else None
    return pos


# ------------------------------------------------------------------ predicates


def _between(fx: Fn, lo: Fn, hi: Fn, negate: bool) -> Fn:
    ge, le = _ordered(">="), _ordered("<=")

    def between(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        x = fx(h, p)
        a = ge(x, lo(h, p))
        b = le(x, hi(h, p))
        if a is False or b is False:
            r: Value = False
        elif a is True and b is True:
            r = True
        else:
            return None
        return (not r) if negate else r
    return between


def _in(fx: Fn, values: list[Value], negate: bool) -> Fn:
    if all(type(v) is str for v in values):
        options = frozenset(values)

        def in_strings(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
            x = fx(h, p)
            if x is None:
                return None
            r = type(x) is str and x in options
            return (not r) if negate else r
        return in_strings

    def in_values(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        x = fx(h, p)
        if x is None:
            return None
        r = any(_equal(x, v) is True for v in values)
        return (not r) if negate else r
    return in_values


@dataclass(frozen=True)
class _Segment:
    """A run of a LIKE pattern between two ``%``: its length in characters, its literal pieces
    (offset in the run, text) between the ``_`` that stand for any one character, and, for a
    run with a ``_``, the bit masks of a Shift-And search (bit ``j`` of ``masks[ch]`` set when
    the run's character ``j`` is ``ch`` or ``_``; ``wild`` for characters it does not name)."""

    length: int
    pieces: tuple[tuple[int, str], ...]
    masks: Mapping[str, int]
    wild: int

    @property
    def literal(self) -> str | None:
        """The run's text when it has no ``_``, else None."""
        if self.masks or self.wild:
            return None
        return self.pieces[0][1] if self.pieces else ""

    def at(self, s: str, i: int) -> bool:
        """Whether the run matches ``s`` at index ``i`` (False if it runs past the end)."""
        if i + self.length > len(s):
            return False
        return all(s.startswith(text, i + offset) for offset, text in self.pieces)

    def find(self, s: str, start: int, end: int) -> int:
        """The first index ``i >= start`` where the run matches and ends at or before ``end``; -1.

        A run without ``_`` is one ``str.find``.  A run with one is searched for by Shift-And:
        one pass over ``s[start:end]``, one shift and one mask per character (integers of the
        run's length in bits), whatever the run and the text hold.
        """
        last = end - self.length  # the last index the run may start at
        if last < start:
            return -1
        if not self.pieces:  # only ``_``: any index with room for it
            return start
        if not self.masks:  # one literal piece, the whole run
            return s.find(self.pieces[0][1], start, end)
        masks, wild = self.masks, self.wild
        hit = 1 << (self.length - 1)
        state = 0  # bit j: the run's first j + 1 characters end at the current index
        for i in range(start, end):
            state = ((state << 1) | 1) & masks.get(s[i], wild)
            if state & hit:
                return i + 1 - self.length
        return -1


def _segment(run: list[str | None]) -> _Segment:
    """The segment of a run of characters, None standing for ``_``."""
    pieces: list[tuple[int, str]] = []
    current: list[str] = []
    for i, ch in enumerate(run):
        if ch is None:
            if current:
                pieces.append((i - len(current), "".join(current)))
                current = []
        else:
            current.append(ch)
    if current:
        pieces.append((len(run) - len(current), "".join(current)))
    if None not in run:
        return _Segment(len(run), tuple(pieces), {}, 0)
    wild = sum(1 << j for j, ch in enumerate(run) if ch is None)
    masks: dict[str, int] = {}
    for j, ch in enumerate(run):
        if ch is not None:
            masks[ch] = masks.get(ch, wild) | 1 << j
    return _Segment(len(run), tuple(pieces), masks, wild)


class LikeMatcher:
    """A compiled LIKE pattern (``_`` any one character, ``%`` any run of them, ``escape``
    before either or itself: that character); ValueError for an escape character followed by
    anything else.

    Matching does not backtrack: the pattern is split on ``%`` into runs of fixed length; the
    first must match at the start of the value, the last at its end, and each one between is
    placed at its leftmost match after the previous one (the leftmost placement never loses a
    match another placement would find, since it leaves the most room for the rest).  Each run
    is searched for once, from where the previous one ended (see :meth:`_Segment.find`): a
    match is linear in the value's length for a given pattern, with no input that makes it
    try again what it has tried.  Case-sensitive, by code point, as JMS compares strings.
    """

    __slots__ = ("match",)

    def __init__(self, pattern: str, escape: str | None = None) -> None:
        runs: list[list[str | None]] = [[]]
        i = 0
        while i < len(pattern):
            ch = pattern[i]
            if escape is not None and ch == escape:
                if i + 1 >= len(pattern) or pattern[i + 1] not in ("_", "%", escape):
                    raise ValueError(f"the escape character {escape!r} must be followed by _, % or itself")
                runs[-1].append(pattern[i + 1])
                i += 2
                continue
            if ch == "%":
                runs.append([])
            else:
                runs[-1].append(None if ch == "_" else ch)
            i += 1
        #: whether a string matches the whole pattern
        self.match: Callable[[str], bool] = _matcher([_segment(r) for r in runs])

    def __call__(self, s: str) -> bool:
        """Whether ``s`` matches the whole pattern."""
        return self.match(s)


def _matcher(segments: list[_Segment]) -> Callable[[str], bool]:
    first, last = segments[0], segments[-1]
    if len(segments) == 1:
        if first.literal is not None:
            text = first.literal
            return lambda s: s == text
        length = first.length  # no % to stretch: the whole value is the run
        return lambda s: len(s) == length and first.at(s, 0)
    # Runs between two % that are empty (%% or a leading or trailing %) match anywhere.
    middle = tuple(seg for seg in segments[1:-1] if seg.length)
    min_length = sum(seg.length for seg in segments)
    if not middle and first.literal is not None and last.literal is not None:
        prefix, suffix = first.literal, last.literal
        return lambda s: len(s) >= min_length and s.startswith(prefix) and s.endswith(suffix)

    def match(s: str) -> bool:
        if len(s) < min_length or not first.at(s, 0):
            return False
        end = len(s) - last.length
        if not last.at(s, end):
            return False
        pos = first.length
        for seg in middle:
            i = seg.find(s, pos, end)
            if i < 0:
                return False
            pos = i + seg.length
        return True
    return match


def _like(fx: Fn, matcher: LikeMatcher, negate: bool) -> Fn:
    match = matcher.match

    def like(h: Headers, p: Mapping[str, PropertyValue]) -> Value:
        x = fx(h, p)
        if x is None:
            return None
        r = type(x) is str and match(x)
        return (not r) if negate else r
    return like


def _is_null(fx: Fn, negate: bool) -> Fn:
    if negate:
        return lambda h, p: fx(h, p) is not None
    return lambda h, p: fx(h, p) is None


# --------------------------------------------------------------------------- the parser


_COMPARISONS = frozenset(("=", "<>", "<", "<=", ">", ">="))


class _Parser:
    """Recursive descent, one function per precedence level (lowest first)::

        condition  = and { OR and }
        and        = not { AND not }
        not        = NOT not | predicate
        predicate  = sum [ cmp sum | [NOT] BETWEEN sum AND sum | [NOT] IN ( literal {, literal} )
                           | [NOT] LIKE string [ESCAPE string] | IS [NOT] NULL ]
        sum        = product { (+|-) product }
        product    = unary { (*|/) unary }
        unary      = (+|-) unary | literal | identifier | ( condition )
    """

    def __init__(self, text: str, fields: Mapping[str, Callable[[Headers], Value]]) -> None:
        self.text = text
        self.fields = fields
        if len(text) > MAX_SELECTOR_LENGTH:
            raise SelectorError(text[:60] + "...", MAX_SELECTOR_LENGTH + 1,
                                f"a selector is at most {MAX_SELECTOR_LENGTH} characters "
                                f"(MAX_SELECTOR_LENGTH), this one has {len(text)}")
        self.toks = _tokens(text)
        self.i = 0
        #: how many parentheses, NOTs and signs enclose the token being parsed
        self.depth = 0

    def deeper(self, tok: _Tok) -> None:
        """One more level of nesting at ``tok``; SelectorError beyond MAX_DEPTH.  The parser
        recurses a fixed number of frames per level, so this bounds its recursion, and so the
        depth of the compiled tree of closures."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"the selector nests deeper than {MAX_DEPTH} levels (MAX_DEPTH: parentheses, "
                             "NOT and signs inside one another)", tok)

    # helpers

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def advance(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def error(self, problem: str, tok: _Tok | None = None) -> SelectorError:
        return SelectorError(self.text, (tok or self.tok).column, problem)

    def found(self, tok: _Tok | None = None) -> str:
        t = tok or self.tok
        if t.kind == "end":
            return "the end of the selector"
        return repr(t.text) if t.kind != "keyword" else t.text

    def expect(self, kind: str, text: str, what: str) -> _Tok:
        if not self.at(kind, text):
            raise self.error(f"expected {what}, found {self.found()}")
        return self.advance()

    def condition_of(self, node: _Node, role: str) -> Fn:
        if node.kind == "bool":
            return node.fn
        if node.kind == "any":
            return _truth(node.fn)
        raise self.error(f"{role} must be a condition, not a {'number' if node.kind == 'num' else 'string'}",
                         self._at_column(node.column))

    def _at_column(self, column: int) -> _Tok:
        return _Tok("op", "", None, column)

    # the grammar

    def parse(self) -> Fn:
        if self.at("end"):  # empty or white space: no selector (JMS), every message
            return _const(True)
        node = self.condition()
        if not self.at("end"):
            raise self.error(f"expected AND, OR or the end of the selector, found {self.found()}")
        return self.condition_of(node, "a selector")

    def condition(self) -> _Node:
        first = self.and_()
        if not self.at("keyword", "OR"):
            return first
        parts = [self.condition_of(first, "an operand of OR")]
        while self.at("keyword", "OR"):
            self.advance()
            parts.append(self.condition_of(self.and_(), "an operand of OR"))
        return _Node(_or(parts), "bool", first.column)

    def and_(self) -> _Node:
        first = self.not_()
        if not self.at("keyword", "AND"):
            return first
        parts = [self.condition_of(first, "an operand of AND")]
        while self.at("keyword", "AND"):
            self.advance()
            parts.append(self.condition_of(self.not_(), "an operand of AND"))
        return _Node(_and(parts), "bool", first.column)

    def not_(self) -> _Node:
        if self.at("keyword", "NOT"):
            t = self.advance()
            self.deeper(t)
            operand = self.condition_of(self.not_(), "the operand of NOT")
            self.depth -= 1
            return _Node(_not(operand), "bool", t.column)
        return self.predicate()

    def predicate(self) -> _Node:
        left = self.sum_()
        t = self.tok
        if t.kind == "op" and t.text in _COMPARISONS:
            self.advance()
            right = self.sum_()
            if t.text not in ("=", "<>"):
                for side in (left, right):
                    if side.kind in ("str", "bool"):
                        raise self.error(f"{t.text} compares numbers only; strings and booleans compare "
                                         "with = and <>", t)
            if self.at("op") and self.tok.text in _COMPARISONS:
                raise self.error(f"comparisons do not chain: expected AND, OR or ), found {self.found()}")
            return _Node(_compare(t.text, left, right), "bool", left.column)
        negate = False
        if self.at("keyword", "NOT") and self.toks[self.i + 1].kind == "keyword" and \
                self.toks[self.i + 1].text in ("BETWEEN", "IN", "LIKE"):
            self.advance()
            negate = True
        if self.at("keyword", "BETWEEN"):
            self.advance()
            self.numeric(left, "BETWEEN")
            lo = self.sum_()
            self.numeric(lo, "BETWEEN")
            self.expect("keyword", "AND", "AND in BETWEEN ... AND ...")
            hi = self.sum_()
            self.numeric(hi, "BETWEEN")
            return _Node(_between(left.fn, lo.fn, hi.fn, negate), "bool", left.column)
        if self.at("keyword", "IN"):
            self.advance()
            self.identifier_only(left, "IN")
            self.expect("op", "(", "( after IN")
            values = [self.literal("IN")]
            while self.at("op", ","):
                comma = self.advance()
                if len(values) == MAX_IN_LIST:
                    raise self.error(f"an IN list has at most {MAX_IN_LIST} values (MAX_IN_LIST)", comma)
                values.append(self.literal("IN"))
            self.expect("op", ")", ", or ) in the IN list")
            return _Node(_in(left.fn, values, negate), "bool", left.column)
        if self.at("keyword", "LIKE"):
            self.advance()
            self.identifier_only(left, "LIKE")
            pattern_tok = self.tok
            if pattern_tok.kind != "string":
                raise self.error(f"expected a string pattern after LIKE, found {self.found()}")
            self.advance()
            escape: str | None = None
            if self.at("keyword", "ESCAPE"):
                self.advance()
                esc = self.tok
                if esc.kind != "string" or len(esc.value) != 1:
                    raise self.error("ESCAPE takes a string of exactly one character", esc)
                self.advance()
                escape = esc.value
            try:
                matcher = LikeMatcher(pattern_tok.value, escape)
            except ValueError as exc:
                raise self.error(str(exc), pattern_tok) from None
            return _Node(_like(left.fn, matcher, negate), "bool", left.column)
        if negate:
            raise self.error("expected BETWEEN, IN or LIKE after NOT")
        if self.at("keyword", "IS"):
            self.advance()
            self.identifier_only(left, "IS NULL")
            neg = False
            if self.at("keyword", "NOT"):
                self.advance()
                neg = True
            self.expect("keyword", "NULL", "NULL after IS" + (" NOT" if neg else ""))
            return _Node(_is_null(left.fn, neg), "bool", left.column)
        return left

    def numeric(self, node: _Node, where: str) -> None:
        if node.kind in ("str", "bool"):
            raise self.error(f"{where} compares numbers only", self._at_column(node.column))

    def identifier_only(self, node: _Node, where: str) -> None:
        if node.ident is None:
            raise self.error(f"{where} applies to an identifier (a header or property name)",
                             self._at_column(node.column))

    def literal(self, where: str) -> Value:
        t = self.tok
        sign = 1
        if t.kind == "op" and t.text in ("+", "-") and self.toks[self.i + 1].kind == "number":
            sign = -1 if t.text == "-" else 1
            self.advance()
            t = self.tok
        if t.kind in ("string", "number"):
            self.advance()
            if t.kind == "string":
                return t.value
            value = t.value * sign
            if type(value) is int and not -2**63 <= value < 2**63:
                raise self.error(f"integer {value} does not fit 64 bits", t)
            return value
        if t.kind == "keyword" and t.text in ("TRUE", "FALSE"):
            self.advance()
            return t.text == "TRUE"
        raise self.error(f"expected a literal in the {where} list, found {self.found()}")

    def sum_(self) -> _Node:
        return self.chain(("+", "-"), self.product)

    def product(self) -> _Node:
        return self.chain(("*", "/"), self.unary)

    def chain(self, ops: tuple[str, str], operand: Callable[[], _Node]) -> _Node:
        """``operand { op operand }``, left-associative, compiled into one loop."""
        first = operand()
        rest: list[tuple[str, Fn]] = []
        while self.at("op", ops[0]) or self.at("op", ops[1]):
            op = self.advance()
            right = operand()
            for side in (first, right) if not rest else (right,):
                if side.kind in ("str", "bool"):
                    what = "string" if side.kind == "str" else "condition"
                    raise self.error(f"{op.text} needs numbers, not a {what}", self._at_column(side.column))
            rest.append((op.text, right.fn))
        if not rest:
            return first
        return _Node(_arith(first.fn, rest), "num", first.column)

    def unary(self) -> _Node:
        t = self.tok
        if t.kind == "op" and t.text in ("+", "-"):
            self.advance()
            self.deeper(t)
            operand = self.unary()
            self.depth -= 1
            if operand.kind in ("str", "bool"):
                raise self.error(f"unary {t.text} needs a number", t)
            if operand.literal:
                value = -operand.const if t.text == "-" else operand.const
                if type(value) is int and not -2**63 <= value < 2**63:
                    raise self.error(f"integer {value} does not fit 64 bits", t)
                return _Node(_const(value), "num", t.column, literal=True, const=value)
            return _Node(_negate(operand.fn) if t.text == "-" else _plus(operand.fn), "num", t.column)
        return self.primary()

    def primary(self) -> _Node:
        t = self.tok
        if t.kind == "number":
            self.advance()
            negated = self.i >= 2 and self.toks[self.i - 2].text == "-"
            if type(t.value) is int and t.value >= 2**63 and not negated:
                raise self.error(f"integer {t.text} does not fit 64 bits", t)
            return _Node(_const(t.value), "num", t.column, literal=True, const=t.value)
        if t.kind == "string":
            self.advance()
            return _Node(_const(t.value), "str", t.column, literal=True, const=t.value)
        if t.kind == "keyword" and t.text in ("TRUE", "FALSE"):
            self.advance()
            value = t.text == "TRUE"
            return _Node(_const(value), "bool", t.column, literal=True, const=value)
        if t.kind == "keyword" and t.text == "NULL":
            raise self.error("NULL is only allowed in IS NULL and IS NOT NULL")
        if t.kind == "name":
            self.advance()
            name = t.text
            fields = self.fields
            if name.startswith("JMS") and name not in fields and not name.startswith(("JMSX", "JMS_")):
                known = ", ".join(k for k in fields if not k.startswith(("JMSX", "JMS_")))
                raise self.error(f"unknown header {name!r} (headers: {known})", t)
            return _Node(_identifier(name, fields), "any", t.column, ident=name)
        if t.kind == "op" and t.text == "(":
            self.advance()
            self.deeper(t)
            inner = self.condition()
            self.expect("op", ")", ")")
            self.depth -= 1
            return _Node(inner.fn, inner.kind, t.column, inner.literal, inner.const)
        raise self.error(f"expected a value, a name or (, found {self.found()}")


# --------------------------------------------------------------------------- the selector


class Selector:
    """A compiled selector.  ``matches(headers, properties)`` is True only when the condition is
    true (not false, not unknown).  Immutable and thread-safe.

    ``headers`` is the class whose header table gives the identifiers (Headers, or a subclass
    adding headers); the headers it evaluates must be of that class.
    """

    __slots__ = ("_fn", "headers", "text")

    def __init__(self, text: str, *, headers: type[Headers] = Headers) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a selector is a str, got {type(text).__name__}")
        self.text = text
        self.headers = headers
        fields = HEADER_FIELDS if headers is Headers else header_fields(headers)
        self._fn = _Parser(text, fields).parse()

    def evaluate(self, headers: Headers, properties: Mapping[str, PropertyValue]) -> bool | None:
        """True, False or None (unknown)."""
        v = self._fn(headers, properties)
        return v if v is True or v is False else None

    def matches(self, headers: Headers, properties: Mapping[str, PropertyValue]) -> bool:
        """Whether a message with these headers and properties is selected (unknown is not)."""
        return self._fn(headers, properties) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.text == self.text and other.headers is self.headers

    def __hash__(self) -> int:
        return hash(self.text)


@functools.lru_cache(maxsize=256)
def compile_selector(text: str, *, headers: type[Headers] = Headers) -> Selector:
    """The compiled selector of ``text`` (cached); SelectorError naming the column if malformed.

    ``headers``: the class whose header table gives the identifiers (see :class:`Selector`).
    """
    return Selector(text, headers=headers)
