"""SFTP-only behaviour, against the real OpenSSH sshd of tests/servers/sshd.py.

What every transport must do is in the shared conformance suite; this file covers what only SFTP
has: host keys, key and password login, the rename contract without posix-rename, streaming.
"""

from __future__ import annotations

import hashlib
import io
import random
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import BinaryIO, cast

import psutil
import pytest

from ftpbc.config.servers import ServerConfig
from ftpbc.errors import (
    AuthenticationFailed,
    HostKeyRejected,
    NotFound,
    OutcomeUnknown,
    SourceGone,
    TransportError,
)
from ftpbc.transport.sftp import SFTPTransport, fingerprint
from tests.servers.handle import ServerHandle
from tests.servers.sshd import CLIENT_KEY_TYPES, SshdProcess
from tests.support import wait_until


def _host_fingerprint(sshd: SshdProcess) -> str:
    """The server key's fingerprint as OpenSSH's own ssh-keygen prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(sshd.workdir / "host_ed25519.pub")],
                         check=True, capture_output=True, text=True).stdout
    return out.split()[1]


def _put_bytes(t: SFTPTransport, path: str, data: bytes) -> None:
    t.put(path, io.BytesIO(data))


# --------------------------------------------------------------------------- host keys


def test_unknown_host_key_is_refused_before_login(sshd_server: ServerHandle, sshd_process: SshdProcess,
                                                  tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    d = sshd_server.fresh_dir()
    t = SFTPTransport(sshd_server.config(known_hosts=empty))
    with t, pytest.raises(HostKeyRejected) as err:
        _put_bytes(t, f"{d}/x", b"must not arrive")
    message = str(err.value)
    assert f"sftp://root@127.0.0.1:{sshd_process.port}" in message
    assert _host_fingerprint(sshd_process) in message
    assert not sshd_server.local(f"{d}/x").exists()
    assert empty.read_text() == "", "a refused key must not be recorded"


def test_changed_host_key_is_refused_even_with_auto_accept(sshd_server: ServerHandle,
                                                           sshd_process: SshdProcess,
                                                           tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd_process.port} {kind} {blob}\n")
    before = known.read_text()
    for auto in (False, True):
        t = SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=auto))
        with t, pytest.raises(HostKeyRejected, match="differs") as err:
            t.list("/")
        assert _host_fingerprint(sshd_process) in str(err.value)
    assert known.read_text() == before


def test_auto_accept_records_the_key_then_verifies_against_it(sshd_server: ServerHandle,
                                                              sshd_process: SshdProcess,
                                                              tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"  # neither file nor directory exists yet
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=True)) as t:
        t.list("/")
    host_kind, host_blob = (sshd_process.workdir / "host_ed25519.pub").read_text().split()[:2]
    assert known.read_text() == f"[127.0.0.1]:{sshd_process.port} {host_kind} {host_blob}\n"
    # Recorded once: strict checking now passes against it, and a second accept adds nothing.
    with SFTPTransport(sshd_server.config(known_hosts=known)) as t:
        t.list("/")
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=True)) as t:
        t.list("/")
    assert len(known.read_text().splitlines()) == 1


def test_fingerprint_matches_openssh(sshd_process: SshdProcess) -> None:
    import paramiko

    key = paramiko.PKey.from_path(sshd_process.workdir / "host_ed25519")
    assert fingerprint(key) == _host_fingerprint(sshd_process)


# --------------------------------------------------------------------------- authentication


@pytest.mark.parametrize("kind", CLIENT_KEY_TYPES)
def test_key_login(sshd_server: ServerHandle, sshd_process: SshdProcess, kind: str) -> None:
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config(key_file=sshd_process.client_keys[kind])) as t:
        _put_bytes(t, f"{d}/{kind}", kind.encode())
    assert sshd_server.local(f"{d}/{kind}").read_bytes() == kind.encode()


def test_unauthorised_key_is_refused(sshd_server: ServerHandle, sshd_process: SshdProcess,
                                     tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    t = SFTPTransport(sshd_server.config(key_file=stranger))
    with t, pytest.raises(AuthenticationFailed) as err:
        t.list("/")
    assert not isinstance(err.value, HostKeyRejected)
    assert f"sftp://root@127.0.0.1:{sshd_process.port}" in str(err.value)
    assert str(stranger) in str(err.value)


def test_password_login(sshd_password_login: ServerHandle) -> None:
    h = sshd_password_login
    name = f"/pw-{uuid.uuid4().hex[:8]}"
    with SFTPTransport(h.config()) as t:
        _put_bytes(t, name, b"by password")
        out = io.BytesIO()
        t.get(name, out)
    assert out.getvalue() == b"by password"
    assert h.local(name).stat().st_uid != 0, "the file belongs to the password user, not root"


def test_wrong_password_names_the_server_but_never_the_password(sshd_password_login: ServerHandle) -> None:
    h = sshd_password_login
    wrong = f"Wr0ng-{uuid.uuid4().hex}"
    cfg = ServerConfig.from_url(h.url, password=wrong, **h.options)
    t = SFTPTransport(cfg)
    with t, pytest.raises(AuthenticationFailed) as err:
        t.list("/")
    exc = err.value
    assert cfg.display in str(exc) and "password refused" in str(exc)
    for text in (str(exc), repr(exc), repr(exc.args), repr(t), repr(cfg), str(cfg)):
        assert wrong not in text


# --------------------------------------------------------------------------- rename contract


@pytest.mark.parametrize("posix_rename", [True, False], ids=["posix-rename", "plain-rename"])
def test_rename_replaces_an_existing_target(sshd_server: ServerHandle, posix_rename: bool) -> None:
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config()) as t:
        t.use_posix_rename = posix_rename
        _put_bytes(t, f"{d}/new", b"new content")
        _put_bytes(t, f"{d}/target", b"old content")
        t.rename(f"{d}/new", f"{d}/target")
        assert sshd_server.local(f"{d}/target").read_bytes() == b"new content"
        assert not sshd_server.local(f"{d}/new").exists()
        with pytest.raises(SourceGone):
            t.rename(f"{d}/new", f"{d}/target")
        assert sshd_server.local(f"{d}/target").read_bytes() == b"new content"
        # A missing target directory is not a lost race: NotFound, naming the target.
        with pytest.raises(NotFound) as err:
            t.rename(f"{d}/target", f"{d}/no-such-dir/target")
        assert not isinstance(err.value, SourceGone)
        assert "no-such-dir" in str(err.value)
        assert sshd_server.local(f"{d}/target").exists()


# --------------------------------------------------------------------------- streaming


class _Source:
    """``size`` pseudo-random bytes produced on demand, hashed as they go out."""

    def __init__(self, size: int, rss: _Peak) -> None:
        self.left = size
        self.rng = random.Random(size)
        self.sha = hashlib.sha256()
        self.rss = rss

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.rng.randbytes(n)
        self.left -= n
        self.sha.update(data)
        self.rss.sample()
        return data


class _Sink:
    """Hashes what is written to it and keeps nothing."""

    def __init__(self, rss: _Peak) -> None:
        self.sha = hashlib.sha256()
        self.rss = rss

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.rss.sample()
        return len(data)


class _Peak:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, self.proc.memory_info().rss)


def test_64_mib_streams_byte_exact_in_bounded_memory(sshd_server: ServerHandle) -> None:
    size = 64 << 20
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config()) as t:
        _put_bytes(t, f"{d}/warm", b"x")  # connection and buffers exist before the baseline
        baseline = psutil.Process().memory_info().rss
        rss = _Peak()
        src = _Source(size, rss)
        assert t.put(f"{d}/big", cast(BinaryIO, src)) == size
        with open(sshd_server.local(f"{d}/big"), "rb") as fh:
            assert hashlib.file_digest(fh, "sha256").digest() == src.sha.digest()
        sink = _Sink(rss)
        assert t.get(f"{d}/big", cast(BinaryIO, sink)) == size
        assert sink.sha.digest() == src.sha.digest()
    # Holding the file would cost 64 MiB; chunks and paramiko's windows cost a few.
    assert rss.peak - baseline < 32 << 20, f"RSS grew by {(rss.peak - baseline) >> 20} MiB"


# --------------------------------------------------------------------------- connections


def test_reconnects_after_the_server_drops_connections(sshd_server: ServerHandle) -> None:
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config()) as t:
        _put_bytes(t, f"{d}/a", b"1")
        assert t.connects == 1
        sshd_server.controls["drop_connections"]()
        assert [e.name for e in t.list(d)] == ["a"]
        assert t.connects == 2


def test_a_request_sent_but_never_answered_is_outcome_unknown(sshd_server: ServerHandle) -> None:
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config()) as t:
        _put_bytes(t, f"{d}/a", b"1")
        sshd_server.controls["pause_connections"]()
        try:
            started = time.monotonic()
            with pytest.raises(OutcomeUnknown) as err:
                t.rename(f"{d}/a", f"{d}/b", timeout=0.5)
            assert time.monotonic() - started < 0.5 + 1
        finally:
            sshd_server.controls["resume_connections"]()
        assert err.value.may_have_happened
        assert t.server in str(err.value) and f"{d}/a" in str(err.value)
        # The unanswered session was discarded; a fresh one sees what the server did.
        wait_until(lambda: t.exists(f"{d}/b"), what="the paused server to apply the rename")
        assert not t.exists(f"{d}/a")
        assert t.connects == 2


def test_sockets_have_nagle_disabled(sshd_server: ServerHandle) -> None:
    # With Nagle's algorithm on, the small SFTP requests wait for delayed acknowledgements:
    # large gets and listings were several times slower.
    with SFTPTransport(sshd_server.config()) as t:
        t.list("/")
        session = t._pool.acquire()  # white box: the option is invisible through the interface
        try:
            sock = session.ssh.sock
            assert isinstance(sock, socket.socket)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            t._pool.release(session)


@pytest.mark.parametrize("size", [10, 3 << 20], ids=["one-request", "pipelined"])
def test_a_failed_write_fails_the_put(sshd_server: ServerHandle, size: int) -> None:
    # /dev/full accepts open and refuses every write (ENOSPC): the last replies of a pipelined
    # put must be checked, or a truncated message would be renamed into place as complete.
    d = sshd_server.fresh_dir()
    sshd_server.local(f"{d}/full").symlink_to("/dev/full")
    with SFTPTransport(sshd_server.config()) as t:
        with pytest.raises(TransportError, match="write failed") as err:
            _put_bytes(t, f"{d}/full", b"x" * size)
        assert f"{d}/full" in str(err.value) and t.server in str(err.value)
        _put_bytes(t, f"{d}/ok", b"still usable")
        assert t.connects == 1
    assert sshd_server.local(f"{d}/ok").read_bytes() == b"still usable"


def test_rides_out_a_server_restart(sshd_server: ServerHandle) -> None:
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config()) as t:
        _put_bytes(t, f"{d}/a", b"before")
        sshd_server.controls["restart"]()
        assert [e.name for e in t.list(d)] == ["a"]
        _put_bytes(t, f"{d}/b", b"after")
        assert t.connects == 2
    assert sshd_server.local(f"{d}/b").read_bytes() == b"after"
