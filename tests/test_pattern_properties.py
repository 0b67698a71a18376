"""Properties of expansion and matching, over generated patterns (hypothesis).

* The expansion of any valid pattern matches that pattern.
* When value-bearing tokens are separated by literals they cannot produce, matching gives back
  exactly the values used to build the name (UUID, counters, date runs, %f).
* A name from another pattern does not match: not one without a UUID where a UUID is expected,
  not one whose literal parts differ.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.patterns.datefmt import LETTERS
from ftpbc.sequences import SequenceStore

_TMP = tempfile.TemporaryDirectory(prefix="ftpbc-prop-")
# durable=False: fsync says nothing about patterns and would only slow the examples down.
STORE = SequenceStore(f"{_TMP.name}/local", f"{_TMP.name}/shared", durable=False)

ZONES = ["UTC", "Europe/Paris", "America/Los_Angeles", "Asia/Kolkata", "Asia/Dubai", "Australia/Sydney"]
#: characters no token ever outputs (file names below use letters only)
SEPARATORS = "=~#!,@"

date_token = st.builds(lambda letter, count: f"%{letter}" * count,
                       st.sampled_from(LETTERS), st.integers(1, 5))
counter_token = st.builds(
    lambda ref, width: ref * width,
    st.one_of(st.sampled_from([f"%{d}" for d in "0123456789"]),
              st.sampled_from([f"%{{{d}}}" for d in "0123456789"]),
              st.from_regex(r"[0-9A-Za-z._-]{2,12}", fullmatch=True)
                .filter(lambda n: n not in ("..",)).map(lambda n: f"%{{{n}}}"),
              st.just("%{#}")),
    st.integers(1, 4))
value_token = st.one_of(st.just("%u"), date_token, counter_token, st.just("%f"))
separator = st.one_of(st.text(SEPARATORS, min_size=1, max_size=3), st.just("%%"))
free_literal = st.text("abcxyz0123456789.-_ ", min_size=1, max_size=4)
file_name = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)
instants = st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9998, 12, 31),
                        timezones=st.just(UTC))


@st.composite
def separated_patterns(draw: st.DrawFn, with_uuid: bool = False) -> str:
    """Value tokens, each followed by a separator literal they cannot produce."""
    tokens = draw(st.lists(value_token, min_size=1, max_size=6))
    if with_uuid and "%u" not in tokens:
        tokens.insert(draw(st.integers(0, len(tokens))), "%u")
    lead = draw(st.one_of(st.just(""), separator))
    return lead + "".join(t + draw(separator) for t in tokens)


@st.composite
def any_patterns(draw: st.DrawFn) -> str:
    """Tokens and literals in any order, touching; a counter keeps one width."""
    parts = draw(st.lists(st.one_of(value_token, free_literal, separator), min_size=1, max_size=8))
    widths: dict[str, int] = {}
    kept: list[str] = []
    for part in parts:
        if part.startswith("%") and part not in ("%u", "%f", "%%") and part[1:2] not in LETTERS:
            ref = part[:part.index("}") + 1] if part.startswith("%{") else part[:2]
            if widths.setdefault(ref, len(part) // len(ref)) != len(part) // len(ref):
                continue
            if kept and kept[-1].endswith(ref):
                continue  # "%{2}%{2}" after "%{2}%{2}" is one counter of twice the width
        kept.append(part)
    return "".join(kept)


def _ctx(now: datetime, zone: str, name: str) -> ExpandContext:
    return ExpandContext(endpoint="prop", store=STORE, now=now, tz=zone, file=name)


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(separated_patterns(), instants, st.sampled_from(ZONES), file_name)
def test_expansion_matches_and_gives_back_the_values_used(text: str, now: datetime, zone: str,
                                                          name: str) -> None:
    pattern = Pattern.parse(text)
    made = pattern.expand(_ctx(now, zone, name))
    found = pattern.match(made.name)
    assert found is not None, (text, made.name, pattern.regex)
    assert found.values == made.values
    assert found.uuid == made.uuid


@PROPERTY
@given(any_patterns(), instants, st.sampled_from(ZONES), file_name)
def test_expansion_of_any_pattern_matches_it(text: str, now: datetime, zone: str, name: str) -> None:
    pattern = Pattern.parse(text)
    made = pattern.expand(_ctx(now, zone, name))
    assert pattern.match(made.name) is not None, (text, made.name, pattern.regex)


@PROPERTY
@given(separated_patterns(with_uuid=True), counter_token | date_token, instants, file_name)
def test_a_name_without_the_uuid_does_not_match(text: str, replacement: str, now: datetime,
                                                name: str) -> None:
    pattern = Pattern.parse(text.replace("%f", "F"))  # %f could swallow anything
    other = Pattern.parse(pattern.text.replace("%u", replacement))
    made = other.expand(_ctx(now, "UTC", name))
    assert pattern.match(made.name) is None, (pattern.text, made.name)


@PROPERTY
@given(separated_patterns(with_uuid=True), st.text(SEPARATORS, min_size=1, max_size=3),
       st.text(SEPARATORS, min_size=1, max_size=3), instants, file_name)
def test_a_uuid_name_from_a_pattern_with_other_literals_does_not_match(
        body: str, prefix: str, other_prefix: str, now: datetime, name: str) -> None:
    # Prefixes are followed by a value token, whose output never holds a separator character;
    # not %f, which matches anything (the prefix's separators included).
    body = body.replace("%f", "F").lstrip(SEPARATORS).removeprefix("%%").lstrip(SEPARATORS)
    if prefix == other_prefix or body.startswith("%%"):
        return
    pattern = Pattern.parse(prefix + body)
    made = Pattern.parse(other_prefix + body).expand(_ctx(now, "UTC", name))
    assert made.uuid is not None and pattern.match(made.name) is None
