"""A real ProFTPD 1.3.8 on a loopback port, plain and explicit FTPS, for the conformance suite.

ProFTPD conflicts with vsftpd in Debian (both ``Provides: ftp-server``), so ``.ci/run`` unpacks
``proftpd-core`` and ``proftpd-mod-crypto`` into ``/opt/ftpbc-servers/proftpd`` instead of
installing them; the fixtures run that ``usr/sbin/proftpd`` (or a system-wide one) with
``-n`` (foreground) and a generated configuration, its modules loaded from the ``usr/lib/proftpd``
beside it.

* ``proftpd_server``: plain FTP.
* ``proftpd_ftps_server``: explicit FTPS (``AUTH TLS``), ``TLSRequired on``, with mod_tls's
  default ``TLSOptions``: a data connection must resume the control connection's TLS session,
  or it is refused with 425.  The certificate is the session's throw-away CA's
  (``tls_material``); the handle's options carry ``ca_file``, so verification stays on.
* ``proftpd_no_overwrite_server``: plain FTP with ProFTPD's own default ``AllowOverwrite off``
  (RNTO and STOR onto an existing file are refused with 550), for ``ftpbc check``'s warning.
  The other two run with ``AllowOverwrite on``, the setting ftpbc needs for an atomic
  rename-replace (see docs/servers.md).

One virtual user (``AuthUserFile``, a SHA-512 crypt hash, uid/gid of ``nobody``), chrooted with
``DefaultRoot ~`` into a temporary root, so remote ``/`` maps to it.  Passive ports are below the
kernel's ephemeral range, one range per fixture, apart from vsftpd's.  No per-host or per-server
session limits, no delay after a failed login.

Controls: ``drop_connections`` kills the per-session processes (the listener stays), ``restart``
stops and starts the listener on the same port.

Locally a missing binary (or not running as root) skips; under CI=true it fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.servers.handle import ServerHandle
from tests.servers.process import (
    ServerInstance,
    VirtualLogin,
    require_root,
    running_unpacked,
    sha512_crypt,
    unpacked_binary,
)
from tests.servers.pyftpd import TLSMaterial

USER = "ftpbc"
PACKAGES = "proftpd-core proftpd-mod-crypto"
#: passive data ports per fixture: below the ephemeral range (32768-), apart from vsftpd's
#: 27000-27999 and pure-ftpd's 29000-29999
PASV_PLAIN = (28000, 28399)
PASV_FTPS = (28400, 28799)
PASV_NO_OVERWRITE = (28800, 28989)
#: two ports only, for the test of concurrent passive requests (ProFTPD's bind race)
PASV_TWO_PORTS = (28990, 28991)
#: the limited server: five passive ports and six sessions per client host
PASV_FIVE_PORTS = (28992, 28996)


def proftpd_binary() -> Path:
    return unpacked_binary("proftpd", "usr/sbin/proftpd", PACKAGES)


def _config(*, binary: Path, workdir: Path, port: int, passive: tuple[int, int], tls: TLSMaterial | None,
            allow_overwrite: bool, max_per_host: int | None = None) -> str:
    lines = [
        'ServerName "ftpbc test proftpd"',
        "ServerType standalone",
        "DefaultServer on",
        f"Port {port}",
        "DefaultAddress 127.0.0.1",
        "SocketBindTight on",
        "UseIPv6 off",
        # The daemon's own identity between sessions; a session runs as the virtual user.
        "User nobody",
        "Group nogroup",
        f"PidFile {workdir / 'proftpd.pid'}",
        f"ScoreboardFile {workdir / 'proftpd.scoreboard'}",
        f"SystemLog {workdir / 'proftpd.log'}",
        "TransferLog none",
        "WtmpLog off",
        "UseLastlog off",
        "UseReverseDNS off",
        f"ModulePath {binary.parent.parent / 'lib' / 'proftpd'}",
        # Only the virtual user of AuthUserFile: no PAM, no /etc/passwd, no /etc/ftpusers.
        "AuthOrder mod_auth_file.c",
        f"AuthUserFile {workdir / 'passwd'}",
        f"AuthGroupFile {workdir / 'group'}",
        "RequireValidShell off",
        "UseFtpUsers off",
        "DefaultRoot ~",
        "Umask 022",
        f"AllowOverwrite {'on' if allow_overwrite else 'off'}",
        f"PassivePorts {passive[0]} {passive[1]}",
        # Many tests connect at once; failed-login tests must not wait.
        "MaxInstances 500",
        "MaxClients none",
        f"MaxClientsPerHost {max_per_host or 'none'}",
        "MaxLoginAttempts 100",
        "DelayEngine off",
        "TimeoutIdle 600",
        "TimeoutNoTransfer 600",
        # Dot files are ordinary message files for ftpbc: LIST shows them (MLSD always does).
        "ListOptions -a",
    ]
    if tls is not None:
        lines += [
            "LoadModule mod_tls.c",
            "TLSEngine on",
            "TLSProtocol TLSv1.2 TLSv1.3",
            f"TLSECCertificateFile {tls.cert_file}",
            f"TLSECCertificateKeyFile {tls.key_file}",
            "TLSVerifyClient off",
            # Control and data protected; TLSOptions left at its default, which requires every
            # data connection to resume the control connection's TLS session.
            "TLSRequired on",
            f"TLSLog {workdir / 'tls.log'}",
        ]
    return "\n".join(lines) + "\n"


def running_proftpd(binary: Path, workdir: Path, *, passive: tuple[int, int],
                    tls: TLSMaterial | None = None, allow_overwrite: bool = True,
                    max_per_host: int | None = None,
                    label: str = "proftpd") -> AbstractContextManager[ServerInstance]:
    """A ProFTPD on a free loopback port with one virtual user chrooted into a new root.

    Needs root.  The root directory is removed on exit, the server stopped.
    """
    def argv(login: VirtualLogin, port: int) -> list[str]:
        passwd = workdir / "passwd"
        passwd.write_text(f"{login.user}:{sha512_crypt(login.password)}:{login.uid}:{login.gid}::"
                          f"{login.root}:/bin/false\n")
        group = workdir / "group"
        group.write_text(f"ftpbc:x:{login.gid}:\n")
        for f in (passwd, group):
            f.chmod(0o600)  # it holds a password hash
        config = workdir / "proftpd.conf"
        config.write_text(_config(binary=binary, workdir=workdir, port=port, passive=passive, tls=tls,
                                  allow_overwrite=allow_overwrite, max_per_host=max_per_host))
        return [str(binary), "-n", "-c", str(config)]

    return running_unpacked("proftpd", workdir, user=USER, label=label, argv=argv)


@pytest.fixture(scope="session")
def proftpd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    binary = proftpd_binary()
    require_root("proftpd")
    with running_proftpd(binary, tmp_path_factory.mktemp("proftpd"), passive=PASV_PLAIN) as p:
        yield p.handle("proftpd")


@pytest.fixture(scope="session")
def proftpd_ftps_server(tmp_path_factory: pytest.TempPathFactory,
                        tls_material: TLSMaterial) -> Iterator[ServerHandle]:
    binary = proftpd_binary()
    require_root("proftpd")
    with running_proftpd(binary, tmp_path_factory.mktemp("proftpd-ftps"), passive=PASV_FTPS,
                         tls=tls_material, label="proftpd-ftps") as p:
        yield p.handle("proftpd_ftps", scheme="ftps", options={"ca_file": tls_material.ca_file})


@pytest.fixture(scope="session")
def proftpd_no_overwrite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    binary = proftpd_binary()
    require_root("proftpd")
    with running_proftpd(binary, tmp_path_factory.mktemp("proftpd-no-overwrite"),
                         passive=PASV_NO_OVERWRITE, allow_overwrite=False,
                         label="proftpd-no-overwrite") as p:
        yield p.handle("proftpd_no_overwrite")


@pytest.fixture(scope="session")
def proftpd_limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """ProFTPD as a careful partner runs it: MaxClientsPerHost 6 (a seventh login is refused with
    530 at PASS) and a passive range of five ports."""
    binary = proftpd_binary()
    require_root("proftpd")
    with running_proftpd(binary, tmp_path_factory.mktemp("proftpd-limited"), passive=PASV_FIVE_PORTS,
                         max_per_host=6, label="proftpd-limited") as p:
        yield p.handle("proftpd_limited")
