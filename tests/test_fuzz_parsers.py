"""Fuzzing what a server or a partner hands ftpbc to parse: listing lines and file names.

A listing line (MLSD or LIST) and a file name come from whoever can write to the server.
Whatever they hold, the parsers may only answer with a result, a clean skip, or one of ftpbc's
own errors (a subclass of :class:`ftpbc.errors.FtpbcError`): never an IndexError, an
OverflowError, a UnicodeError or a traceback from deep inside.  Example counts are bounded so
the whole file runs in a few seconds.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftpbc.config.models import Config
from ftpbc.errors import FtpbcError, ProtocolError, UnsafeNameError
from ftpbc.exchange.layout import AreaLayout
from ftpbc.journal.store import _SAFE, _quote
from ftpbc.model.envelope import DropboxmqCodec, Envelope, FtpbcCodec
from ftpbc.paths import check_name, normalize
from ftpbc.transport.base import Entry
from ftpbc.transport.ftp.listing import parse_list_line, parse_listing, parse_mlsd_line
from ftpbc.transport.names import LoggedOnce

T = TypeVar("T")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)

# --------------------------------------------------------------------------- strategies

#: any text, lone surrogates included (what bytes that are not UTF-8 decode to)
any_text = st.text(st.characters(exclude_categories=()), max_size=300)
#: bytes from the wire, decoded as ftpbc decodes a listing
wire_text = st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape"))
#: characters that mean something to one of the parsers
significant = st.sampled_from([*";=. %~-+_/\\:\r\n\x00", "²", "٣", "é", "\udce9", "T", "Z", "e"])
tricky_text = st.text(st.one_of(significant, st.characters(min_codepoint=32, max_codepoint=0x7e)),
                      max_size=60)
numbers = st.one_of(st.integers(-10**6, 10**20).map(str), st.sampled_from(
    ["", "0", "-1", "²", "٣٤", "1e3", "99999999999999", "00000000000000", "20261301250000",
     "20260229120000.", "20260101000000.9999999", "1" * 5000, " 5", "+5"]))
fact_keys = st.sampled_from(["type", "TYPE", "size", "Size", "modify", "perm", "unique",
                             "UNIX.mode", "", "x"])
fact_values = st.one_of(numbers, st.sampled_from(["file", "dir", "cdir", "pdir", "OS.unix=slink:/x",
                                                  "FILE", ""]), tricky_text)
names = st.one_of(tricky_text, any_text, st.sampled_from([".", "..", "", " ", "a/..", "/", "x" * 300]))


@st.composite
def mlsd_lines(draw: st.DrawFn) -> str:
    facts = draw(st.lists(st.tuples(fact_keys, fact_values), max_size=6))
    text = ";".join(f"{k}={v}" for k, v in facts)
    return f"{text}{draw(st.sampled_from([';', '']))}{draw(st.sampled_from([' ', '', '  ']))}{draw(names)}"


@st.composite
def list_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(list("-dlbcps?x")))
    perms = draw(st.sampled_from(["rw-r--r--", "rwxrwxrwx", "rw-r--r--+", "rw-r--r--@", "rw", "---------"]))
    size = draw(numbers)
    month = draw(st.sampled_from(["Jan", "Feb", "Dec", "Foo", "jan", "MAY", "Dé", ""]))
    day = draw(st.sampled_from(["1", "01", "31", "0", "99", "٣", ""]))
    when = draw(st.sampled_from(["12:00", "99:99", "2025", "0000", "9999", "1:2", "", "24:60"]))
    sep = draw(st.sampled_from([" ", "  ", "\t"]))
    return f"{kind}{perms}{sep}1 ftp ftp{sep}{size} {month} {day} {when} {draw(names)}"


any_line = st.one_of(mlsd_lines(), list_lines(), any_text, wire_text)

# --------------------------------------------------------------------------- helpers


def _typed(call: Callable[[], T]) -> T | None:
    """``call()``, None if it raised one of ftpbc's errors; anything else fails the test."""
    try:
        return call()
    except FtpbcError:
        return None


def _sane(entry: Entry | None) -> None:
    """What a parser hands on is a name ftpbc can use, a size, and a time in UTC or none."""
    if entry is None:
        return
    check_name(entry.name)
    entry.name.encode("utf-8")
    assert isinstance(entry.size, int) and entry.size >= -1
    assert entry.mtime is None or entry.mtime.utcoffset() is not None
    assert isinstance(entry.is_dir, bool)


def _line_or_skip(parse: Callable[[str], Entry | None], line: str) -> None:
    """A line parser answers an entry, None (``.``, ``total N``...), or ValueError, which is
    the skip signal :func:`parse_listing` turns into one logged line."""
    try:
        entry = parse(line)
    except ValueError:
        return
    _sane(entry)


# --------------------------------------------------------------------------- listing parsers


@FUZZ
@given(any_line)
def test_an_mlsd_line_parses_or_is_skipped(line: str) -> None:
    _line_or_skip(parse_mlsd_line, line)


@FUZZ
@given(any_line)
def test_a_list_line_parses_or_is_skipped(line: str) -> None:
    _line_or_skip(lambda text: parse_list_line(text, NOW), line)


@FUZZ
@given(st.lists(any_line, max_size=8), st.sampled_from(["MLSD", "LIST"]))
def test_a_whole_listing_gives_entries_or_a_protocol_error(lines: list[str], command: str) -> None:
    parse: Callable[[str], Entry | None] = (
        parse_mlsd_line if command == "MLSD" else lambda text: parse_list_line(text, NOW))
    logging.disable(logging.WARNING)  # the skipped lines would flood the captured log
    try:
        try:
            entries = parse_listing(lines, parse, server="ftp://fuzz", path="/d", command=command,
                                    reported=LoggedOnce(1000))
        except ProtocolError:
            return  # not one line parsed: a format ftpbc does not understand, refused as such
    finally:
        logging.disable(logging.NOTSET)
    for e in entries:
        _sane(e)


# --------------------------------------------------------------------------- name codecs

prefixed = st.tuples(st.sampled_from(["req.", "resp.", "one.", "", "4.", "9.abc.", "-3.", "+12."]),
                     tricky_text).map("".join)
any_name = st.one_of(prefixed, any_text, wire_text)
ftpbc_codec = FtpbcCodec()
dropboxmq_codec = DropboxmqCodec()


@FUZZ
@given(any_name, st.sampled_from(["in", "out"]))
def test_the_ftpbc_codec_decodes_any_name_or_says_it_is_unusable(name: str, direction: str) -> None:
    env = _typed(lambda: ftpbc_codec.decode(name, direction=direction))  # type: ignore[arg-type]
    assert env is None or isinstance(env, Envelope)


@FUZZ
@given(any_name, st.sampled_from(["in", "out"]))
def test_the_dropboxmq_codec_decodes_any_name_or_says_it_is_unusable(name: str, direction: str) -> None:
    env = _typed(lambda: dropboxmq_codec.decode(name, direction=direction))  # type: ignore[arg-type]
    assert env is None or isinstance(env, Envelope)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AreaLayout]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    out = {}
    for naming in ("ftpbc", "dropboxmq"):
        cfg = Config.model_validate({
            "node": {"id": "node-a", "state_dir": str(tmp / "state"), "journal_dir": str(tmp / "j")},
            "servers": {"files": {"url": f"file://{tmp / 'exchange'}"}},
            "endpoints": {"ep": {"server": "files", "repository": "/ep", "naming": naming}},
        })
        out[naming] = AreaLayout("ep", cfg.endpoint("ep"), "in")
    return out


@FUZZ
@given(st.lists(any_name, max_size=6), st.sampled_from(["ftpbc", "dropboxmq"]))
def test_a_listing_of_any_names_never_stops_an_endpoints_poll(
        layouts: dict[str, AreaLayout], listed: list[str], naming: str) -> None:
    """A layout turns names into candidates: an unusable one is logged and skipped, nothing
    escapes, so one bad name never stops the rest of a poll."""
    layout = layouts[naming]
    logging.disable(logging.WARNING)
    try:
        found = layout.candidates([Entry(n, 1, NOW, False) for n in listed])
    finally:
        logging.disable(logging.NOTSET)
    for c in found:
        assert c.name in listed
        check_name(c.name)
        c.name.encode("utf-8")


# --------------------------------------------------------------------------- paths

path_parts = st.sampled_from(["", ".", "..", "a", ".a", "a.", "..a", "b c", "\n", "\r", "\x00", "é"])


def _normalized(path: str) -> str:
    """What normalize promises, written the slow way (no shortcut for paths already normal)."""
    if any(ch in path for ch in "\0\r\n"):
        raise UnsafeNameError(path)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeNameError(path)
    return "/" + "/".join(parts)


@FUZZ
@given(st.lists(path_parts, max_size=6), st.booleans(), st.booleans())
def test_normalize_takes_its_shortcut_only_for_paths_already_normal(parts: list[str], absolute: bool,
                                                                    trailing: bool) -> None:
    path = ("/" if absolute else "") + "/".join(parts) + ("/" if trailing else "")
    try:
        expected = _normalized(path)
    except UnsafeNameError:
        with pytest.raises(UnsafeNameError):
            normalize(path)
        return
    assert normalize(path) == expected


#: journal values: paths, names with headers, JSON, base64 bodies, and anything else
journal_values = st.one_of(
    any_text,
    st.text(st.sampled_from('ab09/:.-_~@%;="{}[],+ \n\té'), max_size=80),
    st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode("ascii")),
)


@FUZZ
@given(journal_values)
def test_a_journal_value_is_escaped_exactly_as_quote_escapes_it(value: str) -> None:
    # The journal's shortcuts (a plain value as it is, the common escapes by str.replace) must
    # write the very text quote() writes: older records and tools read it with unquote().
    # surrogatepass: names decoded from the wire with surrogateescape may hold lone surrogates
    assert _quote(value) == quote(value, safe=_SAFE, errors="surrogatepass")
    assert unquote(_quote(value), errors="surrogatepass") == value
