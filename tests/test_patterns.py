"""Name patterns: every token, widths, repeats, %%, time zones, the %d choice, every error case."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ftpbc.errors import ConfigError, PatternError
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.patterns.datefmt import format_field
from ftpbc.sequences import SequenceStore

# 2026-11-21 22:30:15.123 UTC, a Saturday
NOW = datetime(2026, 11, 21, 22, 30, 15, 123000, tzinfo=UTC)

#: Output of Java 17 SimpleDateFormat (en_US) for these zones and instants (epoch ms), produced by
#: formatting each "|"-separated group of runs; regenerate with any JDK if the table needs to grow.
JAVA_RUNS = ["G GGGG", "y yy yyy yyyy yyyyy", "M MM MMM MMMM", "w ww", "W", "D DDD", "d dd", "F",
             "E EEEE", "a", "H HH k kk K h", "m s S SSS", "z zzzz", "Z"]
JAVA_GOLDEN = [
    ('UTC 0 | AD AD | 1970 70 1970 1970 01970 | 1 01 Jan January | 1 01 | 1 | 1 001 | 1 01 | 1 | Thu '
     'Thursday | AM | 0 00 24 24 0 12 | 0 0 0 000 | UTC Coordinated Universal Time | +0000'),
    ('UTC 1795300215123 | AD AD | 2026 26 2026 2026 02026 | 11 11 Nov November | 47 47 | 3 | 325 325 |'
     ' 21 21 | 3 | Sat Saturday | PM | 22 22 22 22 10 10 | 30 15 123 123 | UTC Coordinated Universal '
     'Time | +0000'),
    ('UTC 1798675200000 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5 | 365 365 | '
     '31 31 | 5 | Thu Thursday | AM | 0 00 24 24 0 12 | 0 0 0 000 | UTC Coordinated Universal Time | '
     '+0000'),
    ('UTC 1798761599999 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5 | 365 365 | '
     '31 31 | 5 | Thu Thursday | PM | 23 23 23 23 11 11 | 59 59 999 999 | UTC Coordinated Universal '
     'Time | +0000'),
    ('UTC 1767225600000 | AD AD | 2026 26 2026 2026 02026 | 1 01 Jan January | 1 01 | 1 | 1 001 | 1 01'
     ' | 1 | Thu Thursday | AM | 0 00 24 24 0 12 | 0 0 0 000 | UTC Coordinated Universal Time | +0000'),
    ('UTC 1783000000000 | AD AD | 2026 26 2026 2026 02026 | 7 07 Jul July | 27 27 | 1 | 183 183 | 2 02'
     ' | 1 | Thu Thursday | PM | 13 13 13 13 1 1 | 46 40 0 000 | UTC Coordinated Universal Time | '
     '+0000'),
    ('UTC 951782400000 | AD AD | 2000 00 2000 2000 02000 | 2 02 Feb February | 10 10 | 5 | 60 060 | 29'
     ' 29 | 5 | Tue Tuesday | AM | 0 00 24 24 0 12 | 0 0 0 000 | UTC Coordinated Universal Time | '
     '+0000'),
    ('America/New_York 0 | AD AD | 1969 69 1969 1969 01969 | 12 12 Dec December | 1 01 | 5 | 365 365 |'
     ' 31 31 | 5 | Wed Wednesday | PM | 19 19 19 19 7 7 | 0 0 0 000 | EST Eastern Standard Time | '
     '-0500'),
    ('America/New_York 1795300215123 | AD AD | 2026 26 2026 2026 02026 | 11 11 Nov November | 47 47 | '
     '3 | 325 325 | 21 21 | 3 | Sat Saturday | PM | 17 17 17 17 5 5 | 30 15 123 123 | EST Eastern '
     'Standard Time | -0500'),
    ('America/New_York 1798675200000 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5'
     ' | 364 364 | 30 30 | 5 | Wed Wednesday | PM | 19 19 19 19 7 7 | 0 0 0 000 | EST Eastern Standard'
     ' Time | -0500'),
    ('America/New_York 1798761599999 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5'
     ' | 365 365 | 31 31 | 5 | Thu Thursday | PM | 18 18 18 18 6 6 | 59 59 999 999 | EST Eastern '
     'Standard Time | -0500'),
    ('America/New_York 1767225600000 | AD AD | 2025 25 2025 2025 02025 | 12 12 Dec December | 1 01 | 5'
     ' | 365 365 | 31 31 | 5 | Wed Wednesday | PM | 19 19 19 19 7 7 | 0 0 0 000 | EST Eastern Standard'
     ' Time | -0500'),
    ('America/New_York 1783000000000 | AD AD | 2026 26 2026 2026 02026 | 7 07 Jul July | 27 27 | 1 | '
     '183 183 | 2 02 | 1 | Thu Thursday | AM | 9 09 9 09 9 9 | 46 40 0 000 | EDT Eastern Daylight Time'
     ' | -0400'),
    ('America/New_York 951782400000 | AD AD | 2000 00 2000 2000 02000 | 2 02 Feb February | 10 10 | 5 '
     '| 59 059 | 28 28 | 4 | Mon Monday | PM | 19 19 19 19 7 7 | 0 0 0 000 | EST Eastern Standard Time'
     ' | -0500'),
    ('Europe/Paris 0 | AD AD | 1970 70 1970 1970 01970 | 1 01 Jan January | 1 01 | 1 | 1 001 | 1 01 | '
     '1 | Thu Thursday | AM | 1 01 1 01 1 1 | 0 0 0 000 | CET Central European Standard Time | +0100'),
    ('Europe/Paris 1795300215123 | AD AD | 2026 26 2026 2026 02026 | 11 11 Nov November | 47 47 | 3 | '
     '325 325 | 21 21 | 3 | Sat Saturday | PM | 23 23 23 23 11 11 | 30 15 123 123 | CET Central '
     'European Standard Time | +0100'),
    ('Europe/Paris 1798675200000 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5 | '
     '365 365 | 31 31 | 5 | Thu Thursday | AM | 1 01 1 01 1 1 | 0 0 0 000 | CET Central European '
     'Standard Time | +0100'),
    ('Europe/Paris 1798761599999 | AD AD | 2027 27 2027 2027 02027 | 1 01 Jan January | 1 01 | 1 | 1 '
     '001 | 1 01 | 1 | Fri Friday | AM | 0 00 24 24 0 12 | 59 59 999 999 | CET Central European '
     'Standard Time | +0100'),
    ('Europe/Paris 1767225600000 | AD AD | 2026 26 2026 2026 02026 | 1 01 Jan January | 1 01 | 1 | 1 '
     '001 | 1 01 | 1 | Thu Thursday | AM | 1 01 1 01 1 1 | 0 0 0 000 | CET Central European Standard '
     'Time | +0100'),
    ('Europe/Paris 1783000000000 | AD AD | 2026 26 2026 2026 02026 | 7 07 Jul July | 27 27 | 1 | 183 '
     '183 | 2 02 | 1 | Thu Thursday | PM | 15 15 15 15 3 3 | 46 40 0 000 | CEST Central European '
     'Summer Time | +0200'),
    ('Europe/Paris 951782400000 | AD AD | 2000 00 2000 2000 02000 | 2 02 Feb February | 10 10 | 5 | 60'
     ' 060 | 29 29 | 5 | Tue Tuesday | AM | 1 01 1 01 1 1 | 0 0 0 000 | CET Central European Standard '
     'Time | +0100'),
    ('Asia/Kolkata 0 | AD AD | 1970 70 1970 1970 01970 | 1 01 Jan January | 1 01 | 1 | 1 001 | 1 01 | '
     '1 | Thu Thursday | AM | 5 05 5 05 5 5 | 30 0 0 000 | IST India Standard Time | +0530'),
    ('Asia/Kolkata 1795300215123 | AD AD | 2026 26 2026 2026 02026 | 11 11 Nov November | 48 48 | 4 | '
     '326 326 | 22 22 | 4 | Sun Sunday | AM | 4 04 4 04 4 4 | 0 15 123 123 | IST India Standard Time |'
     ' +0530'),
    ('Asia/Kolkata 1798675200000 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 | 5 | '
     '365 365 | 31 31 | 5 | Thu Thursday | AM | 5 05 5 05 5 5 | 30 0 0 000 | IST India Standard Time |'
     ' +0530'),
    ('Asia/Kolkata 1798761599999 | AD AD | 2027 27 2027 2027 02027 | 1 01 Jan January | 1 01 | 1 | 1 '
     '001 | 1 01 | 1 | Fri Friday | AM | 5 05 5 05 5 5 | 29 59 999 999 | IST India Standard Time | '
     '+0530'),
    ('Asia/Kolkata 1767225600000 | AD AD | 2026 26 2026 2026 02026 | 1 01 Jan January | 1 01 | 1 | 1 '
     '001 | 1 01 | 1 | Thu Thursday | AM | 5 05 5 05 5 5 | 30 0 0 000 | IST India Standard Time | '
     '+0530'),
    ('Asia/Kolkata 1783000000000 | AD AD | 2026 26 2026 2026 02026 | 7 07 Jul July | 27 27 | 1 | 183 '
     '183 | 2 02 | 1 | Thu Thursday | PM | 19 19 19 19 7 7 | 16 40 0 000 | IST India Standard Time | '
     '+0530'),
    ('Asia/Kolkata 951782400000 | AD AD | 2000 00 2000 2000 02000 | 2 02 Feb February | 10 10 | 5 | 60'
     ' 060 | 29 29 | 5 | Tue Tuesday | AM | 5 05 5 05 5 5 | 30 0 0 000 | IST India Standard Time | '
     '+0530'),
    ('America/Los_Angeles 0 | AD AD | 1969 69 1969 1969 01969 | 12 12 Dec December | 1 01 | 5 | 365 '
     '365 | 31 31 | 5 | Wed Wednesday | PM | 16 16 16 16 4 4 | 0 0 0 000 | PST Pacific Standard Time |'
     ' -0800'),
    ('America/Los_Angeles 1795300215123 | AD AD | 2026 26 2026 2026 02026 | 11 11 Nov November | 47 47'
     ' | 3 | 325 325 | 21 21 | 3 | Sat Saturday | PM | 14 14 14 14 2 2 | 30 15 123 123 | PST Pacific '
     'Standard Time | -0800'),
    ('America/Los_Angeles 1798675200000 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 '
     '| 5 | 364 364 | 30 30 | 5 | Wed Wednesday | PM | 16 16 16 16 4 4 | 0 0 0 000 | PST Pacific '
     'Standard Time | -0800'),
    ('America/Los_Angeles 1798761599999 | AD AD | 2026 26 2026 2026 02026 | 12 12 Dec December | 1 01 '
     '| 5 | 365 365 | 31 31 | 5 | Thu Thursday | PM | 15 15 15 15 3 3 | 59 59 999 999 | PST Pacific '
     'Standard Time | -0800'),
    ('America/Los_Angeles 1767225600000 | AD AD | 2025 25 2025 2025 02025 | 12 12 Dec December | 1 01 '
     '| 5 | 365 365 | 31 31 | 5 | Wed Wednesday | PM | 16 16 16 16 4 4 | 0 0 0 000 | PST Pacific '
     'Standard Time | -0800'),
    ('America/Los_Angeles 1783000000000 | AD AD | 2026 26 2026 2026 02026 | 7 07 Jul July | 27 27 | 1 '
     '| 183 183 | 2 02 | 1 | Thu Thursday | AM | 6 06 6 06 6 6 | 46 40 0 000 | PDT Pacific Daylight '
     'Time | -0700'),
    ('America/Los_Angeles 951782400000 | AD AD | 2000 00 2000 2000 02000 | 2 02 Feb February | 10 10 |'
     ' 5 | 59 059 | 28 28 | 4 | Mon Monday | PM | 16 16 16 16 4 4 | 0 0 0 000 | PST Pacific Standard '
     'Time | -0800'),
]


@pytest.fixture
def store(tmp_path: Path) -> SequenceStore:
    return SequenceStore(tmp_path / "local", tmp_path / "shared")


def ctx(store: SequenceStore | None = None, **kw: object) -> ExpandContext:
    kw.setdefault("now", NOW)
    return ExpandContext(endpoint="quote", store=store, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- date letters


@pytest.mark.parametrize("row", JAVA_GOLDEN, ids=lambda r: " ".join(r.split(" | ")[0].split()))
def test_date_letters_format_as_java_simpledateformat(row: str) -> None:
    head, *expected = row.split(" | ")
    zone, millis = head.split()
    when = datetime.fromtimestamp(int(millis) / 1000, UTC).astimezone(ZoneInfo(zone))
    for runs, want in zip(JAVA_RUNS, expected, strict=True):
        got = " ".join(format_field(run[0], len(run), when) for run in runs.split())
        assert got == want, f"{zone} {millis} {runs}"


@pytest.mark.parametrize("row", JAVA_GOLDEN[::5], ids=lambda r: " ".join(r.split(" | ")[0].split()))
def test_every_date_run_expands_and_matches_back(row: str) -> None:
    head, *_ = row.split(" | ")
    zone, millis = head.split()
    now = datetime.fromtimestamp(int(millis) / 1000, UTC)
    for runs in JAVA_RUNS:
        text = "_".join("".join(f"%{c}" for c in run) for run in runs.split())
        pattern = Pattern.parse(text)
        exp = pattern.expand(ExpandContext(now=now, tz=zone))
        found = pattern.match(exp.name)
        assert found is not None and found.values == exp.values, (text, exp.name)


def test_issue_examples() -> None:
    assert Pattern.parse("%y%y%y%y%M%M%d%d").expand(ctx()).name == "20261121"
    assert Pattern.parse("%H%H%m%m%s%s").expand(ctx()).name == "223015"


def test_time_zone_is_utc_by_default_and_the_endpoint_zone_otherwise() -> None:
    p = Pattern.parse("%y%y%y%y%M%M%d%d-%H%H%m%m %z %Z")
    assert p.expand(ctx()).name == "20261121-2230 UTC +0000"
    assert p.expand(ctx(tz="Europe/Paris")).name == "20261121-2330 CET +0100"
    assert p.expand(ctx(tz="Asia/Tokyo")).name == "20261122-0730 JST +0900"
    assert p.expand(ctx(tz=ZoneInfo("America/New_York"))).name == "20261121-1730 EST -0500"
    # a naive datetime is UTC, not the machine's local time
    assert p.expand(ctx(now=NOW.replace(tzinfo=None))).name == "20261121-2230 UTC +0000"


def test_zone_without_an_abbreviation_uses_the_gmt_offset() -> None:
    assert Pattern.parse("%z|%z%z%z%z").expand(ctx(tz="Asia/Dubai")).name == "GMT+04:00|GMT+04:00"


def test_unknown_time_zone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        Pattern.parse("%H").expand(ctx(tz="Mars/Olympus"))


def test_percent_d_is_day_of_month_and_hash_is_the_transient_counter(store: SequenceStore) -> None:
    day = Pattern.parse("%d")
    assert [day.expand(ctx(store)).name for _ in range(3)] == ["21", "21", "21"]
    transient = Pattern.parse("n%{#}")
    assert [transient.expand(ctx(store)).name for _ in range(3)] == ["n0", "n1", "n2"]
    # in memory only: a new store (a restart) starts again at 0, and nothing is written
    assert transient.expand(ctx(SequenceStore(store.local_dir, store.shared_dir))).name == "n0"
    assert store.list() == []
    assert transient.match("n17") is not None and transient.match("n17").values == {"%{#}": 17}  # type: ignore[union-attr]


def test_literal_and_escaped_percent() -> None:
    p = Pattern.parse("100%%_done.txt")
    assert p.is_literal and p.expand().name == "100%_done.txt"
    assert p.match("100%_done.txt") is not None
    assert p.match("100%%_done.txt") is None
    assert Pattern.parse("a.b").match("axb") is None  # literals are not regex


# ----------------------------------------------------------------------------- UUID


def test_uuid_is_canonical_and_the_same_everywhere_in_one_name() -> None:
    p = Pattern.parse("req.%u/%u")
    first, second = p.expand(), p.expand()
    a, b = first.name[4:].split("/")
    assert a == b == first.uuid and str(uuid.UUID(a)) == a
    assert first.uuid != second.uuid
    assert p.match(first.name).uuid == first.uuid  # type: ignore[union-attr]
    assert p.match(f"req.{a}/{second.uuid}") is None  # two different UUIDs


def test_uuid_can_be_forced_by_the_context() -> None:
    u = uuid.UUID("4d4f6177-f085-456b-94d1-1ed22baae814")
    assert Pattern.parse("resp.%u").expand(ctx(uuid=u)).name == f"resp.{u}"


@pytest.mark.parametrize("name", [
    "req.4D4F6177-F085-456B-94D1-1ED22BAAE814",  # upper case is not canonical
    "req.4d4f6177f085456b94d11ed22baae814",      # no dashes
    "req.4d4f6177-f085-456b-94d1-1ed22baae81",   # one digit short
    "req.4d4f6177-f085-456b-94d1-1ed22baae814x",
    "req.{4d4f6177-f085-456b-94d1-1ed22baae814}",
    "resp.4d4f6177-f085-456b-94d1-1ed22baae814",
])
def test_uuid_matches_only_the_canonical_form(name: str) -> None:
    assert Pattern.parse("req.%u").match(name) is None


# ----------------------------------------------------------------------------- counters


def test_local_counters_widths_and_repeats(store: SequenceStore) -> None:
    p = Pattern.parse("x%1%1%1-%1-%2")
    names = [p.expand(ctx(store)).name for _ in range(3)]
    assert names == ["x000-0-0", "x001-1-1", "x002-2-2"]  # one increment per expansion
    store.set("local", "quote", "1", 7)
    exp = p.expand(ctx(store))
    assert exp.name == "x007-7-3" and exp.values == {"%1": 7, "%2": 3}
    assert p.match("x007-7-3").values == {"%1": 7, "%2": 3}  # type: ignore[union-attr]
    assert p.match("x007-8-3") is None  # one counter cannot hold two values
    assert p.match("x07-7-3") is None  # below the width
    store.set("local", "quote", "1", 12345)
    assert p.expand(ctx(store)).name == "x12345-12345-4"  # wider values are not truncated


def test_counters_are_per_endpoint_and_per_kind(store: SequenceStore) -> None:
    p = Pattern.parse("%0.%{0}")
    assert p.expand(ctx(store)).name == "0.0"
    assert p.expand(ctx(store)).name == "1.1"
    assert p.expand(ExpandContext(endpoint="other", store=store)).name == "0.0"
    assert store.get("local", "quote", "0") == 2 and store.get("shared", "quote", "0") == 2
    assert store.path("local", "quote", "0").is_relative_to(store.local_dir)
    assert store.path("shared", "quote", "0").is_relative_to(store.shared_dir)


def test_named_sequence_is_global(store: SequenceStore) -> None:
    p = Pattern.parse("req.%u.%{myseq}")
    assert p.uses_sequences and p.has_uuid
    exp = p.expand(ctx(store))
    assert exp.name.endswith(".0") and exp.values["%{myseq}"] == 0
    other = Pattern.parse("po_%{myseq}").expand(ExpandContext(endpoint="b", store=store))
    assert other.name == "po_1"
    assert (store.shared_dir / "sequences" / "myseq").read_text() == "2\n"
    assert p.match(exp.name).values == exp.values  # type: ignore[union-attr]


def test_single_digit_in_braces_is_the_shared_counter_longer_names_are_global(store: SequenceStore) -> None:
    Pattern.parse("%{3}%{10}").expand(ctx(store))
    kinds = {(i.kind, i.key) for i in store.list()}
    assert kinds == {("shared", "3"), ("global", "10")}


def test_sequences_without_a_store_or_endpoint_are_config_errors(store: SequenceStore) -> None:
    with pytest.raises(ConfigError, match="sequence store"):
        Pattern.parse("a%1").expand(ctx())
    with pytest.raises(ConfigError, match="per endpoint"):
        Pattern.parse("a%{1}").expand(ExpandContext(store=store))


# ----------------------------------------------------------------------------- %f %p %*


def test_working_file_name_and_directory() -> None:
    p = Pattern.parse("%p/%f.%y%y%y%y.bak")
    exp = p.expand(ctx(file="order.xml", directory="/in/archive"))
    assert exp.name == "/in/archive/order.xml.2026.bak"
    assert p.match(exp.name).values == {"%p": "/in/archive", "%f": "order.xml", "yyyy": "2026"}  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="%f"):
        Pattern.parse("%f.bak").expand(ctx())


def test_wildcard_selects_free_form_names_but_cannot_make_one() -> None:
    p = Pattern.parse("ORDERS_%*.csv")
    assert p.has_wildcard
    assert p.match("ORDERS_acme 2026-11.csv").wildcards == ("acme 2026-11",)  # type: ignore[union-attr]
    assert p.match("ORDERS_.csv") is not None
    assert p.match("ORDERS_x.txt") is None
    with pytest.raises(PatternError, match="column 8"):
        p.expand()


def test_match_is_anchored_and_regex_is_exposed() -> None:
    p = Pattern.parse("req.%u")
    name = p.expand().name
    assert p.match("x" + name) is None and p.match(name + "x") is None
    assert re.fullmatch(p.regex, name)


def test_parse_is_cached() -> None:
    assert Pattern.parse("req.%u.%{q}") is Pattern.parse("req.%u.%{q}")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("text", "column", "expected"), [
    ("req.%Q", 6, "unknown token '%Q'"),
    ("%Y%Y", 2, "unknown token '%Y'"),
    ("a%", 3, "expected a token after '%'"),
    ("%{myseq", 8, "expected '}' closing '%{' of column 1"),
    ("ab%{my seq}", 7, "found ' '"),
    ("%{a/b", 4, "found '/'"),
    ("%{}", 3, "expected a sequence name"),
    ("x%{..}", 4, "'..' is not allowed"),
    ("%{é}", 3, "found 'é'"),
])
def test_malformed_patterns_name_pattern_column_and_expectation(text: str, column: int,
                                                                expected: str) -> None:
    with pytest.raises(PatternError) as info:
        Pattern.parse(text)
    err = info.value
    assert err.pattern == text and err.column == column
    assert f"pattern {text!r}, column {column}: " in str(err) and expected in str(err)
    assert isinstance(err, ConfigError)  # so config loading reports it like any other bad value
