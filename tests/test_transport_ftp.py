"""FTP/FTPS-only behaviour: implicit TLS, NAT'd PASV replies, certificate checks, the pool,
reconnection, streaming memory, and listing by STAT on vsftpd (the parsers themselves are
tested without a server in tests/test_ftp_listing.py)."""

from __future__ import annotations

import io
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftpbc.config.servers import ServerConfig
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.errors import ConnectFailed, OutcomeUnknown, TLSFailed
from ftpbc.transport import open_transport
from ftpbc.transport.ftp import FTPTransport
from tests.servers.handle import ServerHandle
from tests.servers.pyftpd import TLSMaterial, make_tls_material

GIB = 1 << 30


@pytest.fixture
def password() -> str:
    return secrets.token_urlsafe(12)


def round_trip(cfg: ServerConfig, data: bytes = b"payload \x00\xff") -> bytes:
    with open_transport(cfg) as t:
        t.mkdir("/rt")
        t.put("/rt/f", io.BytesIO(data))
        assert [e.name for e in t.list("/rt")] == ["f"]
        out = io.BytesIO()
        t.get("/rt/f", out)
        t.delete("/rt/f")
        return out.getvalue()


def test_implicit_ftps_round_trip(tmp_path: Path, tls_material: TLSMaterial, password: str) -> None:
    with EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0, implicit_tls=True,
                           certfile=tls_material.cert_file, keyfile=tls_material.key_file) as srv:
        cfg = ServerConfig.from_url(srv.url, password=password, tls="implicit",
                                    ca_file=tls_material.ca_file, timeout=5)
        assert round_trip(cfg) == b"payload \x00\xff"
        # An explicit-TLS client speaks plain text first: the implicit server cannot answer it.
        with pytest.raises((ConnectFailed, TLSFailed)):
            open_transport(cfg.model_copy(update={"tls": "explicit", "timeout": 1.0})).list("/")


def test_pasv_reply_with_a_foreign_address_falls_back_to_the_control_host(
        tmp_path: Path, password: str) -> None:
    """A server behind NAT announces its private address; connecting there would hang."""
    with EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0,
                           masquerade_address="10.255.255.1", disabled_commands=("EPSV",)) as srv:
        cfg = ServerConfig.from_url(srv.url, password=password, timeout=3)
        started = time.monotonic()
        assert round_trip(cfg) == b"payload \x00\xff"
        assert time.monotonic() - started < 3


def test_wrong_ca_is_tls_failed(pyftpdlib_ftps_server: ServerHandle, tmp_path: Path) -> None:
    other = make_tls_material(tmp_path / "other", common_name="someone else's CA")
    cfg = pyftpdlib_ftps_server.config(ca_file=other.ca_file, timeout=5)
    with open_transport(cfg) as t, pytest.raises(TLSFailed) as err:
        t.list("/")
    assert cfg.display in str(err.value)
    assert "certificate" in str(err.value)


def test_system_trust_store_rejects_a_private_ca(pyftpdlib_ftps_server: ServerHandle) -> None:
    """Verification is on by default: without ca_file the test CA is not trusted."""
    options = {k: v for k, v in pyftpdlib_ftps_server.options.items() if k != "ca_file"}
    cfg = ServerConfig.from_url(pyftpdlib_ftps_server.url, password=pyftpdlib_ftps_server.password,
                                timeout=5, **options)
    with open_transport(cfg) as t, pytest.raises(TLSFailed):
        t.list("/")
    # ...and verify_tls: false is the explicit way out.
    with open_transport(cfg.model_copy(update={"verify_tls": False})) as t:
        assert isinstance(t.list("/"), list)


def test_a_server_that_never_answers_is_connect_failed_within_the_timeout() -> None:
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)  # accepts (in the kernel) but never sends a banner
        port = mute.getsockname()[1]
        cfg = ServerConfig.from_url(f"ftp://u@127.0.0.1:{port}/", password="p", timeout=1)
        started = time.monotonic()
        with open_transport(cfg) as t, pytest.raises(ConnectFailed) as err:
            t.list("/")
        assert time.monotonic() - started < 2.5
        assert "timed out" in str(err.value)


def test_pool_bounds_connections_and_reuses_them(tmp_path: Path, password: str) -> None:
    with EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0) as srv:
        cfg = ServerConfig.from_url(srv.url, password=password, pool_size=2)
        peak = 0
        with open_transport(cfg) as t:
            assert isinstance(t, FTPTransport)

            def work(i: int) -> None:
                nonlocal peak
                for j in range(20):
                    t.put(f"/f{i}-{j}", io.BytesIO(b"x"))
                    peak = max(peak, srv.connection_count)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=60)
            assert len(os.listdir(tmp_path)) == 120
            assert peak <= 2
            assert t.pool.connects == 2


def test_reconnects_after_a_server_restart(pyftpdlib_server: ServerHandle) -> None:
    d = pyftpdlib_server.fresh_dir()
    with open_transport(pyftpdlib_server.config(timeout=10)) as t:
        t.put(f"{d}/f", io.BytesIO(b"before"))
        pyftpdlib_server.controls["restart"]()
        out = io.BytesIO()
        t.get(f"{d}/f", out)
        assert out.getvalue() == b"before"


def test_rides_out_a_short_server_outage_with_backoff(tmp_path: Path, password: str) -> None:
    """After a drop the pool retries the connect (tenacity backoff) until the timeout."""
    srv = EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0).start()
    try:
        with open_transport(ServerConfig.from_url(srv.url, password=password, timeout=10)) as t:
            t.put("/f", io.BytesIO(b"x"))
            srv.stop()
            outage = threading.Timer(0.5, srv.start)  # the server comes back half a second later
            outage.start()
            started = time.monotonic()
            assert [e.name for e in t.list("/")] == ["f"]
            assert 0.4 < time.monotonic() - started < 5
            outage.join()
    finally:
        srv.stop()


# --------------------------------------------------------------------------- lost replies


@pytest.fixture
def faulty(tmp_path: Path, password: str) -> Iterator[tuple[EmbeddedFTPServer, ServerConfig]]:
    """A server of this test's own, whose commands the test may sabotage."""
    with EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0) as srv:
        yield srv, ServerConfig.from_url(srv.url, password=password, timeout=5)


def lose_reply(srv: EmbeddedFTPServer, command: str, *, times: int = 1, hang: bool = False) -> list[int]:
    """The first ``times`` ``command``s are executed but their reply is never sent; the server
    then drops the connection (or, with ``hang``, keeps it open and silent).  Returns a
    one-element call counter."""
    handler = srv.handler_class
    original = getattr(handler, f"ftp_{command}")
    calls = [0]

    def sabotaged(self: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] > times:
            return original(self, *args)
        self.respond = lambda *a, **k: None  # swallow this session's replies from now on
        result = original(self, *args)
        if not hang:
            self.raw_socket.shutdown(socket.SHUT_RDWR)
        return result

    setattr(handler, f"ftp_{command}", sabotaged)
    return calls


def test_rename_whose_reply_is_lost_is_outcome_unknown_and_not_repeated(
        faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "RNTO")
    with open_transport(cfg) as t:
        t.put("/a", io.BytesIO(b"x"))
        with pytest.raises(OutcomeUnknown) as err:
            t.rename("/a", "/b")
        assert err.value.may_have_happened
        assert "/a" in str(err.value) and cfg.display in str(err.value)
        assert calls == [1]
        # It did happen; the caller finds out from the server, which is reachable again.
        assert t.exists("/b") and not t.exists("/a")


def test_rename_whose_reply_never_comes_times_out_as_outcome_unknown(
        faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "RNTO", hang=True)
    with open_transport(cfg) as t:
        t.put("/a", io.BytesIO(b"x"))
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown, match="no reply"):
            t.rename("/a", "/b", timeout=1)
        assert time.monotonic() - started < 2.5
        assert calls == [1]


def test_delete_whose_reply_is_lost_is_not_repeated(faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "DELE")
    with open_transport(cfg) as t:
        t.put("/a", io.BytesIO(b"x"))
        with pytest.raises(OutcomeUnknown):
            t.delete("/a")
        assert calls == [1]
        assert not t.exists("/a")


def test_put_from_a_seekable_stream_is_repeated_after_a_lost_reply(
        faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "STOR")
    data = bytes(range(256)) * 100
    with open_transport(cfg) as t:
        assert t.put("/a", io.BytesIO(data)) == len(data)
    assert calls == [2]
    assert (srv.root / "a").read_bytes() == data


def test_put_from_a_pipe_is_not_repeated(faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "STOR")
    r, w = os.pipe()
    os.write(w, b"from a pipe")
    os.close(w)
    with open_transport(cfg) as t, open(r, "rb") as pipe, pytest.raises(OutcomeUnknown):
        t.put("/a", pipe)
    assert calls == [1]


def test_mkdir_is_repeated_after_a_lost_reply(faulty: tuple[EmbeddedFTPServer, ServerConfig]) -> None:
    srv, cfg = faulty
    calls = lose_reply(srv, "MKD")
    with open_transport(cfg) as t:
        t.mkdir("/x/y")
        assert t.stat("/x/y").is_dir
    assert calls[0] >= 2


_CLIENT = r"""
import io, sys
from ftpbc.config.servers import ServerConfig
from ftpbc.transport import open_transport

class Pattern(io.RawIOBase):
    # size bytes of a repeating pattern, generated as read: nothing is held in memory
    def __init__(self, size):
        self.left = size
        self.block = memoryview(bytes(range(256)) * 4096)
    def readable(self):
        return True
    def readinto(self, b):
        n = min(len(b), self.left, len(self.block))
        b[:n] = self.block[:n]
        self.left -= n
        return n

class Sink(io.RawIOBase):
    def __init__(self):
        self.n = 0
    def writable(self):
        return True
    def write(self, b):
        self.n += len(b)
        return len(b)

url, password, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open_transport(ServerConfig.from_url(url, password=password, timeout=60)) as t:
    sent = t.put("/big", io.BufferedReader(Pattern(size), 1 << 20))
    sink = Sink()
    got = t.get("/big", sink)
# VmHWM, not getrusage's ru_maxrss: the latter survives exec and so reports the peak of the
# (large) pytest process this one was forked from.
with open("/proc/self/status") as status:
    peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(sent, got, sink.n, peak_kib * 1024)
"""


@pytest.mark.slow
def test_one_gib_streams_through_in_constant_memory(tmp_path: Path, password: str) -> None:
    """put and get of 1 GiB in a client process whose peak RSS stays under 100 MiB."""
    with EmbeddedFTPServer(tmp_path, password=password, auth_failed_delay=0) as srv:
        result = subprocess.run([sys.executable, "-c", _CLIENT, srv.url, password, str(GIB)],
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-2000:]
        sent, got, sunk, peak_rss = (int(x) for x in result.stdout.split())
        assert sent == got == sunk == GIB
        assert (tmp_path / "big").stat().st_size == GIB
        assert peak_rss < 100 * (1 << 20), f"peak RSS {peak_rss / (1 << 20):.0f} MiB"
        (tmp_path / "big").unlink()


def test_vsftpd_lists_a_small_directory_on_the_control_connection(vsftpd_server: ServerHandle) -> None:
    # vsftpd has no MLSD: a streamed listing there is STAT -a <dir> (no data connection) while
    # the directory is small, LIST once it is not; both must give the same entries.
    d = vsftpd_server.fresh_dir()
    local = vsftpd_server.local(d)
    for i in range(3):
        (local / f"m{i}.msg").write_bytes(b"x" * i)
    with open_transport(vsftpd_server.config()) as t:
        assert isinstance(t, FTPTransport)
        seen: list[tuple[str, int]] = []
        assert t.scan(d, lambda e: seen.append((e.name, e.size)) is None)
        assert sorted(seen) == [("m0.msg", 0), ("m1.msg", 1), ("m2.msg", 2)]
        assert t.stat_lists is True
        sessions = t.pool.connects  # the session stays in step: no reconnection below
        for i in range(3, 300):
            (local / f"m{i}.msg").write_bytes(b"")
        seen.clear()
        assert t.scan(d, lambda e: seen.append((e.name, e.size)) is None)
        assert len(seen) == 300
        assert t.stat_lists is True  # a large directory goes by LIST, STAT stays for small ones
        assert t.pool.connects == sessions
