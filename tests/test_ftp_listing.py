"""The FTP listing parsers (:mod:`ftpbc.transport.ftp.listing`), without a server: what a LIST,
MLSD or MLST line gives, what is skipped and what is refused.  Every server's own listings go
through them in tests/test_transport_conformance.py; hostile listings, sent by a scripted
server, in tests/test_hostile_listings.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from ftpbc.errors import ProtocolError
from ftpbc.transport.ftp.listing import (
    LineParser,
    OddName,
    ParsedLines,
    parse_list_line,
    parse_listing,
    parse_mlsd_line,
    parse_mlst_line,
)
from ftpbc.transport.names import LoggedOnce

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
REQ = "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000001"

# --------------------------------------------------------------------------- LIST


@pytest.mark.parametrize(("line", "name", "size", "is_dir", "mtime"), [
    ("-rw-r--r--    1 1001     1001            5 Mar 09 08:15 plain.txt", "plain.txt", 5, False,
     datetime(2026, 3, 9, 8, 15, tzinfo=UTC)),
    ("drwxrwxrwx    2 0        0            4096 Dec 31 23:59 dir", "dir", 4096, True,
     datetime(2025, 12, 31, 23, 59, tzinfo=UTC)),  # no year and "in the future": last year
    ("-rw-------    1 0        0      1234567 Jan 01  2020 old file", "old file", 1234567, False,
     datetime(2020, 1, 1, tzinfo=UTC)),
    ("-rw-r--r--    1 1001     1001            0 Mar 10 11:59  leading space", " leading space", 0,
     False, datetime(2026, 3, 10, 11, 59, tzinfo=UTC)),
    ("-rw-r--r--    1 1001     1001            3 Mar 10 11:59 -dash ünï", "-dash ünï", 3, False,
     datetime(2026, 3, 10, 11, 59, tzinfo=UTC)),
    ("lrwxrwxrwx    1 0        0               4 Mar 10 11:59 link -> target", "link", 4, False,
     datetime(2026, 3, 10, 11, 59, tzinfo=UTC)),
])
def test_unix_list_lines_parse(line: str, name: str, size: int, is_dir: bool, mtime: datetime) -> None:
    entry = parse_list_line(line, NOW)
    assert entry is not None
    assert (entry.name, entry.size, entry.is_dir, entry.mtime) == (name, size, is_dir, mtime)


@pytest.mark.parametrize("line", ["total 12", "drwxr-xr-x 2 0 0 4096 Mar 10 11:59 .",
                                  "drwxr-xr-x 2 0 0 4096 Mar 10 11:59 .."])
def test_list_lines_that_are_not_entries_are_skipped(line: str) -> None:
    assert parse_list_line(line, NOW) is None


@pytest.mark.parametrize("line", ["03-10-26  11:59AM       <DIR>          windows-dir", "garbage"])
def test_list_lines_in_unknown_formats_are_refused_not_skipped(line: str) -> None:
    with pytest.raises(ValueError, match="unix-style"):
        parse_list_line(line, NOW)


@pytest.mark.parametrize("name", [".", ".."])
def test_a_list_line_for_a_file_called_dot_or_dot_dot_is_refused(name: str) -> None:
    """A directory's own entries are skipped silently; a *file* so named is no entry of a
    directory ftpbc could act on, and is refused, to be logged."""
    with pytest.raises(OddName, match="directory's own entry"):
        parse_list_line(f"-rw-r--r-- 1 0 0 5 Mar 10 11:59 {name}", NOW)


# --------------------------------------------------------------------------- MLSD and MLST


def test_an_mlsd_line_gives_its_facts() -> None:
    entry = parse_mlsd_line(f"type=file;size=5;modify=20260101120000.5;UNIX.mode=0644; {REQ}")
    assert entry is not None
    assert (entry.name, entry.size, entry.is_dir) == (REQ, 5, False)
    assert entry.mtime == datetime(2026, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)
    assert parse_mlsd_line("type=cdir;modify=20260101120000; .") is None
    assert parse_mlsd_line("type=pdir;modify=20260101120000; ..") is None


@pytest.mark.parametrize("name", [f"sub/{REQ}", f"../{REQ}", f"/ep/inbox/{REQ}", f"./{REQ}", f"sub\\{REQ}",
                                  f"{REQ}/", "/"])
@pytest.mark.parametrize("command", ["MLSD", "LIST"])
def test_a_listed_name_that_is_a_path_is_refused_whole_never_cut(name: str, command: str) -> None:
    """A name holding a path is refused as it is: cut to its last part it would name a file
    in this directory that the listing never showed."""
    line = (f"type=file;size=5;modify=20260101120000; {name}" if command == "MLSD"
            else f"-rw-r--r-- 1 0 0 5 Mar 10 11:59 {name}")
    with pytest.raises(OddName, match=r"is a path .*refused whole, never shortened") as refused:
        parse_mlsd_line(line) if command == "MLSD" else parse_list_line(line, NOW)
    assert refused.value.name == name


def test_mlst_names_the_entry_as_asked_not_as_the_reply_says() -> None:
    """An MLST reply names the path it was asked about (``/ep/inbox/req.X``): the entry is named
    by the caller, and that path is no refusal."""
    entry = parse_mlst_line(f"type=file;size=7;modify=20260101120000; /ep/inbox/{REQ}", REQ)
    assert entry is not None and (entry.name, entry.size, entry.is_dir) == (REQ, 7, False)
    root = parse_mlst_line("type=dir;modify=20260101120000; /", "/")
    assert root is not None and root.is_dir
    with pytest.raises(ValueError, match="no type fact"):
        parse_mlst_line("size=7; /ep/x", "x")


# --------------------------------------------------------------------------- whole listings


def test_each_refused_name_is_logged_once_across_listings(caplog: pytest.LogCaptureFixture) -> None:
    """A poller lists the same directory again and again: a refused name or a bad line is
    logged the first time only, and the entries beside it are listed every time, whether the
    listing is parsed whole or line by line as it streams in."""
    lines = [f"type=file;size=5;modify=20260101120000; {REQ}",
             f"type=file;size=5;modify=20260101120001; sub/{REQ}",
             f"type=file;size=5;modify=20260101120002; sub/{REQ}",
             "type=file;size=²; bad-size"]
    reported = LoggedOnce(100)
    parsed = ParsedLines()
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        entries = parse_listing(lines, parsed.mlsx, server="ftp://x", path="/in", command="MLSD",
                                reported=reported)
        assert [e.name for e in entries] == [REQ]
        streamed = LineParser(parsed.mlsx, server="ftp://x", path="/in", command="MLSD", reported=reported)
        assert [e.name for raw in lines if (e := streamed.feed(raw.encode() + b"\r")) is not None] == [REQ]
        streamed.finish()
    messages = [r.getMessage() for r in caplog.records]
    assert sum(f"sub/{REQ}" in m for m in messages) == 1, messages  # one name, two lines: once
    assert sum("bad-size" in m for m in messages) == 1, messages
    assert len(messages) == 2


def test_a_listing_none_of_whose_lines_parse_is_refused() -> None:
    with pytest.raises(ProtocolError, match="cannot parse any LIST line"):
        parse_listing(["03-10-26  11:59AM  <DIR>  windows-dir", "garbage"],
                      lambda ln: parse_list_line(ln, NOW), server="ftp://x", path="/in", command="LIST",
                      reported=LoggedOnce(10))
    # nothing but refused names is an empty directory, not a format ftpbc does not understand
    assert parse_listing([f"type=file; sub/{REQ}", f"type=file; ../{REQ}"], parse_mlsd_line, server="ftp://x",
                         path="/in", command="MLSD", reported=LoggedOnce(10)) == []


def test_logged_once_is_bounded() -> None:
    seen = LoggedOnce(2)
    assert [seen.first(k) for k in ("a", "a", "b", "c", "c")] == [True, False, True, False, False]
    assert len(seen) == 2
