"""Secure defaults of what a node creates and what it is configured with.

* everything created in ``state_dir`` and the node-local sequence directory is 0600/0700,
  whatever the umask;
* YAML alias bombs are refused, quickly, with one line naming the file;
* no url error message quotes the url's password;
* ``ftpbc ftpd --tls-cert`` requires TLS on control and data, and nobody may SITE CHMOD;
* ``passive: false`` (active mode, not implemented) is refused at load, not ignored.
"""

from __future__ import annotations

import ftplib
import io
import os
import signal
import ssl
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import Heartbeat
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.loader import load_config
from ftpbc.config.servers import ServerConfig
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.errors import ConfigError
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from ftpbc.sequences import SequenceStore
from ftpbc.transport import open_transport
from ftpbc.transport.ftp import FTPTransport
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.servers.pyftpd import TLSMaterial, make_tls_material
from tests.support import free_port, ftpbc_env, popen_ftpbc, wait_until

SECRET = "hunter2"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


def _modes_under(root: Path) -> dict[str, str]:
    """``relative path: octal mode`` of every directory and file under ``root`` (and root)."""
    out = {".": oct(_mode(root))}
    for path in root.rglob("*"):
        try:
            out[str(path.relative_to(root))] = oct(_mode(path))
        except FileNotFoundError:
            pass  # a temporary file renamed meanwhile (a heartbeat being rewritten)
    return out


def _assert_private(root: Path) -> dict[str, str]:
    modes = _modes_under(root)
    expected = {name: ("0o700" if (root / name).is_dir() else "0o600") for name in modes}
    assert modes == expected
    return modes


# --------------------------------------------------------------------------- state_dir modes


def test_state_dir_locks_heartbeats_and_sequences_are_private_whatever_the_umask(
        tmp_path: Path, loose_umask: None) -> None:
    state = tmp_path / "state"          # none of these exists yet: ftpbc creates them all
    local = tmp_path / "journals" / "node-a"
    lock = PollLock(state, "quote", "file", holder="node-a", lease=30)
    with lock.attempt() as held:       # the lock file, and the holder file naming node-a
        assert held is True
    lock.close()
    Heartbeat(state, "node-a", 1.0).beat()
    store = SequenceStore(local, state)
    assert store.next("local", "quote", "0") == 0
    assert store.next("shared", "quote", "1") == 0
    assert store.next("global", None, "orders") == 0
    store.set("global", None, "orders", 10)

    state_modes = _assert_private(state)
    local_modes = _assert_private(local)
    assert _mode(tmp_path / "journals") == 0o700  # created as a missing parent
    assert {"locks/quote.lock", "locks/quote.holder", "heartbeats/node-a", "sequences/orders",
            "sequences/orders~lock"} <= set(state_modes)
    shared_dir = next(p for p in state_modes if p.startswith("endpoint-sequences/") and p.count("/") == 1)
    assert {f"{shared_dir}/sequence1", f"{shared_dir}/sequence1~lock", f"{shared_dir}/endpoint"} \
        <= set(state_modes)
    assert any(p.endswith("/sequence0") for p in local_modes)


def test_state_files_left_open_by_an_older_version_are_tightened(tmp_path: Path, loose_umask: None) -> None:
    state = tmp_path / "state"
    (state / "locks").mkdir(parents=True)
    for name in ("quote.lock", "quote.holder"):
        (state / "locks" / name).write_text("")
        (state / "locks" / name).chmod(0o644)
    (state / "locks").chmod(0o755)
    lock = PollLock(state, "quote", "file", holder="node-a", lease=30)
    with lock.attempt() as held:
        assert held is True
    lock.close()
    assert _mode(state / "locks") == 0o700
    assert _mode(state / "locks" / "quote.lock") == 0o600
    assert _mode(state / "locks" / "quote.holder") == 0o600


def _echo(message: Message) -> bytes:
    return b"re:" + message.body


def test_a_running_node_creates_nothing_readable_by_others(local_server: ServerHandle, tmp_path: Path,
                                                          loose_umask: None) -> None:
    """A node and a client that exchange a request: whatever they create in state_dir and in the
    node's journal (sequences of %0-%9 live there) is private."""
    base = local_server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", "poll_interval": 0.02, "timeout": 20}}
    node = Node(in_process_config(local_server, tmp_path, "prov", endpoints), handlers={"ep": _echo})
    client = Client(in_process_config(local_server, tmp_path, "cli", endpoints))
    try:
        node.start()
        assert client.request("ep", b"ping") == b"re:ping"
        sequences = node.runtime.coordination.sequences
        sequences.next("local", "ep", "3")
        sequences.next("shared", "ep", "4")
        sequences.next("global", None, "invoices")
        state_modes = _assert_private(tmp_path / "state")
        assert "heartbeats/prov" in state_modes
        assert any(p.startswith("locks/") for p in state_modes)
        _assert_private(tmp_path / "journals")
    finally:
        client.close()
        node.stop(drain_timeout=5)


# --------------------------------------------------------------------------- YAML alias bombs

BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
servers: *i
endpoints: {}
"""


def test_a_billion_laughs_file_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert "aliases expand" in message and "\n" not in message


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("servers: &s {p: [*s]}\nendpoints: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:1: ")
    assert "recursive YAML alias" in str(err.value)


def test_ordinary_anchors_and_merge_keys_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        "servers: {p: {url: 'file:///srv/x'}}\n"
        "endpoints:\n"
        "  a: &a {poll_interval: 0.5, timeout: 7, server: p, repository: /a}\n"
        "  b: {<<: *a, repository: /b}\n"
        "  c: {<<: *a, repository: /c}\n", encoding="utf-8")
    config = load_config(path)
    assert config.endpoints["c"].timeout == 7


# --------------------------------------------------------------------------- passwords in url errors


def _load(tmp_path: Path, servers: Any) -> ConfigError:
    path = tmp_path / "ftpbc.yaml"
    path.write_text(yaml.safe_dump({"servers": servers, "endpoints": {}}, allow_unicode=True),
                    encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return err.value


@pytest.mark.parametrize(("url", "says"), [
    ("fpt://app:hunter2@host/", "unknown URL scheme 'fpt' in 'fpt://app:***@host/'"),
    ("ftp://app:hunter2@host/", "the url 'ftp://app:***@host/' carries a password"),
    ("file://app:hunter2@host/x", "the url 'file://app:***@host/x' carries a password"),
    ("app:hunter2@host/q", "unknown URL scheme 'app' in 'app:***@host/q'"),
    # unencoded '/' in the password: urlsplit sees no password, only a bad port
    ("ftp://app:hunter2/x@host/q", "url 'ftp://app:***@host/q': bad port"),
    # urlsplit refuses these itself, its own message quoting the netloc
    ("ftp://app:hunter2\uff20evil@host/", "url 'ftp://app:***@host/' is not a valid URL"),
    ("ftp://app:hunter2@[::1/", "url 'ftp://app:***@[::1/' is not a valid URL"),
])
def test_no_url_error_quotes_the_password(tmp_path: Path, url: str, says: str) -> None:
    err = _load(tmp_path, {"p": {"url": url}})
    message = str(err)
    assert SECRET not in message
    assert says in message, message
    assert "\n" not in message and "servers.p" in message


def test_a_server_given_as_a_bare_url_is_not_quoted_with_its_password(tmp_path: Path) -> None:
    message = str(_load(tmp_path, {"p": "fpt://app:hunter2@host/"}))
    assert SECRET not in message
    assert "expected a mapping, got 'fpt://app:***@host/'" in message


def test_validation_errors_raised_in_code_do_not_quote_the_input() -> None:
    with pytest.raises(ValidationError) as err:
        ServerConfig.from_url("fpt://app:hunter2@host/")
    assert SECRET not in str(err.value)
    assert "fpt://app:***@host/" in str(err.value)


def test_a_config_changed_in_code_to_an_unknown_scheme_is_refused_by_display() -> None:
    cfg = ServerConfig.from_url("ftp://app@host/", password=SECRET).model_copy(update={"scheme": "fpt"})
    with pytest.raises(ConfigError) as err:
        open_transport(cfg)
    assert SECRET not in str(err.value)
    assert "unknown URL scheme 'fpt' for fpt://app@host:21" in str(err.value)


# --------------------------------------------------------------------------- passive: false


def test_passive_false_is_refused_at_load_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ftpbc.yaml"
    path.write_text("servers:\n  p:\n    url: ftp://app@127.0.0.1/\n    passive: false\nendpoints: {}\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:4: servers.p.passive: active mode is not supported")
    assert "\n" not in str(err.value)
    path.write_text("servers:\n  p:\n    url: ftp://app@127.0.0.1/\n    passive: true\nendpoints: {}\n",
                    encoding="utf-8")
    assert load_config(path).servers["p"].passive is True


def test_the_ftp_transport_refuses_passive_false_set_in_code() -> None:
    cfg = ServerConfig.from_url("ftp://app@127.0.0.1/", password=SECRET).model_copy(
        update={"passive": False})
    with pytest.raises(ConfigError) as err:
        FTPTransport(cfg)
    assert "active mode is not supported" in str(err.value)


# --------------------------------------------------------------------------- ftpbc ftpd --tls-cert


@pytest.fixture
def ftpd_tls(tmp_path: Path) -> Iterator[tuple[int, TLSMaterial, Path]]:
    """``ftpbc ftpd --tls-cert`` on loopback (port, TLS material, served root); stopped after."""
    tls = make_tls_material(tmp_path / "tls")
    port = free_port()
    root = tmp_path / "root"
    log = tmp_path / "ftpd.log"
    proc: subprocess.Popen[bytes] = popen_ftpbc(
        "ftpd", "--root", str(root), "--port", str(port), "--user", f"alice:{SECRET}",
        "--tls-cert", str(tls.cert_file), "--tls-key", str(tls.key_file), log=log, env=ftpbc_env())
    try:
        wait_until(lambda: "serving" in log.read_text() or proc.poll() is not None, timeout=20,
                   what="ftpbc ftpd to listen")
        assert proc.poll() is None, log.read_text()
        yield port, tls, root
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tls_login(port: int, tls: TLSMaterial) -> ftplib.FTP_TLS:
    ftp = ftplib.FTP_TLS(context=ssl.create_default_context(cafile=str(tls.ca_file)), timeout=10)
    ftp.connect("127.0.0.1", port)
    ftp.login("alice", SECRET)  # AUTH TLS first (ftplib's FTP_TLS.login does it)
    return ftp


def test_ftpd_with_a_certificate_refuses_a_clear_text_login(ftpd_tls: tuple[int, TLSMaterial, Path]) -> None:
    port, _tls, _root = ftpd_tls
    ftp = ftplib.FTP(timeout=10)
    try:
        ftp.connect("127.0.0.1", port)
        with pytest.raises(ftplib.error_perm, match=r"^550 SSL/TLS required on the control channel"):
            ftp.login("alice", SECRET)  # refused at USER: PASS is never sent
    finally:
        ftp.close()


def test_ftpd_with_a_certificate_refuses_clear_text_data(ftpd_tls: tuple[int, TLSMaterial, Path]) -> None:
    port, tls, root = ftpd_tls
    ftp = _tls_login(port, tls)
    try:
        for command in ("PASV", "EPSV"):  # before PROT P: the data would go in clear
            with pytest.raises(ftplib.error_perm, match=r"^550 SSL/TLS required on the data channel"):
                ftp.sendcmd(command)
        ftp.prot_p()
        ftp.storbinary("STOR x", io.BytesIO(b"over tls"))  # with PROT P the same session transfers
    finally:
        ftp.close()
    assert (root / "x").read_bytes() == b"over tls"


def test_ftpd_refuses_site_chmod(ftpd_tls: tuple[int, TLSMaterial, Path]) -> None:
    port, tls, root = ftpd_tls
    before = _mode(root)
    ftp = _tls_login(port, tls)
    try:
        ftp.prot_p()
        ftp.mkd("/d")
        with pytest.raises(ftplib.error_perm, match=r"^550"):
            ftp.sendcmd("SITE CHMOD 777 /")
        with pytest.raises(ftplib.error_perm, match=r"^550"):
            ftp.sendcmd("SITE CHMOD 777 /d")
    finally:
        ftp.close()
    assert _mode(root) == before
    assert _mode(root / "d") != 0o777


def test_the_plain_embedded_server_refuses_site_chmod_too(tmp_path: Path) -> None:
    with EmbeddedFTPServer(tmp_path, user="alice", password=SECRET, auth_failed_delay=0) as srv:
        ftp = ftplib.FTP(timeout=10)
        try:
            ftp.connect("127.0.0.1", srv.port)
            ftp.login("alice", SECRET)
            with pytest.raises(ftplib.error_perm, match=r"^550"):
                ftp.sendcmd("SITE CHMOD 777 /")
        finally:
            ftp.close()
    assert _mode(tmp_path) != 0o777
