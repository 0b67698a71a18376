"""Trust changes are loud.

* ``verify_tls: false`` is logged at WARNING once per server, naming it, never the password;
* ``auto_accept_host_keys`` logs each key it learns (host, type, SHA256 fingerprint) and never
  learns a new key type for a host known_hosts already lists;
* a ``password_file`` or ``key_file`` group or others may read or write is refused, unless
  ``allow_insecure_secret_files`` says otherwise;
* known_hosts ``@revoked`` and ``@cert-authority`` lines are understood.

Against the real OpenSSH sshd and pyftpdlib FTPS servers of tests/servers/, on loopback.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from ftpbc.config.loader import parse_config
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError, HostKeyRejected, HostKeyRevoked
from ftpbc.transport.ftp import FTPTransport
from ftpbc.transport.knownhosts import host_matches, parse_line
from ftpbc.transport.sftp import SFTPTransport
from tests.servers.handle import ServerHandle
from tests.servers.sshd import SshdProcess


def _ssh_fingerprint(pub: Path) -> str:
    """A public key's fingerprint as OpenSSH's ssh-keygen prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1]


def _host_key(sshd: SshdProcess) -> tuple[str, str]:
    """The sshd's host key as (type, base64)."""
    kind, blob = (sshd.workdir / "host_ed25519.pub").read_text().split()[:2]
    return kind, blob


def _other_key(tmp_path: Path, kind: str, name: str) -> tuple[str, str]:
    """A freshly generated public key the server does not have, as (type, base64)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL)
    key_type, blob = path.with_suffix(".pub").read_text().split()[:2]
    return key_type, blob


def _entry(sshd: SshdProcess) -> str:
    return f"[127.0.0.1]:{sshd.port}"


# --------------------------------------------------------------------------- verify_tls: false


def test_verify_tls_false_warns_once_per_server_naming_it_never_the_password(
        pyftpdlib_ftps_server: ServerHandle, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ftpbc.ftp")
    handle = pyftpdlib_ftps_server
    cfg = handle.config(name="partner", verify_tls=False)
    with FTPTransport(cfg) as t:
        t.list("/")
        handle.controls["drop_connections"]()
        t.list("/")  # a second connection: the warning is about the server, not each connection
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "verify_tls" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert cfg.display in message and "partner" in message
    assert handle.password and handle.password not in message
    assert "\n" not in message


def test_verified_tls_does_not_warn(pyftpdlib_ftps_server: ServerHandle,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ftpbc.ftp")
    with FTPTransport(pyftpdlib_ftps_server.config()) as t:
        t.list("/")
    assert not [r for r in caplog.records if "verify_tls" in r.getMessage()]


# --------------------------------------------------------------------------- auto_accept_host_keys


def test_a_learned_host_key_is_logged_with_host_type_and_fingerprint(
        sshd_server: ServerHandle, sshd_process: SshdProcess, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ftpbc.sftp")
    known = tmp_path / "known_hosts"
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=True)) as t:
        t.list("/")
    learned = [r for r in caplog.records if "learned host key" in r.getMessage()]
    assert len(learned) == 1 and learned[0].levelno == logging.WARNING
    message = learned[0].getMessage()
    fingerprint = _ssh_fingerprint(sshd_process.workdir / "host_ed25519.pub")
    assert fingerprint.startswith("SHA256:") and not fingerprint.endswith("=")
    assert _entry(sshd_process) in message and "ssh-ed25519" in message and fingerprint in message
    # Known from now on: verified against the file, nothing more is learned or logged.
    caplog.clear()
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=True)) as t:
        t.list("/")
    assert not [r for r in caplog.records if "learned host key" in r.getMessage()]
    assert len(known.read_text().splitlines()) == 1


def test_auto_accept_never_learns_a_new_key_type_for_a_known_host(
        sshd_server: ServerHandle, sshd_process: SshdProcess, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ftpbc.sftp")
    kind, blob = _other_key(tmp_path, "ecdsa", "old_ecdsa")
    known = tmp_path / "known_hosts"
    known.write_text(f"{_entry(sshd_process)} {kind} {blob}\n")
    before = known.read_text()
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=True)) as t, \
            pytest.raises(HostKeyRejected) as err:
        t.mkdir(f"{d}/must-not-exist")
    message = str(err.value)
    assert "\n" not in message
    assert _entry(sshd_process) in message
    assert "ecdsa-sha2-nistp256" in message and "ssh-ed25519" in message  # known and offered types
    assert _ssh_fingerprint(sshd_process.workdir / "host_ed25519.pub") in message
    assert known.read_text() == before, "a new key type must not be learned"
    assert not sshd_server.local(f"{d}/must-not-exist").exists()
    assert not [r for r in caplog.records if "learned host key" in r.getMessage()]


# --------------------------------------------------------------------------- secret file modes

_CONFIG = """
node: {{state_dir: {tmp}/state, journal_dir: {tmp}/journals}}
servers:
  partner:
    url: "ftp://app@127.0.0.1:2121/"
    password_file: {pw}
{extra}endpoints:
  echo: {{server: partner, repository: /ex/echo}}
"""


def _load_with_password_file(tmp_path: Path, mode: int, extra: str = "") -> Config:
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    pw.chmod(mode)
    return parse_config(_CONFIG.format(tmp=tmp_path, pw=pw, extra=extra), source="ftpbc.yaml")


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o604, 0o602, 0o644, 0o666], ids=lambda m: f"{m:04o}")
def test_a_password_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigError) as err:
        _load_with_password_file(tmp_path, mode)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("ftpbc.yaml:") and "servers.partner" in message and "password_file" in message
    assert str(tmp_path / "pw") in message and f"{mode:04o}" in message
    assert "allow_insecure_secret_files" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700, 0o611], ids=lambda m: f"{m:04o}")
def test_a_private_password_file_is_read(tmp_path: Path, mode: int) -> None:
    config = _load_with_password_file(tmp_path, mode)
    assert config.servers["partner"].password_value() == "hunter2"


def test_an_open_password_file_is_read_when_explicitly_allowed(tmp_path: Path) -> None:
    config = _load_with_password_file(tmp_path, 0o644, "    allow_insecure_secret_files: true\n")
    assert config.servers["partner"].password_value() == "hunter2"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660], ids=lambda m: f"{m:04o}")
def test_a_key_file_open_to_group_or_others_is_refused(sshd_server: ServerHandle,
                                                       sshd_process: SshdProcess, tmp_path: Path,
                                                       mode: int) -> None:
    key = tmp_path / "id_ed25519"
    shutil.copyfile(sshd_process.client_keys["ed25519"], key)
    key.chmod(mode)
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config(name="partner", key_file=key)) as t, \
            pytest.raises(ConfigError) as err:
        t.mkdir(f"{d}/must-not-exist")
    message = str(err.value)
    assert "\n" not in message
    assert str(key) in message and f"{mode:04o}" in message and "key_file" in message
    assert "allow_insecure_secret_files" in message
    assert not sshd_server.local(f"{d}/must-not-exist").exists()
    # The same file is used when the configuration says so explicitly.
    with SFTPTransport(sshd_server.config(key_file=key, allow_insecure_secret_files=True)) as t:
        t.mkdir(f"{d}/allowed")
    assert sshd_server.local(f"{d}/allowed").is_dir()


# --------------------------------------------------------------------------- @revoked, @cert-authority


@pytest.mark.parametrize("auto_accept", [False, True])
def test_a_revoked_key_is_refused_even_when_also_listed(sshd_server: ServerHandle,
                                                         sshd_process: SshdProcess, tmp_path: Path,
                                                         auto_accept: bool) -> None:
    kind, blob = _host_key(sshd_process)
    known = tmp_path / "known_hosts"
    known.write_text(f"{_entry(sshd_process)} {kind} {blob}\n"
                     f"@revoked * {kind} {blob} compromised\n")
    before = known.read_text()
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=auto_accept)) as t, \
            pytest.raises(HostKeyRevoked) as err:
        t.mkdir(f"{d}/must-not-exist")
    message = str(err.value)
    assert isinstance(err.value, HostKeyRejected)
    assert "\n" not in message and "@revoked" in message and "line 2" in message
    assert f"sftp://root@127.0.0.1:{sshd_process.port}" in message
    assert _ssh_fingerprint(sshd_process.workdir / "host_ed25519.pub") in message
    assert known.read_text() == before
    assert not sshd_server.local(f"{d}/must-not-exist").exists()


def test_marker_lines_for_other_hosts_leave_normal_lines_working(sshd_server: ServerHandle,
                                                                  sshd_process: SshdProcess,
                                                                  tmp_path: Path) -> None:
    kind, blob = _host_key(sshd_process)
    ca_kind, ca_blob = _other_key(tmp_path, "ed25519", "ca")
    old_kind, old_blob = _other_key(tmp_path, "ed25519", "old")
    known = tmp_path / "known_hosts"
    known.write_text(
        "# keys of the partners\n"
        f"@cert-authority *.example.com,[127.0.0.1]:* {ca_kind} {ca_blob} partner CA\n"
        f"@revoked [127.0.0.1]:{sshd_process.port} {old_kind} {old_blob} retired key\n"
        f"@revoked other.example.com {kind} {blob}\n"  # our key, revoked for another host only
        f"other.example.com {old_kind} {old_blob}\n"
        f"{_entry(sshd_process)} {kind} {blob}\n")
    d = sshd_server.fresh_dir()
    with SFTPTransport(sshd_server.config(known_hosts=known)) as t:
        t.mkdir(f"{d}/ok")
    assert sshd_server.local(f"{d}/ok").is_dir()


@pytest.mark.parametrize("auto_accept", [False, True])
def test_a_cert_authority_line_alone_does_not_admit_a_host(sshd_server: ServerHandle,
                                                           sshd_process: SshdProcess, tmp_path: Path,
                                                           auto_accept: bool) -> None:
    ca_kind, ca_blob = _other_key(tmp_path, "ed25519", "ca")
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority [127.0.0.1]:* {ca_kind} {ca_blob}\n")
    before = known.read_text()
    with SFTPTransport(sshd_server.config(known_hosts=known, auto_accept_host_keys=auto_accept)) as t, \
            pytest.raises(HostKeyRejected) as err:
        t.list("/")
    message = str(err.value)
    assert "\n" not in message and "@cert-authority" in message and "certificates are not accepted" in message
    assert known.read_text() == before


def test_a_revoked_line_that_does_not_parse_is_a_config_error(sshd_server: ServerHandle,
                                                               sshd_process: SshdProcess,
                                                               tmp_path: Path) -> None:
    kind, blob = _host_key(sshd_process)
    known = tmp_path / "known_hosts"
    known.write_text(f"{_entry(sshd_process)} {kind} {blob}\n@revoked * {kind} not-base64!\n")
    with SFTPTransport(sshd_server.config(known_hosts=known)) as t, pytest.raises(ConfigError) as err:
        t.list("/")
    message = str(err.value)
    assert "\n" not in message and f"{known}:2:" in message and "@revoked" in message


def test_hashed_and_wildcard_names_match_as_in_openssh(sshd_server: ServerHandle,
                                                        sshd_process: SshdProcess, tmp_path: Path) -> None:
    kind, blob = _host_key(sshd_process)
    hashed = tmp_path / "hashed"
    hashed.write_text(f"{_entry(sshd_process)} {kind} {blob}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    wildcard = tmp_path / "wildcard"
    wildcard.write_text(f"[127.0.0.?]:* {kind} {blob}\n")
    for known in (hashed, wildcard):
        with SFTPTransport(sshd_server.config(known_hosts=known)) as t:
            t.list("/")
    negated = tmp_path / "negated"
    negated.write_text(f"*,![127.0.0.1]:{sshd_process.port} {kind} {blob}\n")
    with SFTPTransport(sshd_server.config(known_hosts=negated)) as t, \
            pytest.raises(HostKeyRejected, match="is not in"):
        t.list("/")


def test_known_hosts_lines_parse_as_ssh_reads_them(tmp_path: Path) -> None:
    kind, blob = _other_key(tmp_path, "ed25519", "k")
    revoked = parse_line(f"@revoked  *\t{kind} {blob} a comment", 3)
    assert revoked is not None and revoked.marker == "@revoked" and revoked.patterns == ("*",)
    assert revoked.key.key_type == kind and revoked.key.line == 3
    ca = parse_line(f"@cert-authority *.example.com {kind} {blob}", 1)
    assert ca is not None and ca.marker == "@cert-authority"
    for skipped in ("", "   ", "# comment", f"@unknown-marker * {kind} {blob}", f"host {kind}",
                    f"host {kind} %%%", f"host ssh-rsa {blob}"):  # the blob says ssh-ed25519
        assert parse_line(skipped, 1) is None, skipped
    assert host_matches(("[h]:2222",), "[h]:2222") and not host_matches(("[h]:2222",), "h")
    assert host_matches(("*.Example.com",), "a.example.com")
    assert not host_matches(("*.example.com", "!bad.example.com"), "bad.example.com")
    assert not host_matches(("!bad",), "good"), "a negation alone matches nothing"
