"""A real pure-ftpd 1.0.50 on a loopback port, plain and explicit TLS, for the conformance suite.

pure-ftpd conflicts with vsftpd in Debian (both ``Provides: ftp-server``), so ``.ci/run``
unpacks the ``pure-ftpd`` package into ``/opt/ftpbc-servers/pure-ftpd`` instead of installing
it; the fixtures run that ``usr/sbin/pure-ftpd`` (or a system-wide one) in the foreground,
configured entirely by its command line (``-S 127.0.0.1,PORT``, no ``-B``).

* ``pureftpd_server``: plain FTP (``-Y 0``).
* ``pureftpd_capped_server``: plain FTP whose listings stop at 300 names (``-L``).
* ``pureftpd_tls_server``: explicit TLS only (``-Y 3``: cleartext control and data connections
  are refused), with the session's throw-away CA's certificate (``tls_material``); the handle's
  options carry ``ca_file``, so verification stays on.

One virtual user in a PureDB file (``-l puredb:``, made with ``pure-pw mkdb`` from a passwd
line written here), whose home ends in ``/./``: pure-ftpd chroots it there, so remote ``/``
maps to the temporary root.  The password is a SHA-512 crypt hash, checked in a few
milliseconds: ``pure-pw useradd`` would hash it with argon2id, about 2 s per login.  The user
runs as ``nobody``.  Dot files are listed (``-D``), listings are not cut at pure-ftpd's default
of 10,000 entries (``-L``), 500 sessions are allowed (``-c``, no per-address cap).  Passive
ports are below the kernel's ephemeral range, one range per fixture, apart from vsftpd's and
ProFTPD's.

Controls: ``drop_connections`` kills the per-session processes (the listener stays),
``restart`` stops and starts the listener on the same port.

Locally a missing binary (or not running as root) skips; under CI=true it fails.
"""

from __future__ import annotations

import subprocess
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
PACKAGES = "pure-ftpd"
#: passive data ports per fixture: below the ephemeral range, apart from vsftpd's 27000-27999
#: and ProFTPD's 28000-28999
PASV_PLAIN = (29000, 29499)
PASV_TLS = (29500, 29899)
PASV_CAPPED = (29900, 29989)
PASV_LIMITED = (29990, 29999)
#: what ``pureftpd_capped_server`` lists of a directory at most
CAPPED_LISTING = 300


def pureftpd_binary() -> Path:
    return unpacked_binary("pure-ftpd", "usr/sbin/pure-ftpd", PACKAGES)


def running_pureftpd(binary: Path, workdir: Path, *, passive: tuple[int, int],
                     tls: TLSMaterial | None = None, max_per_ip: int | None = None,
                     max_listed: int = 100_000,
                     label: str = "pureftpd") -> AbstractContextManager[ServerInstance]:
    """A pure-ftpd on a free loopback port with one virtual user chrooted into a new root.

    ``max_listed``: a listing stops after this many names (pure-ftpd's ``-L``), without a word.
    Needs root.  The root directory is removed on exit, the server stopped.
    """
    pure_pw = binary.parent.parent / "bin" / "pure-pw"

    def argv(login: VirtualLogin, port: int) -> list[str]:
        passwd, pdb = workdir / "pureftpd.passwd", workdir / "pureftpd.pdb"
        # account:hash:uid:gid:gecos:home, then 12 empty limits (quotas, ratios, addresses...).
        passwd.write_text(f"{login.user}:{sha512_crypt(login.password)}:{login.uid}:{login.gid}::"
                          f"{login.root}/./" + ":" * 12 + "\n")
        passwd.chmod(0o600)
        subprocess.run([str(pure_pw), "mkdb", str(pdb), "-f", str(passwd)], check=True,
                       capture_output=True)
        args = [str(binary),
                "-S", f"127.0.0.1,{port}", "-4", "-H",
                "-l", f"puredb:{pdb}",
                "-E",                        # no anonymous logins
                "-u", "1",                   # nobody's uid is a fine uid to log in as
                "-p", f"{passive[0]}:{passive[1]}",
                "-c", "500",                 # sessions in all (default 50); no cap per address
                "-D",                        # dot files are ordinary message files for ftpbc
                "-L", f"{max_listed}:8",     # listings are not cut at 10,000 entries (by default)
                "-I", "15",                  # idle minutes
                "-g", str(workdir / "pure-ftpd.pid")]
        if max_per_ip is not None:
            args += ["-C", str(max_per_ip)]
        if tls is None:
            args += ["-Y", "0"]
        else:
            args += ["-Y", "3", "-2", f"{tls.cert_file},{tls.key_file}"]
        return args

    return running_unpacked("pure-ftpd", workdir, user=USER, label=label, argv=argv)


@pytest.fixture(scope="session")
def pureftpd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    binary = pureftpd_binary()
    require_root("pure-ftpd")
    with running_pureftpd(binary, tmp_path_factory.mktemp("pureftpd"), passive=PASV_PLAIN) as p:
        yield p.handle("pureftpd")


@pytest.fixture(scope="session")
def pureftpd_tls_server(tmp_path_factory: pytest.TempPathFactory,
                        tls_material: TLSMaterial) -> Iterator[ServerHandle]:
    binary = pureftpd_binary()
    require_root("pure-ftpd")
    with running_pureftpd(binary, tmp_path_factory.mktemp("pureftpd-tls"), passive=PASV_TLS,
                          tls=tls_material, label="pureftpd-tls") as p:
        yield p.handle("pureftpd_tls", scheme="ftps", options={"ca_file": tls_material.ca_file})


@pytest.fixture(scope="session")
def pureftpd_limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """pure-ftpd with ``-C 6``: a seventh session from this address gets 421 Too many connections."""
    binary = pureftpd_binary()
    require_root("pure-ftpd")
    with running_pureftpd(binary, tmp_path_factory.mktemp("pureftpd-limited"), passive=PASV_LIMITED,
                          max_per_ip=6, label="pureftpd-limited") as p:
        yield p.handle("pureftpd_limited")


@pytest.fixture(scope="session")
def pureftpd_capped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """pure-ftpd whose listings stop at CAPPED_LISTING names, as its default (10,000) does at
    scale: a bigger directory is listed in part, and the reply does not say so."""
    binary = pureftpd_binary()
    require_root("pure-ftpd")
    with running_pureftpd(binary, tmp_path_factory.mktemp("pureftpd-capped"), passive=PASV_CAPPED,
                          max_listed=CAPPED_LISTING, label="pureftpd-capped") as p:
        yield p.handle("pureftpd_capped")
