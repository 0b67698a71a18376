"""One behaviour suite for every transport/server pair (``server`` runs each test per
CONFORMANCE_SERVERS: ALL_SERVERS plus ProFTPD and pure-ftpd, plain and TLS).

Everything goes through ``open_transport(handle.config())``: what holds here holds for the
protocol code above the transport, whichever server it talks to.  The local files behind the
server (``handle.root``) are used to set up large fixtures quickly and to check results
independently of the transport under test.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.config.loader import parse_config
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectFailed,
    NotFound,
    PermissionDenied,
    SourceGone,
    TransportError,
    UnsafeNameError,
)
from ftpbc.transport import Transport, open_transport
from tests.conftest import CONFORMANCE_SERVERS
from tests.servers.handle import ServerHandle
from tests.servers.process import require_root
from tests.servers.proftpd import PASV_TWO_PORTS, proftpd_binary, running_proftpd
from tests.support import free_port

#: the transport boundary, where servers differ: the fast lane keeps every server here
pytestmark = pytest.mark.every_server

MIB = 1 << 20
#: every byte value, in every position modulo 256
EVERY_BYTE = bytes(range(256))


@pytest.fixture(params=CONFORMANCE_SERVERS)
def server(request: pytest.FixtureRequest) -> ServerHandle:
    """Each test runs once per server kind (this module's list is longer than conftest's)."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle


@pytest.fixture
def t(server: ServerHandle) -> Iterator[Transport]:
    transport = open_transport(server.config())
    yield transport
    transport.close()


def put_bytes(t: Transport, path: str, data: bytes) -> int:
    return t.put(path, io.BytesIO(data))


def get_bytes(t: Transport, path: str) -> bytes:
    out = io.BytesIO()
    n = t.get(path, out)
    assert n == len(out.getvalue())
    return out.getvalue()


# --------------------------------------------------------------------------- listing


def test_empty_directory_lists_nothing(server: ServerHandle, t: Transport) -> None:
    assert t.list(server.fresh_dir()) == []


def test_listing_10000_entries_is_complete_and_exact(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    local = server.local(d)
    # Hard links to 13 files of 0..12 bytes: creating 10,000 directory entries this way is
    # ~100x faster than writing 10,000 files on a busy disk, and the listing cannot tell.
    sources = server.local(server.fresh_dir())
    for size in range(13):
        (sources / str(size)).write_bytes(b"x" * size)
    for i in range(10_000):
        os.link(sources / str(i % 13), local / f"m{i:05d}.msg")
    (local / "sub").mkdir()

    entries = {e.name: e for e in t.list(d)}

    assert len(entries) == 10_001
    assert entries["sub"].is_dir
    files = [e for e in entries.values() if not e.is_dir]
    assert sorted(e.name for e in files) == [f"m{i:05d}.msg" for i in range(10_000)]
    assert all(e.size == int(e.name[1:6]) % 13 for e in files)


def test_listing_a_missing_directory_is_not_found(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    with pytest.raises(NotFound) as err:
        t.list(f"{d}/absent")
    assert "absent" in str(err.value)


def _scanned(t: Transport, path: str) -> list[tuple[str, int, bool]]:
    seen: list[tuple[str, int, bool]] = []
    assert t.scan(path, lambda e: seen.append((e.name, e.size, e.is_dir)) is None) is True
    return sorted(seen)


@pytest.mark.parametrize("leaf", ["plain", "with space", "-dash"])
def test_a_scan_sees_what_a_listing_sees(server: ServerHandle, t: Transport, leaf: str) -> None:
    # vsftpd's LIST goes by path where the path is plain, and from the working directory
    # otherwise: both must give the directory's entries, no "." or "..", nothing more.
    d = f"{server.fresh_dir()}/{leaf}"
    t.mkdir(f"{d}/sub")
    put_bytes(t, f"{d}/a.msg", b"12345")
    put_bytes(t, f"{d}/-b", b"")
    put_bytes(t, f"{d}/.hidden", b"x")

    assert _scanned(t, d) == [("-b", 0, False), (".hidden", 1, False), ("a.msg", 5, False),
                              ("sub", _scanned_dir_size(t, d), True)]
    assert _scanned(t, f"{d}/sub") == []


def _scanned_dir_size(t: Transport, d: str) -> int:
    # A directory's size is whatever the server says; the listing is the reference.
    return next(e.size for e in t.list(d) if e.name == "sub")


def test_scanning_a_missing_directory_is_not_found(server: ServerHandle, t: Transport) -> None:
    # vsftpd answers a LIST of a missing path with an empty listing and 226: that must not
    # pass for an empty directory.
    d = server.fresh_dir()
    seen: list[str] = []
    with pytest.raises(NotFound) as err:
        t.scan(f"{d}/absent", lambda e: seen.append(e.name) is None)
    assert "absent" in str(err.value)
    assert seen == []


def test_a_scan_follows_a_directory_that_grows_past_what_one_reply_holds(server: ServerHandle,
                                                                        t: Transport) -> None:
    # Where a small directory is listed on the control connection (vsftpd: STAT), a listing
    # that outgrew one reply must still come whole, then and after.
    d = server.fresh_dir()
    put_bytes(t, f"{d}/first.msg", b"1")
    assert _scanned(t, d) == [("first.msg", 1, False)]
    local = server.local(d)
    names = [f"{i:04d}-{'x' * 100}.msg" for i in range(1_500)]
    for name in names:
        (local / name).write_bytes(b"")
    expected = sorted([("first.msg", 1, False)] + [(n, 0, False) for n in names])

    assert _scanned(t, d) == expected
    assert _scanned(t, d) == expected
    for name in names[2:]:
        (local / name).unlink()
    assert _scanned(t, d) == sorted([("first.msg", 1, False)] + [(n, 0, False) for n in names[:2]])


def test_a_name_with_a_line_break_does_not_cost_a_scan_the_rest(server: ServerHandle, t: Transport) -> None:
    # A partner's file (made by SFTP or on the disk) whose name holds "\n213 ": on a control
    # connection it would read as the end of a status reply.
    d = server.fresh_dir()
    odd = "odd\n213 End of status\nx"
    put_bytes(t, f"{d}/ok.msg", b"12")
    (server.local(d) / odd).write_bytes(b"")
    put_bytes(t, f"{d}/zz.msg", b"3")

    for _ in range(2):
        # SFTP and local directories report the odd name as it is; FTP servers print it over
        # three lines, of which the first reads as a file "odd" (whose claim would find
        # nothing) and the others are skipped.  Nothing else is in or out.
        assert {name for name, _, _ in _scanned(t, d)} - {odd, "odd"} == {"ok.msg", "zz.msg"}
    put_bytes(t, f"{d}/after.msg", b"")  # the session went on in step
    assert {name for name, _, _ in _scanned(t, d)} - {odd, "odd"} == {"ok.msg", "zz.msg", "after.msg"}


def test_listing_reports_size_and_a_recent_mtime(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"12345")
    [entry] = t.list(d)
    assert (entry.name, entry.size, entry.is_dir) == ("f", 5, False)
    assert entry.mtime is not None
    # LIST formats give minutes: allow that much slack.
    assert abs(entry.mtime.timestamp() - time.time()) < 120


# --------------------------------------------------------------------------- put / get


@pytest.mark.parametrize("size", [0, 1, 10 * MIB], ids=["0B", "1B", "10MiB"])
def test_round_trip_is_byte_exact(server: ServerHandle, t: Transport, size: int) -> None:
    d = server.fresh_dir()
    data = (EVERY_BYTE * (size // 256 + 1))[:size] if size != 1 else b"\xff"

    assert put_bytes(t, f"{d}/blob", data) == size

    assert server.local(f"{d}/blob").read_bytes() == data
    assert get_bytes(t, f"{d}/blob") == data
    assert t.stat(f"{d}/blob").size == size


def test_put_replaces_an_existing_file(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"a much longer first version")
    put_bytes(t, f"{d}/f", b"short")
    assert get_bytes(t, f"{d}/f") == b"short"


@pytest.mark.parametrize("size", [1024, 256 * 1024], ids=["small", "large"])
def test_a_refused_put_raises_the_refusal_and_the_session_goes_on(server: ServerHandle, t: Transport,
                                                                  size: int) -> None:
    # A small body is written before the server's answer to STOR (one round trip less): a
    # refusal must still come back as the server's refusal, not as a lost connection, and
    # leave the session in step for the next command.
    d = server.fresh_dir()
    with pytest.raises((NotFound, PermissionDenied)) as err:
        put_bytes(t, f"{d}/no-such-dir/f", b"x" * size)
    assert "no-such-dir" in str(err.value)
    assert not server.local(f"{d}/no-such-dir").exists()
    put_bytes(t, f"{d}/f", b"after")
    assert get_bytes(t, f"{d}/f") == b"after"


def test_get_of_a_missing_file_is_not_found(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    with pytest.raises(NotFound) as err:
        get_bytes(t, f"{d}/nothing-here")
    assert "nothing-here" in str(err.value)
    # The transport is still usable afterwards.
    assert t.list(d) == []


# --------------------------------------------------------------------------- rename


def test_rename_moves_the_file(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    t.mkdir(f"{d}/to")
    put_bytes(t, f"{d}/a", b"payload")
    t.rename(f"{d}/a", f"{d}/to/b")
    assert not server.local(f"{d}/a").exists()
    assert server.local(f"{d}/to/b").read_bytes() == b"payload"


def test_rename_of_a_missing_source_is_source_gone(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    with pytest.raises(SourceGone) as err:
        t.rename(f"{d}/claimed-already", f"{d}/x")
    assert "claimed-already" in str(err.value)


def test_rename_replaces_an_existing_target(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/new", b"new content")
    put_bytes(t, f"{d}/old", b"old content that is longer")
    t.rename(f"{d}/new", f"{d}/old")
    assert get_bytes(t, f"{d}/old") == b"new content"
    assert not t.exists(f"{d}/new")


def test_rename_each_reports_every_pair_in_order(server: ServerHandle, t: Transport) -> None:
    """A batch of renames (FTP: every RNFR and RNTO in one write): a missing source in the
    middle is that pair's SourceGone only, the pairs after it are renamed, a target is
    replaced, and the session is still in step for the next command."""
    d = server.fresh_dir()
    t.mkdir(f"{d}/to")
    for name in ("a", "c", "d", "e"):
        put_bytes(t, f"{d}/{name}", name.encode())
    put_bytes(t, f"{d}/to/c", b"old target")
    pairs = [("a", "a"), ("gone", "b"), ("c", "c"), ("d", "d"), ("gone-too", "x"), ("e", "e")]
    outcomes = t.rename_each([(f"{d}/{src}", f"{d}/to/{dst}") for src, dst in pairs])
    assert [type(o).__name__ for o in outcomes] == ["NoneType", "SourceGone", "NoneType", "NoneType",
                                                    "SourceGone", "NoneType"]
    assert sorted(p.name for p in server.local(d).iterdir()) == ["to"]
    assert {p.name: p.read_bytes() for p in server.local(f"{d}/to").iterdir()} == {
        "a": b"a", "c": b"c", "d": b"d", "e": b"e"}
    assert get_bytes(t, f"{d}/to/d") == b"d"


def test_rename_each_of_more_pairs_than_one_write_takes(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    count = 70  # more than two of FTP's batches (RENAME_BATCH)
    for i in range(count):
        (server.local(d) / f"m{i}").write_bytes(b"x")
    pairs = [(f"{d}/m{i}", f"{d}/m{i}.claimed") for i in range(count)]
    pairs.insert(40, (f"{d}/missing", f"{d}/missing.claimed"))
    outcomes = t.rename_each(pairs)
    assert [i for i, o in enumerate(outcomes) if o is not None] == [40]
    assert isinstance(outcomes[40], SourceGone)
    assert sorted(p.name for p in server.local(d).iterdir()) == sorted(f"m{i}.claimed" for i in range(count))


def test_two_threads_racing_for_one_source_one_wins(server: ServerHandle, t: Transport) -> None:
    """The claim race: exactly one rename succeeds, the loser learns SourceGone."""
    d = server.fresh_dir()
    rounds = 15
    for r in range(rounds):
        put_bytes(t, f"{d}/job{r}", b"work")
    barrier = threading.Barrier(2)
    outcomes: dict[int, list[str]] = {0: [], 1: []}

    def claimer(me: int) -> None:
        for r in range(rounds):
            barrier.wait(timeout=30)
            try:
                t.rename(f"{d}/job{r}", f"{d}/job{r}.claimed-by-{me}")
                outcomes[me].append("won")
            except SourceGone:
                outcomes[me].append("lost")
            except TransportError as exc:  # anything else is a failure of the contract
                outcomes[me].append(f"error: {exc}")

    threads = [threading.Thread(target=claimer, args=(i,)) for i in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)

    for r in range(rounds):
        assert sorted([outcomes[0][r], outcomes[1][r]]) == ["lost", "won"], (r, outcomes)
    names = {e.name for e in t.list(d)}
    assert len(names) == rounds
    assert all(".claimed-by-" in n for n in names)


# --------------------------------------------------------------------------- delete / mkdir / stat


def test_delete_removes_and_a_second_delete_is_not_found(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"x")
    t.delete(f"{d}/f")
    assert not server.local(f"{d}/f").exists()
    with pytest.raises(NotFound) as err:
        t.delete(f"{d}/f")
    assert f"{d}/f" in str(err.value)


def test_mkdir_creates_parents_and_accepts_an_existing_dir(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    t.mkdir(f"{d}/a/b/c")
    assert server.local(f"{d}/a/b/c").is_dir()
    t.mkdir(f"{d}/a/b/c")
    t.mkdir(f"{d}/a")
    assert t.stat(f"{d}/a/b").is_dir
    put_bytes(t, f"{d}/a/b/c/f", b"x")
    assert server.local(f"{d}/a/b/c/f").read_bytes() == b"x"


def test_mkdir_over_a_file_fails(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"x")
    with pytest.raises(TransportError):
        t.mkdir(f"{d}/f")
    assert server.local(f"{d}/f").is_file()


def test_stat_and_exists(server: ServerHandle, t: Transport) -> None:
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"abc")
    f = t.stat(f"{d}/f")
    assert (f.name, f.size, f.is_dir) == ("f", 3, False)
    assert t.stat(d).is_dir
    assert t.exists(f"{d}/f")
    assert t.exists(d)
    assert not t.exists(f"{d}/missing")
    with pytest.raises(NotFound):
        t.stat(f"{d}/missing")


@pytest.mark.parametrize("name", ["with space", "ünïcødé-名前.msg", "-leading-dash", "semi;colon", "a  b",
                                  ".hidden"])
def test_odd_names_survive_every_operation(server: ServerHandle, t: Transport, name: str) -> None:
    d = server.fresh_dir()
    path = f"{d}/{name}"
    put_bytes(t, path, name.encode())
    assert [e.name for e in t.list(d)] == [name]
    assert server.local(path).read_bytes() == name.encode()
    assert get_bytes(t, path) == name.encode()
    assert t.stat(path).size == len(name.encode())
    t.rename(path, f"{path} renamed")
    assert t.exists(f"{path} renamed")
    t.delete(f"{path} renamed")
    assert t.list(d) == []


# --------------------------------------------------------------------------- failures


def test_operations_after_the_server_drops_the_connection(server: ServerHandle, t: Transport) -> None:
    drop = server.controls.get("drop_connections")
    if drop is None:
        pytest.skip(f"{server.kind} has no connection to drop")
    d = server.fresh_dir()
    put_bytes(t, f"{d}/f", b"before")
    for _ in range(2):
        drop()
        # The next operations reconnect on their own and see the same files.
        assert [e.name for e in t.list(d)] == ["f"]
        assert get_bytes(t, f"{d}/f") == b"before"
    drop()
    put_bytes(t, f"{d}/g", b"after")
    assert server.local(f"{d}/g").read_bytes() == b"after"


def test_wrong_password_is_authentication_failed(server: ServerHandle) -> None:
    if server.password is None:
        pytest.skip(f"{server.kind} does not log in with a password")
    wrong = "not-the-password-" + server.password[::-1]
    cfg = ServerConfig.from_url(server.url, password=wrong, **server.options)
    with open_transport(cfg) as t, pytest.raises(AuthenticationFailed) as err:
        t.list("/")
    message = str(err.value)
    assert cfg.display in message
    assert wrong not in message and server.password not in message
    assert "\n" not in message


def test_closed_port_is_connect_failed_within_the_timeout(server: ServerHandle) -> None:
    if server.kind == "local":
        pytest.skip("a local directory has no port")
    port = free_port()  # nothing listens there
    url = server.url.replace(f":{server.config().port}", f":{port}", 1)
    cfg = ServerConfig.from_url(url, password=server.password, timeout=3, **server.options)
    started = time.monotonic()
    with open_transport(cfg) as t, pytest.raises(ConnectFailed) as err:
        t.list("/")
    assert time.monotonic() - started < 3 + 1
    assert f"127.0.0.1:{port}" in str(err.value)


@pytest.mark.parametrize("bad", ["/a/../b", "/../etc/passwd", "/x/..", "/a\nb", "/a\0b"])
def test_unsafe_paths_are_refused_before_anything_is_sent(server: ServerHandle, t: Transport,
                                                         bad: str) -> None:
    for call in (lambda: t.list(bad), lambda: t.stat(bad), lambda: t.delete(bad),
                 lambda: t.mkdir(bad), lambda: put_bytes(t, bad, b"x"), lambda: t.rename(bad, "/ok"),
                 lambda: t.rename("/ok", bad)):
        with pytest.raises(UnsafeNameError) as err:
            call()
        assert repr(bad) in str(err.value)
        assert "\n" not in str(err.value)


def test_concurrent_listings_ride_out_a_passive_port_taken_meanwhile(tmp_path: Path) -> None:
    """ProFTPD picks a passive port at random and sometimes cannot listen on it because another
    session took it between its bind and its listen: "425 EPSV: Address already in use".  Nothing
    was transferred, so the transport asks again.  Two passive ports and eight sessions listing
    at once make the race frequent (without the retry, most runs of this test failed)."""
    binary = proftpd_binary()
    require_root("proftpd")
    with running_proftpd(binary, tmp_path / "proftpd", passive=PASV_TWO_PORTS, label="proftpd-2ports") as p, \
            open_transport(p.handle("proftpd").config(pool_size=8)) as t:
        failures: list[str] = []

        def lister() -> None:
            for _ in range(40):
                try:
                    t.list("/")
                except TransportError as exc:
                    failures.append(str(exc))

        threads = [threading.Thread(target=lister) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not any(th.is_alive() for th in threads)
        assert failures == []


# --------------------------------------------------------------------------- configuration


def test_unknown_url_scheme_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("servers:\n  partner:\n    url: gopher://h/x\n", source="c.yaml")
    message = str(err.value)
    assert "gopher://h/x" in message and "c.yaml:" in message and "servers.partner" in message
    assert "\n" not in message


def test_missing_password_env_var_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FTPBC_TEST_NO_SUCH_VAR", raising=False)
    text = "servers:\n  partner:\n    url: ftp://u@127.0.0.1/\n    password_env: FTPBC_TEST_NO_SUCH_VAR\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="c.yaml")
    message = str(err.value)
    assert "FTPBC_TEST_NO_SUCH_VAR" in message and "c.yaml" in message
    assert "\n" not in message
