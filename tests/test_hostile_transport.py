"""Hostile servers, hostile partners, careless configurations.

* a shared ``file://`` repository where someone plants symlinks, fifos or files at predictable
  names (the transport must never follow or open them);
* TLS settings on a plain ``ftp://`` URL (refused at load: a password never goes out in clear
  because of a typo in the scheme);
* FTP servers that trickle their replies or data, or send endless replies (every operation is
  bounded in time and memory), and the same for SFTP replies and transfers;
* journals holding message bodies (private to the node's user).

Every server started here is on loopback and is stopped by the test that started it.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import stat
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import paramiko
import pytest

from ftpbc.client import Client
from ftpbc.config.loader import parse_config
from ftpbc.config.models import Config
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import (
    ConfigError,
    ConnectFailed,
    NotFound,
    OutcomeUnknown,
    ProtocolError,
    RemoteHandlerError,
    SourceGone,
    TransportError,
    TransportTimeout,
    UnsafeEntry,
)
from ftpbc.exchange import area as area_module
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.journal import Journal
from ftpbc.journal import store as store_module
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from ftpbc.transport import open_transport
from ftpbc.transport.local import LocalTransport
from tests.servers.handle import ServerHandle
from tests.servers.hostile import HostileFTPServer, HostileSFTPServer, RecordingProxy
from tests.servers.pyftpd import TLSMaterial
from tests.support import wait_until

SECRET = b"machine partner login app password hunter2\n"

# --------------------------------------------------------------------------- journal file modes


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_journal_directories_are_0700_and_files_0600(tmp_path: Path, loose_umask: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_EVERY", 2)
    journal_dir = tmp_path / "journals"
    j = Journal(journal_dir, "node-a")
    try:
        ep = j.endpoint("quote")
        ep.record("keep", "send", durable=True, stage="/q/instage/x")  # stays pending
        big = ep.save_result("u1.serve", b"4111 1111 1111 1111 " * 5000)  # a side file
        ep.record("u1.serve", "served", durable=True, **big)
        for i in range(4):  # enough ended operations to compact (rewrite through a temp file)
            ep.record(f"o{i}", "send", stage="/q/instage/y")
            ep.end(f"o{i}")
        node = journal_dir / "node-a"
        assert _mode(journal_dir) == 0o700
        assert _mode(node) == 0o700
        assert _mode(node / "results") == 0o700
        files = [p for p in node.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"registry", ".lock", ep.path.name, big["body_file"]}
        assert {p.name: oct(_mode(p)) for p in files} == {p.name: "0o600" for p in files}
    finally:
        j.close()


def test_an_existing_world_readable_journal_is_tightened_when_opened(tmp_path: Path,
                                                                     loose_umask: None) -> None:
    j = Journal(tmp_path, "node-a")
    ep = j.endpoint("quote")
    ep.record("keep", "send", durable=True, stage="/q/instage/x")
    ep.save_result("big.serve", b"x" * (store_module.INLINE_RESULT_LIMIT + 1))
    j.close()
    node = tmp_path / "node-a"
    # as an older version left them: the umask's modes
    for p in node.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    node.chmod(0o755)

    j = Journal(tmp_path, "node-a")
    try:
        assert _mode(node) == 0o700
        assert _mode(node / "results") == 0o700
        for p in node.rglob("*"):
            if p.is_file():
                assert _mode(p) == 0o600, p
    finally:
        j.close()


# --------------------------------------------------------------------------- planted entries in file://


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[LocalTransport, Path, Path]]:
    """A repository under a file:// transport, and a private 0600 file of this user outside it."""
    repo = tmp_path / "repo"
    for box in ("inbox", "instage", "inselect"):
        (repo / "ex" / box).mkdir(parents=True)
    secret = tmp_path / "home" / ".netrc"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    t = LocalTransport(repo, durable=False)
    yield t, repo, secret
    t.close()


def test_a_link_planted_in_an_inbox_is_neither_listed_nor_read(
        shared: tuple[LocalTransport, Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    t, repo, secret = shared
    (repo / "ex/inbox/req.1").write_bytes(b"a real request")
    (repo / "ex/inbox/req.2").symlink_to(secret)

    assert [e.name for e in t.list("/ex/inbox")] == ["req.1"]
    assert "req.2" in caplog.text and "symbolic link" in caplog.text

    out = io.BytesIO()
    with pytest.raises(UnsafeEntry, match="symbolic link") as err:
        t.get("/ex/inbox/req.2", out)
    assert isinstance(err.value, NotFound)  # callers that skip a vanished file skip this one
    assert out.getvalue() == b""
    with pytest.raises(UnsafeEntry):
        t.stat("/ex/inbox/req.2")
    assert not t.exists("/ex/inbox/req.2")
    # a claim of it is refused like a lost claim race (the lifecycle skips it quietly) ...
    with pytest.raises(SourceGone):
        t.rename("/ex/inbox/req.2", "/ex/inselect/req.2~node-a")
    assert (repo / "ex/inbox/req.2").is_symlink()
    assert not os.path.lexists(repo / "ex/inselect/req.2~node-a")
    with pytest.raises(UnsafeEntry):
        t.delete("/ex/inbox/req.2")
    # ... and the real request next to it is served as usual
    t.rename("/ex/inbox/req.1", "/ex/inselect/req.1~node-a")
    out = io.BytesIO()
    t.get("/ex/inselect/req.1~node-a", out)
    assert out.getvalue() == b"a real request"
    assert secret.read_bytes() == SECRET


def test_a_claim_swapped_for_a_link_after_it_was_claimed_is_not_read(
        shared: tuple[LocalTransport, Path, Path]) -> None:
    t, repo, secret = shared
    claim = repo / "ex/inselect/req.3~node-a"
    claim.symlink_to(secret)
    out = io.BytesIO()
    with pytest.raises(UnsafeEntry):
        t.get("/ex/inselect/req.3~node-a", out)
    assert out.getvalue() == b""


def test_a_linked_directory_in_the_repository_is_not_followed(
        shared: tuple[LocalTransport, Path, Path]) -> None:
    t, repo, secret = shared
    elsewhere = secret.parent  # holds .netrc
    (repo / "ex/outbox").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(UnsafeEntry, match="/ex/outbox is a symbolic link"):
        t.list("/ex/outbox")
    with pytest.raises(UnsafeEntry):
        t.get("/ex/outbox/.netrc", io.BytesIO())
    with pytest.raises(UnsafeEntry):
        t.put("/ex/outbox/resp.1", io.BytesIO(b"response"))
    with pytest.raises(UnsafeEntry):
        t.mkdir("/ex/outbox/sub")
    with pytest.raises(SourceGone):
        t.rename("/ex/outbox/.netrc", "/ex/inbox/req.4")
    with pytest.raises(NotFound):
        t.rename("/ex/inbox/missing", "/ex/outbox/x")
    assert sorted(p.name for p in elsewhere.iterdir()) == [".netrc"]
    assert secret.read_bytes() == SECRET


def test_put_replaces_a_link_planted_at_the_stage_name_without_writing_through_it(
        shared: tuple[LocalTransport, Path, Path]) -> None:
    t, repo, secret = shared
    stage = repo / "ex/instage/req.5~node-a"
    stage.symlink_to(secret)  # the stage name is predictable: <uuid>~<node>
    hard = repo / "ex/instage/req.6~node-a"
    os.link(secret, hard)  # a hard link to a file outside: writing into it would change .netrc

    assert t.put("/ex/instage/req.5~node-a", io.BytesIO(b"request body")) == 12
    assert t.put("/ex/instage/req.6~node-a", io.BytesIO(b"other body")) == 10

    assert secret.read_bytes() == SECRET
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not stage.is_symlink() and stage.read_bytes() == b"request body"
    assert hard.read_bytes() == b"other body" and hard.stat().st_ino != secret.stat().st_ino
    # no temporary file is left behind
    assert sorted(p.name for p in stage.parent.iterdir()) == ["req.5~node-a", "req.6~node-a"]


def test_a_fifo_in_an_inbox_blocks_neither_listing_nor_reading(
        shared: tuple[LocalTransport, Path, Path]) -> None:
    t, repo, _ = shared
    fifo = repo / "ex/inbox/req.7"
    os.mkfifo(fifo)
    (repo / "ex/inbox/req.8").write_bytes(b"x")
    result: dict[str, object] = {}

    def reader() -> None:
        try:
            result["listed"] = sorted(e.name for e in t.list("/ex/inbox"))
            t.get("/ex/inbox/req.7", io.BytesIO())
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(5.0)
    if thread.is_alive():
        # Unblock the reader stuck in open(): a writer end lets the open return (at EOF).
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5.0)
        pytest.fail("reading a fifo in the inbox blocked")
    assert result["listed"] == ["req.8"]
    assert isinstance(result.get("error"), UnsafeEntry), result
    assert "fifo" in str(result["error"])


# --------------------------------------------------------------------------- TLS settings on ftp://


@pytest.mark.parametrize(("url", "setting"), [
    ("ftp://app@127.0.0.1:2121", "tls: explicit"),
    ("ftp://app@127.0.0.1:2121", "ca_file: /etc/ftpbc/ca.pem"),
    ("ftp://app@127.0.0.1:2121", "verify_tls: true"),
    ("sftp://app@127.0.0.1:2222", "ca_file: /etc/ftpbc/ca.pem"),
    ("file:///srv/exchange", "tls: implicit"),
])
def test_tls_settings_on_a_url_without_tls_are_refused_at_load(url: str, setting: str) -> None:
    text = f"servers:\n  partner:\n    url: {url}\n    {setting}\nendpoints: {{}}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="ftpbc.yaml")
    key = setting.split(":")[0]
    message = str(err.value)
    assert message.startswith(f"ftpbc.yaml:4: servers.partner.{key}: a TLS setting"), message
    assert "\n" not in message
    if url.startswith("ftp:"):
        assert "clear text" in message and "ftps://" in message


def test_with_tls_configured_no_login_goes_out_in_clear(pyftpdlib_ftps_server: ServerHandle) -> None:
    server = pyftpdlib_ftps_server
    assert server.password
    upstream = ("127.0.0.1", int(server.url.rstrip("/").rsplit(":", 1)[1]))
    ca_file = server.options["ca_file"]
    with RecordingProxy(upstream) as proxy:
        # ftps:// as configured: AUTH TLS is the very first thing sent, and nothing after it is
        # readable on the wire (USER, PASS and the password travel inside TLS).
        cfg = ServerConfig.from_url(f"ftps://ftpbc@127.0.0.1:{proxy.port}/", password=server.password,
                                    ca_file=ca_file, timeout=10)
        with open_transport(cfg) as t:
            t.list("/")
        wire = proxy.client_bytes()
        assert wire.startswith(b"AUTH TLS\r\n"), wire[:40]
        assert b"USER" not in wire and b"PASS" not in wire
        assert server.password.encode() not in wire

        # ftp:// with TLS settings (a scheme typed wrong): refused before a byte is sent, both
        # from a configuration and from a config changed in code past validation.
        refused = []
        careless: list[Callable[[], ServerConfig]] = [
            lambda: ServerConfig.from_url(f"ftp://ftpbc@127.0.0.1:{proxy.port}/", password=server.password,
                                          tls="explicit", ca_file=ca_file, timeout=10),
            lambda: ServerConfig.from_url(f"ftp://ftpbc@127.0.0.1:{proxy.port}/", password=server.password,
                                          timeout=10).model_copy(update={"ca_file": ca_file}),
        ]
        for make in careless:
            with proxy.lock:
                proxy.sent.clear()
            try:
                with open_transport(make()) as t:
                    t.list("/")
            except (ConfigError, ValueError) as exc:
                refused.append(str(exc))
            wire = proxy.client_bytes()
            assert b"USER" not in wire and server.password.encode() not in wire, "login sent in clear"
        assert len(refused) == 2 and all("TLS setting" in r for r in refused), refused


# --------------------------------------------------------------------------- hostile FTP servers


def _attempt(op: Callable[[], Any], server: HostileFTPServer,
             limit: float) -> tuple[BaseException | None, float]:
    """Run ``op`` on a thread; its exception (None if it returned) and how long it took.

    If it is still running after ``limit`` seconds the server is stopped (closing its sockets
    frees the client) and the test fails: the operation was not bounded.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            op()
        except BaseException as exc:
            box["error"] = exc
        box["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        server.stop()
        thread.join(10)
        pytest.fail(f"still running after {limit:g} s: the operation is not bounded")
    return box.get("error"), box["elapsed"]


#: allowance for scheduling on a loaded machine, on top of the bound under test
MARGIN = 2.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["welcome", "feat"])
def test_a_trickled_login_fails_within_the_timeout(behaviour: str) -> None:
    """A greeting or a FEAT reply sent a byte (a line) at a time, each well within the socket
    timeout: connecting must still end within ``timeout``."""
    with HostileFTPServer(behaviour, interval=0.2) as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=1.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.list("/"), server, limit=1.0 + 10)
    assert isinstance(error, ConnectFailed), repr(error)
    assert "timed out while connecting" in str(error)
    assert elapsed < 1.0 + MARGIN


@pytest.mark.timeout(60)
def test_an_endless_multiline_reply_is_refused_at_64_kib() -> None:
    with HostileFTPServer("feat_flood") as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=5.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.list("/"), server, limit=5.0 + 10)
    assert isinstance(error, ProtocolError), repr(error)
    assert "longer than 65536 bytes" in str(error)
    assert elapsed < 5.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["dele", "dele_silent"])
def test_a_reply_to_a_command_trickled_or_never_sent_is_outcome_unknown_within_the_timeout(
        behaviour: str) -> None:
    # "dele": the reply trickles in, so its deadline is kept across reads; "dele_silent": not a
    # byte of it comes, so the reply's first read times out.
    with HostileFTPServer(behaviour, interval=0.2) as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=1.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.delete("/x"), server, limit=1.0 + 10)
    assert isinstance(error, OutcomeUnknown), repr(error)  # DELE was sent: it may have happened
    assert "no reply within 1 s" in str(error)
    assert elapsed < 1.0 + MARGIN
    assert [c for c in server.commands if c.startswith("DELE")] == ["DELE /x"]  # not repeated


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["get", "list"])
def test_a_trickled_transfer_fails_below_the_minimum_rate(operation: str) -> None:
    """RETR (or LIST) data at 5 bytes/s, each byte well within the socket timeout: the transfer
    fails once a whole window went by below min_transfer_rate."""
    with HostileFTPServer("retr", interval=0.2) as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=5.0, min_transfer_rate=1024,
                                    min_rate_window=1.0)
        with open_transport(cfg) as t:
            if operation == "get":
                error, elapsed = _attempt(lambda: t.get("/big", io.BytesIO()), server, limit=1.0 + 10)
            else:
                error, elapsed = _attempt(lambda: t.list("/"), server, limit=1.0 + 10)
    assert isinstance(error, TransportTimeout), repr(error)  # a read: nothing changed on the server
    assert "slower than 1024 bytes/s over 1 s" in str(error)
    assert elapsed < 1.0 + MARGIN


# --------------------------------------------------------------------------- hostile SFTP servers


@pytest.fixture(scope="module")
def host_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _sftp_config(server: HostileSFTPServer, tmp_path: Path, **options: Any) -> ServerConfig:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(server.known_hosts_line())
    return ServerConfig.from_url(server.url, password="pw", known_hosts=known_hosts, **options)


class _Sink(io.RawIOBase):
    """A stream that cannot be rewound (so a failed get is not repeated)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["subsystem", "version"])
def test_an_sftp_server_stalling_after_login_fails_the_connect_within_the_timeout(
        behaviour: str, host_key: paramiko.PKey, tmp_path: Path) -> None:
    """No answer to the subsystem request (paramiko waits for it without a limit), or the SFTP
    version packet trickled a byte at a time: connecting still ends within ``timeout``."""
    with HostileSFTPServer(behaviour, host_key, interval=0.2) as server:
        cfg = _sftp_config(server, tmp_path, timeout=2.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.list("/"), server, limit=2.0 + 10)
    assert isinstance(error, ConnectFailed), repr(error)
    assert "timed out while connecting" in str(error)
    assert elapsed < 2.0 + MARGIN


@pytest.mark.timeout(60)
def test_a_trickled_sftp_read_fails_below_the_minimum_rate(host_key: paramiko.PKey,
                                                           tmp_path: Path) -> None:
    with HostileSFTPServer("read", host_key, interval=0.2) as server:
        cfg = _sftp_config(server, tmp_path, timeout=5.0, min_transfer_rate=1024, min_rate_window=1.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.get("/big", _Sink()), server, limit=5.0 + 10)
    assert isinstance(error, OutcomeUnknown | TransportTimeout), repr(error)
    assert "slower than 1024 bytes/s over 1 s" in str(error)
    assert elapsed < 1.0 + 2.0 + MARGIN  # the window, after connecting (the ssh handshake)


@pytest.mark.timeout(60)
def test_clear_text_sent_after_the_auth_tls_reply_is_refused(tls_material: TLSMaterial) -> None:
    """A man in the middle appends "230 logged in" to the server's 234: read later, it would pass
    for a reply that came through TLS, and the login would skip PASS."""
    with HostileFTPServer("auth_inject", tls=(tls_material.cert_file, tls_material.key_file)) as server:
        cfg = ServerConfig.from_url(server.url.replace("ftp://", "ftps://"), password="pw",
                                    ca_file=tls_material.ca_file, timeout=5.0)
        with open_transport(cfg) as t:
            error, _ = _attempt(lambda: t.list("/"), server, limit=5.0 + 10)
    assert isinstance(error, ProtocolError), repr(error)
    assert "after its reply to AUTH TLS" in str(error)
    assert server.commands == ["AUTH TLS"]


# --------------------------------------------------------------------------- refused entries, whole nodes

#: a request id and a time stamp fixed by the tests below, so that every name a node will use
#: is known beforehand, as a partner watching the repository would learn it
FIXED_UUID = "0b7e8a64-5c1a-4d2e-9f3b-aa0000000001"
FAILING_UUID = "0b7e8a64-5c1a-4d2e-9f3b-aa0000000002"
FIXED_STAMP = "20260101T000000.000Z"


def _repository_config(tmp_path: Path, node_id: str) -> Config:
    return Config.model_validate({
        "node": {"id": node_id, "state_dir": str(tmp_path / "state"),
                 "journal_dir": str(tmp_path / "journals")},
        "servers": {"files": {"url": f"file://{tmp_path / 'exchange'}"}},
        "endpoints": {"ep": {"server": "files", "repository": "/ep", "poll_interval": 0.02,
                             "timeout": 20}},
    })


class _Outside:
    """Files of the node's user outside the repository, and what they were: a test ends by
    checking that none was written, replaced or added to, and that no byte of them went out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.secret = root / "home" / ".netrc"
        self.secret.parent.mkdir(parents=True)
        self.secret.write_bytes(SECRET)
        self.secret.chmod(0o600)
        self.dir = root / "home" / "ssh"
        self.dir.mkdir()
        (self.dir / "id_ed25519").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY----- partner-must-not-see\n")
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple[bool, bytes, int, int]]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                st = p.lstat()
                body = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
                out[str(p.relative_to(self.root))] = (stat.S_ISDIR(st.st_mode), body, st.st_mtime_ns,
                                                      stat.S_IMODE(st.st_mode))
        return out

    def assert_untouched(self, repository: Path, *answers: bytes) -> None:
        assert self.snapshot() == self.before  # same files, contents, times and modes; none new
        secrets_ = [SECRET.strip(), b"partner-must-not-see"]
        for answer in answers:
            assert not any(s in answer for s in secrets_), answer
        for dirpath, _, filenames in os.walk(repository):
            for name in filenames:
                p = Path(dirpath, name)
                if p.is_symlink() or not p.is_file():
                    continue
                body = p.read_bytes()
                assert not any(s in body for s in secrets_), p


def _plant_link(path: Path, to: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(to, target_is_directory=to.is_dir())


def _echo_or_fail(message: Message) -> bytes:
    if message.uuid == FAILING_UUID:
        raise ValueError("handler failed on purpose")
    return b"re:" + message.body


@pytest.fixture
def fixed_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Request UUIDs taken from a list (FIXED_UUID, then FAILING_UUID), and every archive and
    error name stamped FIXED_STAMP, so the tests can plant links at the exact names."""
    uuids = [FIXED_UUID, FAILING_UUID]
    monkeypatch.setattr("ftpbc.exchange.runtime.uuidlib", SimpleNamespace(
        uuid4=lambda: uuidlib.UUID(uuids.pop(0)) if uuids else uuidlib.uuid4()))
    monkeypatch.setattr(area_module, "stamp", lambda when: FIXED_STAMP)
    yield uuids


def test_links_at_every_predictable_name_are_never_followed_by_a_node_or_a_client(
        tmp_path: Path, fixed_names: list[str], started: list[Any]) -> None:
    """Links (to a private file, to a private directory), a fifo, a socket and a hard link
    planted at every name a node or a client will use for a request that is served and for one
    whose handler fails: both round trips finish, every planted entry in a box is filed in the
    error directory, and nothing outside the repository is read, written or added to."""
    outside = _Outside(tmp_path / "outside")
    repo = tmp_path / "exchange"
    ep = repo / "ep"
    secret, private_dir = outside.secret, outside.dir
    u, f = FIXED_UUID, FAILING_UUID
    # Decoys in the inbox: never read, filed in inerror.
    _plant_link(ep / "inbox" / "req.0b7e8a64-5c1a-4d2e-9f3b-aa00000000aa", secret)
    _plant_link(ep / "inbox" / "req.0b7e8a64-5c1a-4d2e-9f3b-aa00000000ab", private_dir)
    os.mkfifo(ep / "inbox" / "req.0b7e8a64-5c1a-4d2e-9f3b-aa00000000ac")
    (ep / "inbox" / "req.0b7e8a64-5c1a-4d2e-9f3b-aa00000000ad").mkdir()
    # Every name the two requests will take on their way.
    planted = [f"instage/req.{u}~cli",
               f"outbox/resp.{u}", f"outselect/resp.{u}~cli", f"inarchive/req.{u}~node-a~{FIXED_STAMP}",
               f"outarchive/resp.{u}~cli~{FIXED_STAMP}",
               f"instage/req.{f}~cli", f"inselect/req.{f}~node-a",
               f"inerror/req.{f}~node-a~{FIXED_STAMP}", f"inerror/req.{f}~node-a~{FIXED_STAMP}.reason",
               f"outbox/resp.{f}.error", f"outselect/resp.{f}.error~cli",
               f"outarchive/resp.{f}.error~cli~{FIXED_STAMP}"]
    for name in planted:
        _plant_link(ep / name, secret)
    # a link to a directory at the claim name (a rename replaces the link, never fills the
    # directory), and a hard link to .netrc at a stage name (a put replaces it, never writes it;
    # a staged reply's name carries its size, here that of b"re:hello")
    _plant_link(ep / f"inselect/req.{u}~node-a", private_dir)
    (ep / "outstage").mkdir(exist_ok=True)
    os.link(secret, ep / f"outstage/resp.{u}~node-a=8")

    node = Node(_repository_config(tmp_path, "node-a"), handlers={"ep": _echo_or_fail})
    started.append(node)
    node.start()
    client = Client(_repository_config(tmp_path, "cli"))
    started.append(client)

    assert client.request("ep", b"hello", timeout=20) == b"re:hello"
    with pytest.raises(RemoteHandlerError) as failed:
        client.request("ep", b"fail", timeout=20)
    assert "ValueError" in failed.value.reason and not fixed_names

    # Every planted name was used (so the names were predicted right): each link there was
    # replaced by the node's own file, and that file moved on or stayed as the final one.
    planted += [f"inselect/req.{u}~node-a"]
    assert [n for n in planted if (ep / n).is_symlink()] == []
    assert not (ep / f"outstage/resp.{u}~node-a=8").exists()
    # The real messages went where they belong, as files, with their own contents.
    served = ep / f"inarchive/req.{u}~node-a~{FIXED_STAMP}"
    assert not served.is_symlink() and served.read_bytes() == b"hello"
    filed = ep / f"inerror/req.{f}~node-a~{FIXED_STAMP}"
    assert not filed.is_symlink() and filed.read_bytes() == b"fail"
    reason = Path(f"{filed}.reason")
    assert not reason.is_symlink() and b"ValueError" in reason.read_bytes()
    # The decoys were filed in inerror with a reason each by the listing that found the first
    # request, unopened (the links still point where they did).
    assert os.listdir(ep / "inbox") == []
    refused = {p.name: p for p in (ep / "inerror").iterdir() if "aa00000000a" in p.name}
    assert len(refused) == 8, sorted(refused)
    for p in refused.values():
        if p.name.endswith(".reason"):
            assert p.read_text().startswith("UnsafeEntry: /ep/inbox/req.")
    kinds = {p.name.split("~")[0][-2:]: p for p in refused.values() if not p.name.endswith(".reason")}
    assert kinds["aa"].is_symlink() and kinds["ab"].is_symlink()
    assert stat.S_ISFIFO(kinds["ac"].lstat().st_mode) and kinds["ad"].is_dir()

    node.stop(drain_timeout=2)
    client.close()
    outside.assert_untouched(repo, b"re:hello", failed.value.reason.encode())


def test_a_linked_repository_directory_holds_a_node_back_until_it_is_removed(
        tmp_path: Path, started: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """A directory of the exchange area replaced by a link to a private directory: the node
    does not start serving (it creates nothing, lists nothing through it), says why, and
    starts as soon as the link is gone."""
    outside = _Outside(tmp_path / "outside")
    repo = tmp_path / "exchange"
    for name in ("inarchive", "outstage", "outprotect"):
        _plant_link(repo / "ep" / name, outside.dir)
    caplog.set_level(logging.WARNING)
    node = Node(_repository_config(tmp_path, "node-a"), handlers={"ep": _echo_or_fail})
    started.append(node)
    starting = threading.Thread(target=node.start, name="node-start", daemon=True)
    starting.start()
    wait_until(lambda: "symbolic link" in caplog.text, what="the refusal in the log")
    assert starting.is_alive()  # still waiting for a repository it can use
    outside.assert_untouched(repo)

    for name in ("inarchive", "outstage", "outprotect"):
        (repo / "ep" / name).unlink()
    starting.join(30)
    assert not starting.is_alive()
    client = Client(_repository_config(tmp_path, "cli"))
    started.append(client)
    assert client.request("ep", b"after", timeout=20) == b"re:after"
    node.stop(drain_timeout=2)
    client.close()
    outside.assert_untouched(repo, b"re:after")


@pytest.fixture
def started(things: list[Any]) -> list[Any]:
    """Nodes and clients to stop at the end of a test, whatever happened (conftest's ``things``)."""
    return things


def _inbound(tmp_path: Path) -> tuple[Lifecycle, LocalTransport, Journal]:
    cfg = _repository_config(tmp_path, "node-a")
    journal = Journal(tmp_path / "journals", "node-a")
    t = LocalTransport(tmp_path / "exchange", durable=False)
    lc = Lifecycle(AreaLayout("ep", cfg.endpoint("ep"), "in"), t, journal.endpoint("ep"), "node-a")
    lc.prepare()
    return lc, t, journal


def test_entries_in_an_inbox_that_are_not_files_are_filed_as_errors_and_the_rest_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A link, a link to a directory, a fifo, a socket and a directory in an inbox go to
    inerror with a reason beside each, moved as they are (nothing is opened or followed); one
    that cannot be filed (its name holds a line break no path may carry) is reported once and
    left, and neither stops the others nor the real request beside them."""
    outside = _Outside(tmp_path / "outside")
    lc, t, journal = _inbound(tmp_path)
    inbox = tmp_path / "exchange/ep/inbox"
    try:
        good = f"req.{FIXED_UUID}"
        (inbox / good).write_bytes(b"a real request")
        (inbox / "req.link").symlink_to(outside.secret)
        (inbox / "req.dirlink").symlink_to(outside.dir, target_is_directory=True)
        (inbox / "req.dangling").symlink_to(tmp_path / "nowhere")
        os.mkfifo(inbox / "req.fifo")
        (inbox / "req.dir").mkdir()
        (inbox / "req.dir" / "inner").write_bytes(b"x")
        (inbox / "req.back\\slash").symlink_to(outside.secret)
        (inbox / "req.line\nbreak").symlink_to(outside.secret)
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(inbox / "req.sock"))
        except OSError:  # a path too long for AF_UNIX: the other kinds still make the point
            sock.close()
            sock = None  # type: ignore[assignment]
        caplog.set_level(logging.WARNING)

        found = [c.name for c in lc.waiting()]
        assert found == [good]
        assert sorted(os.listdir(inbox)) == sorted([good, "req.line\nbreak"])
        errors = sorted(os.listdir(tmp_path / "exchange/ep/inerror"))
        kinds = {"req.link": "a symbolic link", "req.dirlink": "a symbolic link",
                 "req.dangling": "a symbolic link", "req.fifo": "a fifo", "req.dir": "a directory",
                 "req.back_slash": "a symbolic link"}
        if sock is not None:
            kinds["req.sock"] = "a socket"
        assert len(errors) == 2 * len(kinds), errors
        for name, kind in kinds.items():
            [filed] = [e for e in errors if e.startswith(name + "~node-a~") and not e.endswith(".reason")]
            reason = (tmp_path / "exchange/ep/inerror" / (filed + ".reason")).read_text()
            assert reason.startswith("UnsafeEntry: /ep/inbox/req.") and kind in reason, reason
        assert (tmp_path / "exchange/ep/inerror").joinpath(
            next(e for e in errors if e.startswith("req.dir~") and not e.endswith(".reason")), "inner"
        ).read_bytes() == b"x"
        assert "cannot be filed" in caplog.text

        # Listed again: nothing more to file, the unfileable one is not reported twice.
        caplog.clear()
        assert [c.name for c in lc.waiting()] == [good]
        assert "req.line" not in caplog.text
        assert len(os.listdir(tmp_path / "exchange/ep/inerror")) == len(errors)
        outside.assert_untouched(tmp_path / "exchange")
    finally:
        t.close()
        journal.close()


def test_a_claim_replaced_by_a_link_is_filed_as_it_is_not_read(tmp_path: Path) -> None:
    """Claimed, then swapped for a link to a private file before the node reads it: the read
    is refused, and filing the claim moves the link itself to inerror, with its reason."""
    outside = _Outside(tmp_path / "outside")
    lc, t, journal = _inbound(tmp_path)
    name = f"req.{FIXED_UUID}"
    try:
        (tmp_path / "exchange/ep/inbox" / name).write_bytes(b"a real request")
        [claimed], lost = lc.claim(lc.waiting(), "serve")
        assert lost == 0 and claimed.path == f"/ep/inselect/{name}~node-a"
        claim = tmp_path / "exchange/ep/inselect" / f"{name}~node-a"
        claim.unlink()
        claim.symlink_to(outside.secret)
        sink = io.BytesIO()
        with pytest.raises(UnsafeEntry) as refused:
            lc.read(claimed, sink)
        assert sink.getvalue() == b""

        outcome = lc.file_error(claimed, f"UnsafeEntry: {refused.value}", refused=True)
        assert outcome.startswith("filed in /ep/inerror")
        [filed] = [p for p in (tmp_path / "exchange/ep/inerror").iterdir() if not p.name.endswith(".reason")]
        assert filed.is_symlink() and filed.name.startswith(f"{name}~node-a~")
        assert "symbolic link" in Path(f"{filed}.reason").read_text()
        assert not os.path.lexists(claim)
        outside.assert_untouched(tmp_path / "exchange")
    finally:
        t.close()
        journal.close()


@pytest.mark.timeout(60)
def test_a_refused_data_connection_fails_a_put_without_waiting_for_a_reply() -> None:
    """A small put writes its body before the server's 150 (one round trip less); when the data
    connection itself is refused, STOR never went out and no reply is coming: the put must fail
    at once, not wait out the reply timeout for it."""
    with HostileFTPServer("closed_pasv") as server:
        cfg = ServerConfig.from_url(server.url, password="pw", timeout=5.0)
        with open_transport(cfg) as t:
            error, elapsed = _attempt(lambda: t.put("/x", io.BytesIO(b"small body")), server, limit=5.0 + 10)
    assert isinstance(error, TransportError) and not isinstance(error, OutcomeUnknown), repr(error)
    assert elapsed < 5.0  # less than one reply timeout
    assert not [c for c in server.commands if c.startswith("STOR")]
