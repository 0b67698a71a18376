"""Hostile listings: odd names, paths for names, odd facts, lines that do not parse, PASV elsewhere.

A scripted server (:class:`tests.servers.hostile.HostileFTPServer`, ``mlsd`` or ``list``, and
:class:`~tests.servers.hostile.HostileSFTPServer`, ``listing``) answers a listing with crafted
bytes; a local directory holds names a partner could create there.  In every case the good files
beside the odd entries are listed, each odd entry is skipped and logged once (not once per
poll), a name that is a path is refused whole (never cut to its last part, so never claimed),
and nothing escapes but ftpbc's own errors.  A PASV reply naming a third address is not
followed: ftpbc opens the data connection to the control connection's host (EPSV replies carry
no address at all).

Every server here listens on loopback and is stopped by the test that started it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from ftpbc.config.models import Config
from ftpbc.config.servers import ServerConfig
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.journal import Journal
from ftpbc.transport import open_transport
from ftpbc.transport.base import Entry, Transport
from ftpbc.transport.local import LocalTransport
from tests.servers.hostile import HostileFTPServer, HostileSFTPServer

GOOD_1 = "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000001"
GOOD_2 = "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000002"
#: a name of a message that cannot go through the lifecycle (too long to archive)
LONG = "req." + "x" * 296

MLSD_GOOD = [
    f"type=file;size=5;modify=20260101120000; {GOOD_1}".encode(),
    f"type=file;size=7;modify=20260101120000.123;UNIX.mode=0644; {GOOD_2}".encode(),
    b"type=dir;modify=20260101120000; sub",
    b"type=cdir;modify=20260101120000; .",
    b"type=pdir;modify=20260101120000; ..",
]
#: lines that parse, for names ftpbc cannot use: skipped by the transport, logged once each
MLSD_ODD_NAMES = [
    b"type=file;size=1;modify=20260101120000; odd-cr\rname",
    b"type=file;size=1;modify=20260101120000; odd-lf\nDELE important",
    b"type=file;size=1;modify=20260101120000; odd-back\\slash",
    b"type=file;size=1;modify=20260101120000; odd-nul\x00name",
    b"type=file;size=1;modify=20260101120000; odd-latin1-caf\xe9",
    b"type=file;size=1;modify=20260101120000; odd/..",
]
#: lines whose facts do not parse: skipped, logged once each
MLSD_ODD_FACTS = [
    "type=file;size=²;modify=20260101120000; fact-superscript".encode(),
    b"type=file;size=-1;modify=20260101120000; fact-negative",
    b"size=5;modify=20260101120000; fact-no-type",
    b"type=file;size=99" + b"9" * 5000 + b"; fact-huge",
]


def _listing(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\r\n" for line in lines)


def _config(server: HostileFTPServer, **options: object) -> ServerConfig:
    return ServerConfig.from_url(server.url, password="pw", timeout=5.0, **options)


def _skips(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped a" in r.getMessage()]


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[AreaLayout]:
    """The inbound layout of an endpoint (it decodes names; no server needed for that)."""
    cfg = Config.model_validate({
        "node": {"id": "node-a", "state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "j")},
        "servers": {"srv": {"url": f"file://{tmp_path / 'exchange'}"}},
        "endpoints": {"ep": {"server": "srv", "repository": "/ep"}},
    })
    yield AreaLayout("ep", cfg.endpoint("ep"), "in")


@pytest.mark.timeout(60)
def test_odd_names_and_facts_in_an_mlsd_listing_are_skipped_once_and_the_rest_listed(
        caplog: pytest.LogCaptureFixture, layout: AreaLayout) -> None:
    odd_time = b"type=file;size=3;modify=99999999999999; req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003"
    no_size = b"type=file;modify=20260101120000; req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000004"
    long_name = f"type=file;size=2;modify=20260101120000; {LONG}".encode()
    lines = MLSD_GOOD + MLSD_ODD_NAMES + MLSD_ODD_FACTS + [odd_time, no_size, long_name, b"no-space-at-all"]
    caplog.set_level(logging.WARNING)
    with HostileFTPServer("mlsd", listing=_listing(lines)) as server, open_transport(_config(server)) as t:
        first = t.list("/ep/inbox")
        skipped_first = _skips(caplog)
        second = t.list("/ep/inbox")
        assert _skips(caplog) == skipped_first  # logged once, not once per listing
        assert [c for c in server.commands if c.startswith(("MLSD", "LIST"))] == ["MLSD /ep/inbox"] * 2

    assert first == second
    by_name = {e.name: e for e in first}
    assert sorted(by_name) == sorted([GOOD_1, GOOD_2, "sub", LONG,
                                      "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003",
                                      "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000004"])
    assert by_name[GOOD_1].size == 5 and not by_name[GOOD_1].is_dir
    good_2_time = by_name[GOOD_2].mtime
    assert good_2_time is not None and good_2_time.microsecond == 123000
    assert by_name["sub"].is_dir
    # an impossible time is an unknown time; a file without a size fact has no size (-1), so a
    # read is bounded by max_message_bytes rather than failing every byte past 0
    assert by_name["req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003"].mtime is None
    assert by_name["req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000004"].size == -1
    assert len(skipped_first) == len(MLSD_ODD_NAMES) + len(MLSD_ODD_FACTS)
    for marker in ("odd-cr", "odd-lf", "odd-back", "odd-nul", "odd-latin1", "'odd/..'",
                   "fact-superscript", "fact-negative", "fact-no-type", "size=99999"):
        assert sum(marker in m for m in skipped_first) == 1, (marker, skipped_first)

    # One level up, the endpoint's layout: the long name is ours but unusable, logged once.
    caplog.clear()
    for _ in range(2):
        names = [c.name for c in layout.candidates(first)]
        assert sorted(names) == sorted([GOOD_1, GOOD_2, "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003",
                                        "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000004"])
    assert sum(LONG[:40] in r.getMessage() for r in caplog.records) == 1


LIST_GOOD = [
    b"total 12",
    f"-rw-r--r--    1 ftp      ftp             5 Jan 01 12:00 {GOOD_1}".encode(),
    f"-rw-r--r--    1 ftp      ftp             7 Jan 01  2025 {GOOD_2}".encode(),
    b"drwxr-xr-x    2 ftp      ftp          4096 Jan 01 12:00 sub",
    b"drwxr-xr-x    2 ftp      ftp          4096 Jan 01 12:00 .",
    b"drwxr-xr-x    2 ftp      ftp          4096 Jan 01 12:00 ..",
]
LIST_ODD_NAMES = [
    b"-rw-r--r--    1 ftp      ftp             1 Jan 01 12:00 odd-cr\rname",
    b"-rw-r--r--    1 ftp      ftp             1 Jan 01 12:00 odd-back\\slash",
    b"-rw-r--r--    1 ftp      ftp             1 Jan 01 12:00 odd-latin1-caf\xe9",
]
LIST_UNPARSED = [
    b"this is not a listing line at all",
    "-rw-r--r--    1 ftp      ftp             ² Jan 01 12:00 unparsed-superscript".encode(),
    b"-rw-r--r--    1 ftp      ftp            -1 Jan 01 12:00 unparsed-negative",
    b"----------",
]


@pytest.mark.timeout(60)
def test_odd_names_and_lines_in_a_list_listing_are_skipped_once_and_the_rest_listed(
        caplog: pytest.LogCaptureFixture) -> None:
    bad_date = (b"-rw-r--r--    1 ftp      ftp             3 Foo 99 12:00 "
                b"req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003")
    lines = LIST_GOOD + LIST_ODD_NAMES + LIST_UNPARSED + [bad_date]
    caplog.set_level(logging.WARNING)
    with HostileFTPServer("list", listing=_listing(lines)) as server, open_transport(_config(server)) as t:
        first = t.list("/ep/inbox")
        skipped_first = _skips(caplog)
        assert t.list("/ep/inbox") == first
        assert _skips(caplog) == skipped_first
        assert "LIST -a" in server.commands

    by_name = {e.name: e for e in first}
    assert sorted(by_name) == sorted([GOOD_1, GOOD_2, "sub", "req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003"])
    good_2_time = by_name[GOOD_2].mtime
    assert by_name[GOOD_2].size == 7 and good_2_time is not None and good_2_time.year == 2025
    assert by_name["req.0b7e8a64-5c1a-4d2e-9f3b-aa0000000003"].mtime is None  # no such month
    assert len(skipped_first) == len(LIST_ODD_NAMES) + len(LIST_UNPARSED)
    for marker in ("odd-cr", "odd-back", "odd-latin1", "not a listing line", "unparsed-superscript",
                   "unparsed-negative", "'----------'"):
        assert sum(marker in m for m in skipped_first) == 1, (marker, skipped_first)


@pytest.mark.timeout(60)
def test_a_listing_of_nothing_but_odd_names_is_an_empty_directory_not_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    with HostileFTPServer("mlsd", listing=_listing(MLSD_ODD_NAMES)) as server, \
            open_transport(_config(server)) as t:
        assert t.list("/ep/inbox") == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["mlsd", "list"])
@pytest.mark.parametrize("third", ["127.0.0.2", "10.0.0.1"])
def test_a_pasv_reply_naming_a_third_address_is_not_followed(behaviour: str, third: str) -> None:
    """The data connection goes to the control connection's host, whatever PASV names: a
    server cannot make ftpbc connect to another machine of its choosing (FTP bounce), and a
    server behind NAT that announces its private address still works.  127.0.0.2 is a loopback
    address of its own with a trap listening on the announced port; 10.0.0.1 is elsewhere."""
    listing = _listing([f"type=file;size=5;modify=20260101120000; {GOOD_1}".encode()] if behaviour == "mlsd"
                       else [f"-rw-r--r--    1 ftp      ftp             5 Jan 01 12:00 {GOOD_1}".encode()])
    with HostileFTPServer(behaviour, listing=listing, pasv_host=third) as server, \
            open_transport(_config(server)) as t:
        entries = t.list("/ep/inbox")
        assert [e.name for e in entries] == [GOOD_1]
        assert server.data_connections == 1
        assert server.trapped == 0
        assert not any(c.startswith("EPSV") for c in server.commands)  # not advertised: PASV it was
        assert any(c.startswith("PASV") for c in server.commands)



# --------------------------------------------------------------------------- names that are paths

#: a request a hostile server lists as inside a subdirectory: cut to its last part, it would be
#: claimed from the inbox as if it were there
BEHIND = "req.0b7e8a64-5c1a-4d2e-9f3b-aa00000000b1"
#: names that are paths, of every kind; none may be acted on, whole or in part
PATH_NAMES = [f"sub/{BEHIND}", f"../{BEHIND}", f"/ep/inbox/{BEHIND}", f"./{BEHIND}", f"sub\\{BEHIND}",
              f"{BEHIND}/", "sub/..", "/"]


def _path_listing(behaviour: str) -> bytes:
    good = [GOOD_1, GOOD_2]
    if behaviour == "mlsd":
        return _listing([f"type=file;size=5;modify=20260101120000; {n}".encode() for n in good + PATH_NAMES])
    return _listing([f"-rw-r--r--    1 ftp      ftp             5 Jan 01 12:00 {n}".encode()
                     for n in good + PATH_NAMES])


def _refusals(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(f"name {name!r}" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["mlsd", "list"])
def test_a_listed_path_is_refused_whole_never_claimed_and_the_rest_claimed(
        behaviour: str, caplog: pytest.LogCaptureFixture, layout: AreaLayout, tmp_path: Path) -> None:
    """An MLSD or LIST entry named ``sub/req.X`` (or ``../req.X``, ``/ep/inbox/req.X``,
    ``sub\\req.X``...) is refused as it is, not cut to ``req.X``: a node polling the inbox never
    claims ``req.X``, claims the good requests listed beside it, and logs each refused name
    once, not once per poll."""
    caplog.set_level(logging.WARNING)
    journal = Journal(tmp_path / "journals", "node-a")
    with HostileFTPServer(behaviour, listing=_path_listing(behaviour)) as server, \
            open_transport(_config(server)) as t:
        lc = Lifecycle(layout, t, journal.endpoint("ep"), "node-a")
        try:
            waiting = lc.waiting()
            assert [c.name for c in lc.waiting()] == [c.name for c in waiting]  # the second poll
            claimed, lost = lc.claim(waiting, "serve")
        finally:
            journal.close()
        commands = list(server.commands)

    assert sorted(c.name for c in waiting) == [GOOD_1, GOOD_2]
    assert lost == 0 and sorted(c.path for c in claimed) == [
        f"/ep/inselect/{GOOD_1}~node-a", f"/ep/inselect/{GOOD_2}~node-a"]
    assert sorted(c for c in commands if c.startswith("RNFR")) == [
        f"RNFR /ep/inbox/{GOOD_1}", f"RNFR /ep/inbox/{GOOD_2}"]
    assert not [c for c in commands if BEHIND in c]  # not claimed, read, nor asked about
    for name in PATH_NAMES:
        assert _refusals(caplog, name) == 1, (name, [r.getMessage() for r in caplog.records])
    assert "refused whole, never shortened" in caplog.text


@pytest.fixture(scope="module")
def host_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


@pytest.mark.timeout(60)
def test_a_path_listed_by_an_sftp_server_is_refused_whole_and_the_rest_listed(
        host_key: paramiko.PKey, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same rule over SFTP, whose READDIR replies carry names as the server chose them:
    paths, line breaks and bytes that are not UTF-8 are left out, each logged once, and the
    names beside them listed (a name that is not UTF-8 does not fail the whole listing)."""
    odd = [*(n.encode() for n in PATH_NAMES), b"odd-lf\nDELE x", b"odd-nul\x00x", b"odd-latin1-caf\xe9",
           b".."]
    names = [GOOD_1.encode(), *odd, GOOD_2.encode(), b"."]
    caplog.set_level(logging.WARNING)
    known_hosts = tmp_path / "known_hosts"
    with HostileSFTPServer("listing", host_key, names=names) as server:
        known_hosts.write_text(server.known_hosts_line())
        cfg = ServerConfig.from_url(server.url, password="pw", known_hosts=known_hosts, timeout=5.0)
        with open_transport(cfg) as t:
            first = t.list("/ep/inbox")
            logged = caplog.text
            streamed: list[Entry] = []
            assert t.scan("/ep/inbox", lambda e: streamed.append(e) or True)
            assert caplog.text == logged  # once, not once per listing

    assert [e.name for e in first] == [GOOD_1, GOOD_2]
    assert streamed == first
    assert first[0].size == 5 and not first[0].is_dir
    for name in PATH_NAMES:
        assert _refusals(caplog, name) == 1, name
    for marker in ("odd-lf", "odd-nul", "odd-latin1"):
        assert sum(marker in r.getMessage() for r in caplog.records) == 1, marker
    # Only the transport's own lines: a thread another test left winding down in this process
    # may log a warning of its own meanwhile.
    own = [r for r in caplog.records if r.name == "ftpbc.sftp"]
    assert len(own) == len(odd) - 1  # ".." is the parent directory: skipped silently


def test_a_local_name_that_is_no_bare_name_is_left_out_once(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A partner can create files named with a backslash, a line break or bytes that are not
    UTF-8 in a shared directory: the local transport leaves them out, logged once each, and
    lists the files beside them."""
    inbox = tmp_path / "exchange/ep/inbox"
    inbox.mkdir(parents=True)
    for name in (GOOD_1, GOOD_2, f"sub\\{BEHIND}", f"odd-lf\n{BEHIND}"):
        (inbox / name).write_bytes(b"12345")
    with open(os.path.join(bytes(inbox), b"odd-latin1-caf\xe9"), "wb") as fh:
        fh.write(b"12345")
    caplog.set_level(logging.WARNING)
    t: Transport = LocalTransport(tmp_path / "exchange", durable=False)
    with t:
        first = t.list("/ep/inbox")
        logged = len(_local_lines(caplog))
        streamed: list[Entry] = []
        assert t.scan("/ep/inbox", lambda e: streamed.append(e) or True)
        assert len(_local_lines(caplog)) == logged

    assert sorted(e.name for e in first) == [GOOD_1, GOOD_2]
    assert sorted(streamed, key=lambda e: e.name) == sorted(first, key=lambda e: e.name)
    assert logged == 3
    for marker in ("sub\\\\", "odd-lf", "odd-latin1"):
        assert sum(marker in r.getMessage() for r in caplog.records) == 1, (marker, caplog.text)


def _local_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The local transport's own log records (not those of threads other tests left behind)."""
    return [r for r in caplog.records if r.name == "ftpbc.transport.local"]
